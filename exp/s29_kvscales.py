"""Twenty-ninth session: `ragged_page_attention_v3` decode on a bf16 cache against float8 (e4m3) and int8 caches
with per-token-head scales (issue 45's shape: batch 64, context 8192, Hq 32, Hkv 8, D 128, page 16): time, speed-up
against bf16 and relative error against the bf16 result, on the GPU: `python3 exp/s29_kvscales.py`.

Each variant runs as a serving loop does: the cache (and its scales) donated and fed back to the next step.
"""

import functools

import jax
import jax.numpy as jnp

from ejkernel.benchmarks._harness import time_variants
from ejkernel.benchmarks.serving_attention import DIM, HEADS, KV_HEADS, PAGE, make_problem
from ejkernel.kernels._common.scaled_codes import quantize_rows
from ejkernel.modules import ragged_page_attention_v3

OP, BATCH, CONTEXT = "ragged_page_attention_v3", 64, 8192
args, _ = make_problem(OP, [1] * BATCH, [CONTEXT] * BATCH, heads=HEADS, kv_heads=KV_HEADS, dim=DIM, page=PAGE)


@functools.partial(jax.jit, static_argnums=1)
def quantized(cache, dtype):
    """The bf16 cache as 8-bit codes (four heads to a 32-bit word) and their per-token-head scales."""
    return quantize_rows(cache.reshape(*cache.shape[:2], -1, 4, cache.shape[-1]), dtype)


def step(cache, scales, *rest, call=ragged_page_attention_v3, **options):
    """One decode step of `call` (the public op by default); `(out, cache)` or `(out, cache, scales)`."""
    extra = {} if scales is None else {"kv_cache_scales": scales}
    return call(*rest[:3], cache, *rest[3:], softmax_scale=DIM**-0.5, **extra, **options)


def serving_loop(cache, scales, **options):
    """A zero-argument decode step (`step`'s `options`) whose updated cache and scales feed the next, donated."""
    run = jax.jit(functools.partial(step, **options), donate_argnums=(0, 1))
    state = {"cache": jnp.copy(cache), "scales": None if scales is None else jnp.copy(scales)}

    def call():
        out, state["cache"], *rest = run(state["cache"], state["scales"], *args[:3], *args[4:])
        state["scales"] = rest[0] if rest else None
        return out

    return call


if __name__ == "__main__":
    variants = {"bf16 cache": (args[3], None)}
    variants |= {
        name: quantized(args[3], dtype)
        for name, dtype in (("e4m3 + scales", jnp.float8_e4m3fn), ("int8 + scales", jnp.int8))
    }
    outputs = {
        name: jax.jit(step)(cache, scales, *args[:3], *args[4:])[0] for name, (cache, scales) in variants.items()
    }
    timings = time_variants(
        {name: functools.partial(serving_loop, *v) for name, v in variants.items()}, repeats=10, where="v3 decode"
    )
    base = outputs["bf16 cache"].astype(jnp.float32)
    for name, seconds in timings.items():
        error = float(jnp.linalg.norm(outputs[name].astype(jnp.float32) - base) / jnp.linalg.norm(base))
        speedup = timings["bf16 cache"] / seconds
        print(f"{name}: {1e3 * seconds:.3f} ms, {speedup:.2f}x bf16, relative error {error:.2e}")
