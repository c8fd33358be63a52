"""Session 46: issue 45's weight-only matmul, affine codes multiplied raw (`_kernel.FOLD`: the scales fold into x's
columns without transpose, into each group's product with it; zero points as a separate sum) against the landed
decode-then-scale tiles, K = N = 8192, four distinct layers a call as `ejkernel bench quantized_matmul` runs them;
ms a layer and the fraction of the bench's copy (a bf16 [8192, 8192] matrix read and written) over the packed bytes.

    python3 exp/s46_qmm_fold.py [bits]
"""

import functools
import sys

import jax
import jax.numpy as jnp

import ejkernel.kernels._triton.quantized_matmul._kernel as kernel_module
from ejkernel.benchmarks._harness import copy_builder, time_variants
from ejkernel.benchmarks.quantized_matmul import _layers, _packed
from ejkernel.modules import QuantizedMatmulConfig, quantized_matmul

SIZE, LAYERS = 8192, 4
# (layout, M): fold tilings (block_n, block_k, warps, stages, splits)
TILES = {
    ("row", 16): [
        (64, 256, 4, 3, 4),
        (64, 256, 4, 3, 8),
        (64, 512, 4, 3, 4),
        (64, 128, 4, 4, 8),
        (32, 256, 4, 3, 8),
        (64, 256, 8, 3, 4),
    ],
    ("col", 16): [
        (64, 256, 8, 3, 1),
        (64, 256, 4, 3, 2),
        (128, 256, 8, 3, 1),
        (64, 128, 4, 4, 4),
        (128, 128, 4, 3, 2),
        (256, 64, 4, 4, 4),
        (64, 512, 4, 3, 2),
    ],
    ("row", 64): [(64, 256, 4, 3, 4), (64, 128, 4, 4, 8), (64, 256, 8, 3, 4)],
    ("col", 64): [(64, 256, 8, 3, 1), (128, 128, 4, 3, 2), (64, 128, 4, 4, 4)],
}


def build(x, weights, transpose, bits, fold, cfg):
    def make():
        kernel_module.FOLD = fold
        jax.clear_caches()
        op = functools.partial(quantized_matmul, transpose=transpose, bits=bits, mode="affine", platform="triton",
                               use_best_config=cfg is None, cfg=cfg)  # fmt: skip
        call = _layers(op, x, weights)
        jax.block_until_ready(call())
        return call

    return make


def main():
    bits = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    key = jax.random.PRNGKey(0)
    copy = copy_builder(SIZE * SIZE * 2)
    for (layout, m), tiles in TILES.items():
        if bits == 4 and m == 64:
            continue
        transpose = layout == "col"
        weights = _packed("affine", bits, transpose, SIZE, LAYERS, jax.random.fold_in(key, transpose))
        x = jax.random.normal(jax.random.fold_in(key, m), (m, SIZE), jnp.bfloat16)
        builders = {"copy": copy, "landed (heuristic tiles)": build(x, weights, transpose, bits, False, None)}
        builders["fold, heuristic tiles"] = build(x, weights, transpose, bits, True, None)
        for bn, bk, warps, stages, splits in tiles:
            cfg = QuantizedMatmulConfig(block_n=bn, block_k=bk, num_warps=warps, num_stages=stages, split_k=splits,
                                        platform="triton")  # fmt: skip
            builders[f"fold {bn}x{bk} w{warps} s{stages} k{splits}"] = build(x, weights, transpose, bits, True, cfg)
        reference = jax.jit(functools.partial(quantized_matmul, transpose=transpose, bits=bits, platform="xla"))
        timings = time_variants(builders, repeats=20, where=f"int{bits} {layout} M {m}")
        copy_bw = 2 * SIZE * SIZE * 2 / timings.pop("copy")
        nbytes = weights[0][0].nbytes
        kernel_module.FOLD = True
        jax.clear_caches()
        one = functools.partial(quantized_matmul, transpose=transpose, bits=bits, mode="affine", platform="triton",
                                use_best_config=True)  # fmt: skip
        err = jnp.linalg.norm(one(x, *weights[0]) - reference(x, *weights[0])) / jnp.linalg.norm(
            reference(x, *weights[0])
        )
        print(f"=== int{bits} {layout} M {m}: copy {copy_bw / 1e12:.2f} TB/s; fold vs XLA error {float(err):.2e}")
        for name, seconds in timings.items():
            per = seconds / LAYERS
            print(f"  {name:34s} {1e3 * per:.4f} ms  {nbytes / per / copy_bw:.3f} of copy")


if __name__ == "__main__":
    main()
