"""Twenty-ninth session: `ragged_page_attention_v3` decode on the Triton core by tiling, a bf16 cache against 8-bit
caches (float8 e4m3 and int8, per-token-head scales) (issue 45's shape: batch 64, context 8192, Hq 32, Hkv 8, D 128,
page 16). Each variant runs as a serving loop does (cache and scales donated, fed back). Prints ms and the cache's
bytes per second; run on the GPU: `python3 exp/s29_fp8_sweep.py`."""

import functools

import jax
import jax.numpy as jnp

from ejkernel.benchmarks._harness import time_variants
from ejkernel.benchmarks.serving_attention import DIM, HEADS, KV_HEADS, PAGE, make_problem
from ejkernel.kernels._common.paged_attention.kv_cache import quantize_rows
from ejkernel.modules.operations.ragged_page_attention_v3 import RaggedPageAttentionV3Config
from ejkernel.ops import FwdParams
from ejkernel.registry import kernel_registry

OP, BATCH, CONTEXT = "ragged_page_attention_v3", 64, 8192
fn = kernel_registry.get(OP, "triton", "gpu")
args, _ = make_problem(OP, [1] * BATCH, [CONTEXT] * BATCH, heads=HEADS, kv_heads=KV_HEADS, dim=DIM, page=PAGE)
packed = lambda dtype: quantize_rows(args[3].reshape(*args[3].shape[:2], -1, 4, DIM), dtype)
CACHES = {"bf16": (args[3], None), "e4m3": jax.jit(packed, static_argnums=0)(jnp.float8_e4m3fn)}
CACHES["int8"] = jax.jit(packed, static_argnums=0)(jnp.int8)
TILINGS = {
    "default": None,
    "splits 1 bk128 s3": dict(num_splits=1, block_k=128, num_stages=3),
    "splits 4 bk128 s3": dict(num_splits=4, block_k=128, num_stages=3),
    "splits 2 bk256 s3": dict(num_splits=2, block_k=256, num_stages=3),
}


def build(params, cache, scales):
    """A zero-argument decode step whose updated cache (and scales) feed the next one, donated."""
    params = dict(params or {})
    splits = params.pop("num_splits", None)
    cfg = RaggedPageAttentionV3Config(fwd_params=FwdParams(**params) if params else None, num_splits=splits)

    def step(cache, scales, *rest):
        kw = {} if scales is None else {"kv_cache_scales": scales}
        return fn(*rest[:3], cache, *rest[3:], softmax_scale=DIM**-0.5, cfg=cfg, **kw)

    run = jax.jit(step, donate_argnums=(0, 1))
    state = {"cache": jnp.copy(cache), "scales": None if scales is None else jnp.copy(scales)}

    def call():
        out, state["cache"], *rest = run(state["cache"], state["scales"], *args[:3], *args[4:])
        state["scales"] = rest[0] if rest else None
        return out

    return call


calls = {f"{dtype} {name}": functools.partial(build, v, *CACHES[dtype]) for dtype in CACHES
         for name, v in TILINGS.items() if dtype != "bf16" or v is None}  # fmt: skip
timings = time_variants(calls, repeats=10, where="v3 decode by tiling")
for name, seconds in timings.items():
    nbytes = BATCH * CONTEXT * KV_HEADS * 2 * DIM * (2 if name.startswith("bf16") else 1)
    print(f"{name:28s} {1e3 * seconds:.3f} ms  {nbytes / seconds / 1e12:.2f} TB/s")
