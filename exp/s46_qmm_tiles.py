"""Session 46: issue 45's weight-only matmul (the landed Triton kernel) at more programs an SM: contraction splits and
warps beside the heuristic tiles, K = N = 8192, four distinct layers a call as `ejkernel bench quantized_matmul` runs
them; ms a layer and the fraction of the bench's copy (a bf16 [8192, 8192] matrix read and written) over the packed
bytes. Call 1's Nsight Compute run found one 4-warp program an SM at the default tiles, issue slots 30-38% busy.

    python3 exp/s46_qmm_tiles.py
"""

import functools

import jax
import jax.numpy as jnp

from ejkernel.benchmarks._harness import copy_builder, time_variants
from ejkernel.benchmarks.quantized_matmul import _layers, _packed
from ejkernel.modules import QuantizedMatmulConfig, quantized_matmul

SIZE, LAYERS = 8192, 4
# (bits, layout, M): tilings (block_n, block_k, warps, stages, splits)
TILES = {
    (8, "col", 16): [
        (64, 256, 8, 3, 2),
        (64, 256, 4, 3, 2),
        (64, 256, 4, 3, 4),
        (32, 256, 4, 3, 2),
        (64, 512, 8, 3, 2),
        (32, 512, 4, 3, 2),
        (64, 128, 4, 4, 4),
    ],
    (8, "row", 16): [(256, 64, 4, 3, 16), (128, 64, 4, 3, 16), (256, 64, 8, 3, 8), (256, 32, 4, 4, 16)],
    (8, "col", 64): [(64, 256, 8, 3, 2), (64, 256, 4, 3, 2), (128, 256, 8, 3, 2), (64, 128, 4, 3, 4)],
    (4, "col", 16): [(64, 256, 8, 3, 2), (64, 256, 4, 3, 2), (64, 512, 8, 3, 2), (32, 512, 4, 3, 4)],
}


def main():
    key = jax.random.PRNGKey(0)
    for (bits, layout, m), tiles in TILES.items():
        transpose = layout == "col"
        weights = _packed("affine", bits, transpose, SIZE, LAYERS, jax.random.fold_in(key, transpose))
        x = jax.random.normal(jax.random.fold_in(key, m), (m, SIZE), jnp.bfloat16)
        op = functools.partial(quantized_matmul, transpose=transpose, bits=bits, mode="affine", platform="triton")
        builders = {"copy": copy_builder(SIZE * SIZE * 2)}
        builders["heuristic tiles"] = lambda op=op, x=x, weights=weights: _layers(
            functools.partial(op, use_best_config=True), x, weights
        )
        for bn, bk, warps, stages, splits in tiles:
            cfg = QuantizedMatmulConfig(block_n=bn, block_k=bk, num_warps=warps, num_stages=stages, split_k=splits,
                                        platform="triton")  # fmt: skip
            builders[f"{bn}x{bk} w{warps} s{stages} k{splits}"] = lambda op=op, x=x, weights=weights, cfg=cfg: _layers(
                functools.partial(op, cfg=cfg), x, weights
            )
        timings = time_variants(builders, repeats=20, where=f"int{bits} {layout} M {m}")
        copy_bw = 2 * SIZE * SIZE * 2 / timings.pop("copy")
        nbytes = weights[0][0].nbytes
        print(f"=== int{bits} {layout} M {m}: copy {copy_bw / 1e12:.2f} TB/s")
        for name, seconds in timings.items():
            per = seconds / LAYERS
            print(f"  {name:26s} {1e3 * per:.4f} ms  {nbytes / per / copy_bw:.3f} of copy")


if __name__ == "__main__":
    main()
