"""Session 54: how much of the float8 forward's time is XLA's Vᵀ (issue 42; fp8 at 8 x 2048 is 1.14x cuDNN bf16
against 1.6). `float8_attention` transposes V to `[B, Hkv, D, Sk]` with its keys in P's register order before the
kernel (8-bit wgmma operands must be K-major); this times that preparation alone beside the whole call, and a copy of
V's bytes, each jitted, interleaved.

    PYTHONPATH=src python exp/s54_fp8_parts.py --shape 8,2048,16,128 --shape 2,8192,16,128
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
from _kit import log

from ejkernel.kernels._pallas.gpu.flash_attention._fwd_fp8 import keys_in_register_order
from ejkernel.kernels._pallas.gpu.flash_attention._interface import float8_attention
from ejkernel.ops.autotune import time_fns


def time_case(batch: int, seq: int, heads: int, dim: int, causal: bool, repeats: int) -> None:
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    q8, k8, v8 = (
        (4 * jax.random.normal(key, (batch, seq, heads, dim), jnp.bfloat16)).astype(jnp.float8_e4m3fn) for key in keys
    )
    descales = tuple(jnp.full((heads,), 0.25, jnp.float32) for _ in range(3))
    whole = jax.jit(lambda q, k, v, d: float8_attention(q, k, v, d, softmax_scale=dim**-0.5, causal=causal))
    prep = jax.jit(lambda v: keys_in_register_order(jnp.transpose(v, (0, 2, 3, 1))))
    copy = jax.jit(lambda v: v + jnp.ones((), v.dtype))
    fns = {"whole": lambda: whole(q8, k8, v8, descales), "prep": lambda: prep(v8), "copy": lambda: copy(v8)}
    for fn in fns.values():
        jax.block_until_ready(fn())
    t = time_fns(fns, repeats=repeats)
    log(
        f"B={batch} S={seq} H={heads} D={dim} causal={causal}: whole {1e3 * t['whole']:.4f} ms, V prep "
        f"{1e3 * t['prep']:.4f} ms ({t['prep'] / t['whole']:.1%}), e4m3 V + 1 {1e3 * t['copy']:.4f} ms"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shape", action="append", required=True, help="B,S,H,D")
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args()
    for shape in args.shape:
        for causal in (False, True):
            time_case(*map(int, shape.split(",")), causal, args.repeats)


if __name__ == "__main__":
    main()
