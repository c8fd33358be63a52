"""Session 52: one Mosaic GPU attention call, run twice, for Nsight Compute to profile (issue 42): the float8 forward
(1.19x cuDNN bf16 against a 1.6x target) or our bf16 forward (`fp8`, `bf16`: `B,S,H,D`, optional `causal`), or
block-sparse attention's forward + backward at 10% of 128 x 128 blocks (`sparse`: `S,H,D`; its three kernels, forward,
dQ, dK/dV; 1.26x density x dense against a 1.10 target).

    ncu --clock-control none -k regex:mosaic -c 1 ... python3 exp/s52_ncu_step.py fp8|bf16 [B,S,H,D] [causal]
    ncu --clock-control none -k regex:mosaic -c 3 ... python3 exp/s52_ncu_step.py sparse [S,H,D]
"""

import sys

import jax
import jax.numpy as jnp

from ejkernel.benchmarks.sparse_attention import random_blocks
from ejkernel.kernels._pallas.gpu.blocksparse_attention._interface import mosaic_blocksparse
from ejkernel.kernels._pallas.gpu.flash_attention._interface import float8_attention, mosaic_attention


def sparse_step(seq: int, heads: int, dim: int):
    """The gradient of `sum(out)` in q, k, v of block-sparse attention at 10%, `[1, H, S, D]` bf16."""
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    q, k, v = (jax.random.normal(key, (1, heads, seq, dim), jnp.bfloat16) for key in keys)
    builder, _ = random_blocks(seq, 0.10)
    attend = lambda q, k, v: mosaic_blocksparse(q, k, v, mask_builder=builder, causal=False, softmax_scale=dim**-0.5)
    loss = lambda q, k, v: jnp.sum(attend(q, k, v).astype(jnp.float32))
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2))), (q, k, v)


if __name__ == "__main__":
    kind = sys.argv[1]
    if kind == "sparse":
        run, args = sparse_step(*map(int, (sys.argv[2] if len(sys.argv) > 2 else "16384,16,128").split(",")))
        for _ in range(2):
            jax.block_until_ready(run(*args))
        sys.exit()
    batch, seq, heads, dim = map(int, (sys.argv[2] if len(sys.argv) > 2 else "2,8192,16,128").split(","))
    causal = len(sys.argv) > 3 and sys.argv[3] == "causal"
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    q, k, v = (jax.random.normal(key, (batch, seq, heads, dim), jnp.bfloat16) for key in keys)
    scale = dim**-0.5
    if kind == "fp8":
        q8, k8, v8 = ((4 * x).astype(jnp.float8_e4m3fn) for x in (q, k, v))
        descales = tuple(jnp.full((heads,), 0.25, jnp.float32) for _ in range(3))
        run = jax.jit(lambda q, k, v, d: float8_attention(q, k, v, d, softmax_scale=scale, causal=causal))
        args = (q8, k8, v8, descales)
    else:
        attend = lambda q, k, v: mosaic_attention(q, k, v, softmax_scale=scale, causal=causal, sliding_window=None)
        run = jax.jit(attend)
        args = (q, k, v)
    for _ in range(2):
        jax.block_until_ready(run(*args))
