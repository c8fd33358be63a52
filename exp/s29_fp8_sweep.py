"""Twenty-ninth session: `ragged_page_attention_v3` decode on the Triton core by tiling, a bf16 cache against 8-bit
caches (float8 e4m3 and int8, per-token-head scales) (issue 45's shape: batch 64, context 8192, Hq 32, Hkv 8, D 128,
page 16). Each variant runs as a serving loop does (cache and scales donated, fed back). Prints ms and the cache's
bytes per second; run on the GPU: `python3 exp/s29_fp8_sweep.py`."""

import jax.numpy as jnp
from s29_kvscales import BATCH, CONTEXT, OP, args, quantized, serving_loop

from ejkernel.benchmarks._harness import time_variants
from ejkernel.benchmarks.serving_attention import DIM, KV_HEADS
from ejkernel.modules.operations.ragged_page_attention_v3 import RaggedPageAttentionV3Config
from ejkernel.ops import FwdParams
from ejkernel.registry import kernel_registry

fn = kernel_registry.get(OP, "triton", "gpu")
CACHES = {"bf16": (args[3], None), "e4m3": quantized(args[3], jnp.float8_e4m3fn), "int8": quantized(args[3], jnp.int8)}
TILINGS = {
    "default": None,
    "splits 1 bk128 s3": dict(num_splits=1, block_k=128, num_stages=3),
    "splits 4 bk128 s3": dict(num_splits=4, block_k=128, num_stages=3),
    "splits 2 bk256 s3": dict(num_splits=2, block_k=256, num_stages=3),
}


def build(params, cache, scales):
    """`serving_loop` on the Triton core at this tiling."""
    params = dict(params or {})
    splits = params.pop("num_splits", None)
    cfg = RaggedPageAttentionV3Config(fwd_params=FwdParams(**params) if params else None, num_splits=splits)
    return serving_loop(cache, scales, call=fn, cfg=cfg)


calls = {f"{dtype} {name}": lambda v=v, c=CACHES[dtype]: build(v, *c) for dtype in CACHES
         for name, v in TILINGS.items() if dtype != "bf16" or v is None}  # fmt: skip
timings = time_variants(calls, repeats=10, where="v3 decode by tiling")
for name, seconds in timings.items():
    nbytes = BATCH * CONTEXT * KV_HEADS * 2 * DIM * (2 if name.startswith("bf16") else 1)
    print(f"{name:28s} {1e3 * seconds:.3f} ms  {nbytes / seconds / 1e12:.2f} TB/s")
