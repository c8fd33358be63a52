"""Session 52: one Mosaic GPU flash-attention forward, run twice, for Nsight Compute to profile (issue 42: the
float8 forward at 1.19x cuDNN bf16 against a 1.6x target; what bounds it beside our bf16 forward).

    ncu --clock-control none -k regex:mosaic -c 1 ... python3 exp/s52_ncu_step.py fp8|bf16 [B,S,H,D] [causal]
"""

import sys

import jax
import jax.numpy as jnp

from ejkernel.kernels._pallas.gpu.flash_attention._interface import float8_attention, mosaic_attention

if __name__ == "__main__":
    kind = sys.argv[1]
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
        run = jax.jit(lambda q, k, v: mosaic_attention(q, k, v, softmax_scale=scale, causal=causal, sliding_window=None))
        args = (q, k, v)
    for _ in range(2):
        jax.block_until_ready(run(*args))
