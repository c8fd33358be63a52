"""Session 48: what ptxas says of the float8 flash attention forward (issue 42), P in shared memory against P as
P·V's register operand, causal and not. In call 1 P in registers ran 1.19-1.23x faster without a mask but 5-7%
slower causal; spills or serialised wgmmas (C7513) in the masked steps would explain it. Since session 49 P is
always in registers (the `p_in_registers` keyword is gone): this compiles the causal and the unmasked kernel, each in
turn, with Mosaic GPU's dumps on (a fresh process, no warm compilation cache):

    MOSAIC_GPU_DUMP_TO=/tmp/mgpu MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_SASS=1 python3 exp/s48_fp8_ptxas.py
"""

import pathlib
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from s41_ptxas_gmm import DUMP, compiled

from ejkernel.kernels._pallas.gpu.flash_attention._interface import float8_attention


def main():
    DUMP.mkdir(parents=True, exist_ok=True)
    shape = (2, 8192, 16, 128)
    q, k, v = (
        jax.random.normal(jax.random.PRNGKey(i), shape, jnp.bfloat16).astype(jnp.float8_e4m3fn) for i in range(3)
    )
    descales = tuple(jnp.full((16,), 0.25, jnp.float32) for _ in range(3))
    for causal in (False, True):
        run = jax.jit(lambda q, k, v, d, c=causal: float8_attention(q, k, v, d, softmax_scale=128**-0.5, causal=c))
        compiled(f"causal={causal}", lambda run=run: run(q, k, v, descales))


if __name__ == "__main__":
    main()
