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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shape", action="append", required=True, help="B,S,H,D")
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args()
    for shape in args.shape:
        batch, seq, heads, dim = map(int, shape.split(","))
        keys = jax.random.split(jax.random.PRNGKey(0), 3)
        q8, k8, v8 = (
            (4 * jax.random.normal(key, (batch, seq, heads, dim), jnp.bfloat16)).astype(jnp.float8_e4m3fn)
            for key in keys
        )
        descales = tuple(jnp.full((heads,), 0.25, jnp.float32) for _ in range(3))
        for causal in (False, True):
            whole = jax.jit(
                lambda q, k, v, d, c=causal: float8_attention(q, k, v, d, softmax_scale=dim**-0.5, causal=c)
            )
            prep = jax.jit(lambda v: keys_in_register_order(jnp.transpose(v, (0, 2, 3, 1))))
            copy = jax.jit(lambda v: v + jnp.ones((), v.dtype))
            fns = {0: lambda: whole(q8, k8, v8, descales), 1: lambda: prep(v8), 2: lambda: copy(v8)}
            for fn in fns.values():
                jax.block_until_ready(fn())
            times = time_fns(fns, repeats=args.repeats)
            log(
                f"B={batch} S={seq} H={heads} D={dim} causal={causal}: whole {1e3 * times[0]:.4f} ms, "
                f"V prep {1e3 * times[1]:.4f} ms ({times[1] / times[0]:.1%}), e4m3 V + 1 {1e3 * times[2]:.4f} ms"
            )


if __name__ == "__main__":
    main()
