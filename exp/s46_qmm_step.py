"""Session 46: one weight-only `quantized_matmul` call (K = N = 8192, affine int8 or, with BITS=4, int4; bf16 x), for
Nsight Compute.

[BITS=4] python3 exp/s46_qmm_step.py row|col M [platform [best]]
"""

import os
import sys

import jax
import jax.numpy as jnp

from ejkernel.benchmarks.quantized_matmul import _packed
from ejkernel.modules import quantized_matmul

SIZE = 8192

if __name__ == "__main__":
    layout, m = sys.argv[1], int(sys.argv[2])
    platform = sys.argv[3] if len(sys.argv) > 3 else "triton"
    best = sys.argv[4:5] == ["best"]
    transpose = layout == "col"
    bits = int(os.environ.get("BITS", 8))
    ((w, scales, zeros),) = _packed("affine", bits, transpose, SIZE, 1, jax.random.PRNGKey(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (m, SIZE), jnp.bfloat16)
    call = jax.jit(
        lambda x, w, s, z: quantized_matmul(
            x, w, s, z, transpose=transpose, bits=bits, platform=platform, use_best_config=best
        )
    )
    for _ in range(3):
        call(x, w, scales, zeros).block_until_ready()
    print(w.shape, w.dtype, scales.shape, None if zeros is None else zeros.shape)
