"""Twenty-eighth session: tilings of two new Triton kernels at issue 44's shapes, on the GPU.

The ragged gated delta rule's decode step (256 requests, H 32, D 128, float32 pool, donated) by value columns per
program and warps; MLA paged decode (64 x 8192, 128 heads, 512 + 64, page 64) by `TRITON_TILINGS` and a few more.
Run: `python3 exp/s28_sweeps.py`.
"""

import functools

import jax
import jax.numpy as jnp

from ejkernel.benchmarks._harness import time_variants
from ejkernel.benchmarks.linear_attention import DECODE, _inputs, _serving_loop
from ejkernel.benchmarks.mla import PAGED_DECODE, PAGED_WIDTHS, _paged_call, paged_inputs
from ejkernel.modules import ragged_gated_delta_rule
from ejkernel.modules.operations.multi_latent_ragged_page_attention import (
    TRITON_TILINGS,
    MultiLatentRaggedPageAttentionConfig,
    MultiLatentRaggedPageAttentionTritonTiling,
)
from ejkernel.modules.operations.ragged_gated_delta_rule import RaggedGatedDeltaRuleConfig
from ejkernel.ops import FwdParams

requests, heads, dim = DECODE
d = _inputs(1, requests, heads, dim)
tokens = (*(d[n][0] for n in ("q", "k", "v", "beta", "decay")), jnp.arange(requests + 1, dtype=jnp.int32))
tokens += (jax.random.permutation(jax.random.PRNGKey(1), 2 * requests)[:requests].astype(jnp.int32),)
pool = jax.random.normal(jax.random.PRNGKey(2), (2 * requests, heads, dim, dim), jnp.float32)
nbytes = 2 * requests * heads * dim * dim * 4


def gdr(block, warps):
    cfg = RaggedGatedDeltaRuleConfig(platform="triton", fwd_params=FwdParams(block_d=block, num_warps=warps))
    return _serving_loop(functools.partial(ragged_gated_delta_rule, cfg=cfg), tokens, pool)


variants = {f"block_v {b} warps {w}": functools.partial(gdr, b, w) for b in (16, 32, 64, 128) for w in (2, 4, 8)}
for name, seconds in time_variants(variants, repeats=10, where="gdr decode").items():
    print(f"gdr decode {name:20s} {1e3 * seconds:.3f} ms  state {nbytes / seconds / 1e12:.2f} TB/s")

args, mla_bytes, flops = paged_inputs(*PAGED_DECODE, *PAGED_WIDTHS)
Tiling = MultiLatentRaggedPageAttentionTritonTiling
tilings = {"default": None, **{str(t): t for t in TRITON_TILINGS}}
tilings |= {"block_h 128 w8": Tiling(block_h=128, num_warps=8), "block_h 128 bk16": Tiling(block_h=128, block_k=16)}
tilings |= {"bk64 s2": Tiling(block_k=64, num_stages=2), "block_h 32 bk64 w4": Tiling(block_h=32, block_k=64)}


def mla(tiling):
    cfg = MultiLatentRaggedPageAttentionConfig(platform="triton", triton_tiling=tiling)
    return _paged_call("triton", args, cfg=cfg)


timings = time_variants({k: functools.partial(mla, t) for k, t in tilings.items()}, repeats=10, where="mla")
for name, seconds in timings.items():
    rates = f"{mla_bytes / seconds / 1e12:.2f} TB/s {flops / seconds / 1e12:.0f} TFLOP/s"
    print(f"mla decode {name[:60]:60s} {1e3 * seconds:.3f} ms {rates}")
