"""Session 57: the ragged prefill at the chunk EasyDeL asks for (64, run as 32 on Triton since this session) beside
Triton's own, on the serving bench's prefill (8 x 2048 tokens, H 32, D 128, bf16): the same kernels, so the same time.

    PYTHONPATH=src python exp/s57_capped.py
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ejkernel.benchmarks.linear_attention import PREFILL, _inputs, _serving_loop
from ejkernel.modules import ragged_gated_delta_rule
from ejkernel.ops.autotune import time_fns


def prefill_case():
    """`(tokens, pool)` of the serving bench's prefill as `_serving_loop` takes them: q, k, v, beta, decay flat, the
    requests' bounds and slots; a float32 pool of one slot a request."""
    requests, length, heads, dim = PREFILL
    d = _inputs(requests, length, heads, dim)
    flat = tuple(d[n].reshape(requests * length, *d[n].shape[2:]) for n in ("q", "k", "v", "beta", "decay"))
    bounds = jnp.arange(0, requests * length + 1, length, dtype=jnp.int32)
    pool = jax.random.normal(jax.random.PRNGKey(3), (requests, heads, dim, dim), jnp.float32)
    return (*flat, bounds, bounds[:-1] // length), pool


def main() -> None:
    tokens, pool = prefill_case()
    calls = {
        f"ragged triton, chunk {chunk}": _serving_loop(
            functools.partial(ragged_gated_delta_rule, platform="triton", chunk_size=chunk), tokens, pool
        )
        for chunk in (None, 64)
    }
    for name, seconds in time_fns(calls, repeats=20, warmup=2).items():
        print(f"{name:28s} {1e3 * seconds:8.3f} ms", flush=True)


if __name__ == "__main__":
    main()
