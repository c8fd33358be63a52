"""Session 54: the Mosaic GPU backward's training steps, timed in one process (issue 42), for an A/B of the dQ
kernel taking each row's `delta = rowsum(dO · O)` itself (`exp/s54_delta_in_dq.patch`) against XLA's pass over O and
dO before the kernels: block-sparse attention at 10% (S 16384, H 16, D 128; 1.26x density x dense against 1.10) and
dense causal training at 2 x 8192 x 16 x 128 and 1 x 8192, H 64 / Hkv 8 (0.88x cuDNN in session 50).

    PYTHONPATH=src python exp/s54_bwd_ab.py [--repeats 10]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
from _kit import log
from s52_ncu_step import sparse_step

from ejkernel.kernels._pallas.gpu.flash_attention._interface import mosaic_attention
from ejkernel.ops.autotune import time_fns


def dense_step(batch: int, seq: int, heads: int, kv_heads: int, dim: int):
    """The gradient of `sum(out)` in q, k, v of causal Mosaic GPU flash attention, bf16 `[B, S, H, D]`."""
    keys = jax.random.split(jax.random.PRNGKey(1), 3)
    q = jax.random.normal(keys[0], (batch, seq, heads, dim), jnp.bfloat16)
    k, v = (jax.random.normal(key, (batch, seq, kv_heads, dim), jnp.bfloat16) for key in keys[1:])
    attend = lambda q, k, v: mosaic_attention(q, k, v, softmax_scale=dim**-0.5, causal=True, sliding_window=None)
    loss = lambda q, k, v: jnp.sum(attend(q, k, v).astype(jnp.float32))
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2))), (q, k, v)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args()
    steps = {
        "sparse 10% 16384x16x128": sparse_step(16384, 16, 128),
        "dense causal 2x8192x16x128": dense_step(2, 8192, 16, 16, 128),
        "dense causal 1x8192x64/8x128": dense_step(1, 8192, 64, 8, 128),
    }
    fns = {name: (lambda run=run, a=a: run(*a)) for name, (run, a) in steps.items()}
    for fn in fns.values():
        jax.block_until_ready(fn())
    for name, seconds in time_fns(fns, repeats=args.repeats).items():
        log(f"{name}: {1e3 * seconds:.4f} ms")


if __name__ == "__main__":
    main()
