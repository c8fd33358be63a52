"""Session 44: one `ragged_page_attention_v3` decode step on a bf16, int8 or e4m3 cache (issue 45's shape,
`exp/s29_kvscales`), run twice, for Nsight Compute to profile the Triton paged core's kernel:

    ncu --clock-control none -k regex:ejkernel_paged_attention -c 1 --section ... python3 exp/s44_ncu_step.py e4m3

Optional: `<keys a step> <stages> <warps> <splits>` after the dtype for a tiling other than the default.
"""

import functools
import pathlib
import sys

import jax
import jax.numpy as jnp

from ejkernel.modules import RaggedPageAttentionV3Config
from ejkernel.ops import FwdParams

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from s29_kvscales import args, quantized, step

if __name__ == "__main__":
    dtype = sys.argv[1]
    codes = {"int8": jnp.int8, "e4m3": jnp.float8_e4m3fn}
    cache, scales = (args[3], None) if dtype == "bf16" else quantized(args[3], codes[dtype])
    options = {}
    if len(sys.argv) > 2:
        bk, stages, warps, splits = map(int, sys.argv[2:6])
        fwd = FwdParams(block_k=bk, num_stages=stages, num_warps=warps)
        options["cfg"] = RaggedPageAttentionV3Config(fwd_params=fwd, num_splits=splits)
    run = jax.jit(functools.partial(step, platform="triton", **options))
    for _ in range(2):
        jax.block_until_ready(run(cache, scales, *args[:3], *args[4:]))
