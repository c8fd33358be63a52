"""Thirtieth session: the Triton weight-only `quantized_matmul`'s decode variants (issue 45) on the GPU:
`python3 exp/s30_qmm_variants.py [--modes int4_g64 ...] [--layouts row col] [--rows 16 64]`.

Per mode, layout (row: transpose=False, EasyDeL's; col: transpose=True) and rows of x (K = N = 8192, bf16 x,
`LAYERS` distinct weight matrices a call, so that they stream from HBM): the kernel at explicit tilings
(`_kernel.TritonQuantizedMatmulTiling`: scales folded out of the weights, affine codes spelled into floats,
two codes a 32-bit operation, swapped dot operands, on the old heuristic's tiles and a few others with every
switch the call can have on), and the public op at its heuristic
(`auto`). One line a variant: mode, layout, M, variant, ms a matrix, TB/s over the packed weights, and the
fraction of a device copy (`a + 1` of a bf16 [K, N] matrix, bytes read + written) timed in the same run, and the
relative difference of its first matrix's result from XLA's (about 2e-3 where scales are folded, 0 else).
"""

import argparse
import dataclasses
import functools

import jax
import jax.numpy as jnp
from _kit import rel

from ejkernel.benchmarks._harness import time_variants
from ejkernel.kernels._triton._decode import magic_offset
from ejkernel.kernels._triton.quantized_matmul._interface import tiling
from ejkernel.kernels._triton.quantized_matmul._kernel import matmul
from ejkernel.modules import quantized_matmul
from ejkernel.modules.operations.quantized_matmul import QuantizedMatmulConfig
from ejkernel.quantization import prepack_quantized_weights
from ejkernel.quantization.modes import resolve_params

SIZE, LAYERS = 8192, 4
MODES = {  # name -> (mode, bits, group)
    "int4_g64": ("affine", 4, 64),
    "int4_g128": ("affine", 4, 128),
    "int8_g64": ("affine", 8, 64),
    "int8_g128": ("affine", 8, 128),
    "nf4": ("nf4", None, 64),
    "mxfp4": ("mxfp4", None, 32),
}
LAYOUTS = {"row": False, "col": True}
OLD_TILES = {(False, 4): (64, 256, 4, 4), (False, 8): (256, 64, 8, 4)}  # session 28's (block_n, block_k, warps, split)
OLD_DEFAULT = (64, 256, 8, None)
OTHER_TILES = {False: ((128, 256, 8), (64, 512, 8), (32, 512, 4)), True: ((256, 128, 8), (128, 64, 4), (256, 64, 4))}
# (block_n, block_k, warps) tried with every switch on; a fold shrinks the grouped edge to the group


def variants(params, transpose, m):
    """`name -> tiling` of the kernel for one case: the old tiles with each switch, then other tiles."""
    block_n, block_k, warps, split = OLD_TILES.get((transpose, params.bits), OLD_DEFAULT)
    old = QuantizedMatmulConfig(block_m=64, block_n=block_n, block_k=block_k, num_warps=warps, split_k=split)
    affine = params.mode == "affine"
    pairs = affine and magic_offset(jnp.bfloat16, params.bits) != 0
    switches = {"plain": (False, False, False), "swap": (False, False, True), "fold": (True, False, False)}
    switches |= {"fold+swap": (True, False, True)}
    if affine:
        switches |= {
            "magic": (False, True, False),
            "fold+magic": (True, True, False),
            "fold+magic+swap": (True, True, True),
        }
    if pairs:
        switches |= {"fold+magic+pairs": (True, True, False, True), "all": (True, True, True, True)}
    out = {}
    for name, (fold, magic, swap, *paired) in switches.items():
        flags = dict(fold_scales=fold, magic_codes=magic, swap_ab=swap, paired_codes=bool(paired))
        out[f"{name} old-tiles"] = tiling(old, m, SIZE, SIZE, params, transpose, jnp.bfloat16, False, flags)
    for bn, bk, w in OTHER_TILES[transpose]:
        cfg = QuantizedMatmulConfig(block_m=64, block_n=bn, block_k=bk, num_warps=w)
        flags = dict(fold_scales=True, magic_codes=affine, swap_ab=True, paired_codes=pairs)
        t = tiling(cfg, m, SIZE, SIZE, params, transpose, jnp.bfloat16, False, flags)
        for splits in sorted({t.splits, 2 * t.splits}):
            out[f"all {t.block_n}x{t.block_k} w{w} s{splits}"] = dataclasses.replace(t, splits=splits)
    return out


def packed_layers(mode, bits, group, transpose, key):
    layers = []
    for k in jax.random.split(key, LAYERS):
        kernel = jax.random.normal(k, (SIZE, SIZE), jnp.bfloat16)
        packed = prepack_quantized_weights(kernel, group_size=group, bits=bits, mode=mode, transpose=transpose)
        layers.append(packed if len(packed) == 3 else (*packed, None))
    return layers


def over_layers(fn, x, layers):
    return functools.partial(jax.jit(lambda x, layers: [fn(x, *layer) for layer in layers]), x, layers)


def kept(build, calls, name):
    """`build()`'s call, also kept in `calls[name]` (to check its result after timing without compiling again)."""
    calls[name] = build()
    return calls[name]


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    p.add_argument("--layouts", nargs="+", choices=list(LAYOUTS), default=list(LAYOUTS))
    p.add_argument("--rows", nargs="+", type=int, default=[16, 64])
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args()
    key = jax.random.PRNGKey(0)
    dense = jax.random.normal(key, (SIZE, SIZE), jnp.bfloat16)
    copy = jax.jit(lambda a: a + 1)
    for index, name in enumerate(args.modes):
        mode, bits, group = MODES[name]
        params = resolve_params(mode, group, bits)
        for layout in args.layouts:
            transpose = LAYOUTS[layout]
            layers = packed_layers(mode, bits, group, transpose, jax.random.fold_in(key, 2 * index + transpose))
            weight_bytes = layers[0][0].nbytes
            for m in args.rows:
                x = jax.random.normal(jax.random.fold_in(key, m), (m, SIZE), jnp.bfloat16)
                builders, calls = {"copy": lambda: functools.partial(copy, dense)}, {}
                for variant, t in variants(params, transpose, m).items():
                    fn = functools.partial(matmul, params=params, transpose=transpose, tiling=t)
                    builders[variant] = functools.partial(
                        kept, functools.partial(over_layers, fn, x, layers), calls, variant
                    )
                op = functools.partial(quantized_matmul, transpose=transpose, group_size=group, bits=bits, mode=mode)
                auto = functools.partial(
                    over_layers, functools.partial(op, platform="triton", use_best_config=True), x, layers
                )
                builders["auto"] = functools.partial(kept, auto, calls, "auto")
                where = f"{name} {layout} M={m}"
                timings = time_variants(builders, repeats=args.repeats, where=where)
                copy_bw = 2 * dense.nbytes / timings.pop("copy")
                expected = jax.jit(functools.partial(op, platform="xla"))(x, *layers[0])
                for variant, seconds in timings.items():
                    seconds /= LAYERS
                    bw = weight_bytes / seconds
                    line = f"{where:22s} {variant:28s} {1e3 * seconds:.4f} ms {bw / 1e12:.2f} TB/s"
                    print(f"{line} {bw / copy_bw:.2f} of copy, {rel(calls[variant]()[0], expected):.1e} from XLA")
                print(f"{where:22s} copy {copy_bw / 1e12:.2f} TB/s", flush=True)


if __name__ == "__main__":
    main()
