"""GPU experiment: the Triton grouped-matmul forward (`_kernel.gmm`) at several tilings, beside a dense matmul
of the same work.

The nineteenth session's runs (H100, docs/benchmarks/experiments_s19.log) also timed a band order
(programs running 2-16 spans of one column tile before the next, for the weights' reuse in L2): 0.976-1.008
against 0.990 ms, noise.

Run on an H100/H200 from the repository root:

    PYTHONPATH=$PWD/src python3 exp/gmm_triton.py [--repeats 10]

(`--smoke`: small sizes in Pallas interpret mode, to try the script on a CPU; timings meaningless.)

M=32768 K=4096 N=1536, 64 random groups (as the grouped_matmul benchmark), bf16. Each variant's output
is checked against the XLA path (relative error) before it is timed.
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
from _kit import first_lines, log, rel

from ejkernel.benchmarks.grouped_matmul import random_group_sizes
from ejkernel.kernels._triton.grouped_matmul._kernel import TritonGroupedMatmulTiling, gmm
from ejkernel.modules import grouped_matmul
from ejkernel.ops.autotune import time_fns

M, K, N, G = 32768, 4096, 1536, 64
# name -> (block_m, block_k, block_n, num_warps, num_stages)
VARIANTS = {
    "128x64x256 w8 s3 (library)": (128, 64, 256, 8, 3),
    "128x64x256 w8 s4": (128, 64, 256, 8, 4),
    "64x64x256 w4 s4": (64, 64, 256, 4, 4),
    "64x64x256 w8 s4": (64, 64, 256, 8, 4),
    "128x128x128 w8 s3": (128, 128, 128, 8, 3),
    "256x64x128 w8 s3": (256, 64, 128, 8, 3),
    "128x64x128 w4 s4": (128, 64, 128, 4, 4),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    global M, K, N
    if args.smoke:
        M, K, N = 1000, 256, 512
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    lhs = jax.random.normal(keys[0], (M, K), jnp.bfloat16)
    rhs = (jax.random.normal(keys[1], (G, K, N), jnp.float32) * K**-0.5).astype(jnp.bfloat16)
    sizes = random_group_sizes(M, G)  # the grouped_matmul benchmark's
    expected = jax.jit(lambda a, b: grouped_matmul(a, b, sizes, platform="xla", preferred_element_type=a.dtype))(
        lhs, rhs
    )
    ready = {"dense": functools.partial(jax.jit(lambda a, b: jnp.dot(a, b[0])), lhs, rhs)}
    for name, (bm, bk, bn, warps, stages) in VARIANTS.items():
        tiling = TritonGroupedMatmulTiling(bm, bk, bn, warps, stages, args.smoke)
        fn = functools.partial(
            gmm, group_sizes=sizes, group_offset=None, transpose_rhs=False, out_dtype=lhs.dtype, tiling=tiling
        )
        call = functools.partial(jax.jit(fn), lhs, rhs)
        try:
            log(f"{name}: error {rel(call(), expected):.2e}")
            ready[name] = call
        except Exception as err:
            log(f"{name}: FAILED\n    {first_lines(err)}")
    seconds = time_fns(ready, repeats=args.repeats, warmup=2)
    flops = 2.0 * M * K * N
    print(f"\nM={M} K={K} N={N} G={G} bf16 on {jax.devices()[0].device_kind}; target fwd >= 0.65 x dense")
    for name, s in seconds.items():
        print(f"{name:40s} {1e3 * s:8.3f} ms {flops / s / 1e12:7.1f} TFLOP/s {seconds['dense'] / s:6.3f} x dense")


if __name__ == "__main__":
    main()
