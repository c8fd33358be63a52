"""Twenty-eighth session: `ragged_page_attention_v3` decode on a float8 cache against the same call on a bf16 cache
(issue 45's shape: batch 64, context 8192, Hq 32, Hkv 8, D 128, page 16), time and relative error, on the GPU:
`python3 exp/s28_fp8.py`."""

import functools

import jax
import jax.numpy as jnp

from ejkernel.benchmarks._harness import time_variants
from ejkernel.benchmarks.serving_attention import DIM, HEADS, KV_HEADS, PAGE, make_call, make_problem
from ejkernel.modules import ragged_page_attention_v3

OP = "ragged_page_attention_v3"
args, nbytes = make_problem(OP, [1] * 64, [8192] * 64, heads=HEADS, kv_heads=KV_HEADS, dim=DIM, page=PAGE)
cache = args[3].astype(jnp.float8_e4m3fn)
cache = cache.reshape(*cache.shape[:2], -1, 4, cache.shape[-1])  # four 8-bit heads to a 32-bit word
fp8 = (args[0], *(x.astype(jnp.float8_e4m3fn) for x in args[1:3]), cache, *args[4:])
calls = {name: functools.partial(make_call, OP, "auto", a) for name, a in (("bf16 cache", args), ("fp8 cache", fp8))}
timings = time_variants(calls, repeats=10, where="v3 decode")
out, out8 = (jax.jit(lambda *a: ragged_page_attention_v3(*a)[0])(*a) for a in (args, fp8))
error = float(jnp.linalg.norm((out8 - out).astype(jnp.float32)) / jnp.linalg.norm(out.astype(jnp.float32)))
for name, seconds in timings.items():
    print(f"{name}: {1e3 * seconds:.3f} ms")
print(f"fp8 speed-up {timings['bf16 cache'] / timings['fp8 cache']:.2f}x, relative error {error:.2e}")
