"""Twenty-ninth session: `ragged_page_attention_v3` decode on the Triton core, a bf16 cache against a float8 one, by
tiling (issue 45's shape: batch 64, context 8192, Hq 32, Hkv 8, D 128, page 16). Prints ms and the cache's bytes
per second per variant, then the float8 result's error against bf16; run on the GPU: `python3 exp/s29_fp8_sweep.py`."""

import functools

import jax
import jax.numpy as jnp

from ejkernel.benchmarks._harness import time_variants
from ejkernel.benchmarks.serving_attention import DIM, HEADS, KV_HEADS, PAGE, make_problem
from ejkernel.modules.operations.ragged_page_attention_v3 import RaggedPageAttentionV3Config
from ejkernel.ops import FwdParams
from ejkernel.registry import kernel_registry

OP, BATCH, CONTEXT = "ragged_page_attention_v3", 64, 8192
fn = kernel_registry.get(OP, "triton", "gpu")
args, _ = make_problem(OP, [1] * BATCH, [CONTEXT] * BATCH, heads=HEADS, kv_heads=KV_HEADS, dim=DIM, page=PAGE)
cache8 = args[3].astype(jnp.float8_e4m3fn)
cache8 = cache8.reshape(*cache8.shape[:2], -1, 4, cache8.shape[-1])  # four 8-bit heads to a 32-bit word
fp8 = (args[0], *(x.astype(jnp.float8_e4m3fn) for x in args[1:3]), cache8, *args[4:])
VARIANTS = {
    "default": None,
    "splits 4": dict(num_splits=4),
    "splits 4 bk128": dict(num_splits=4, block_k=128),
    "splits 2 bk128 s3": dict(num_splits=2, block_k=128, num_stages=3),
    "splits 4 bk64 s3": dict(num_splits=4, num_stages=3),
    "splits 4 bk128 w8 s3": dict(num_splits=4, block_k=128, num_warps=8, num_stages=3),
}


def build(params, a):
    """One serving step as `make_call` runs it: the cache donated (written in place) and fed back."""
    params = dict(params or {})
    splits = params.pop("num_splits", None)
    cfg = RaggedPageAttentionV3Config(fwd_params=FwdParams(**params) if params else None, num_splits=splits)
    step = jax.jit(lambda cache, *r: fn(*r[:3], cache, *r[3:], softmax_scale=DIM**-0.5, cfg=cfg), donate_argnums=0)
    state = {"cache": jnp.copy(a[3])}

    def call():
        out, state["cache"] = step(state["cache"], *a[:3], *a[4:])
        return out

    return call


calls = {f"{dtype} {name}": functools.partial(build, v, a) for dtype, a in (("bf16", args), ("fp8", fp8))
         for name, v in VARIANTS.items()}  # fmt: skip
timings = time_variants(calls, repeats=10, where="v3 decode by tiling")
for name, seconds in timings.items():
    nbytes = BATCH * CONTEXT * KV_HEADS * 2 * DIM * (1 if name.startswith("fp8") else 2)
    print(f"{name:28s} {1e3 * seconds:.3f} ms  {nbytes / seconds / 1e12:.2f} TB/s")
out, out8 = (build(None, a)() for a in (args, fp8))
error = jnp.linalg.norm((out8 - out).astype(jnp.float32)) / jnp.linalg.norm(out.astype(jnp.float32))
print(f"fp8 against bf16, relative error {float(error):.2e}")
