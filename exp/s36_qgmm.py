"""Session 36: quantized-weight grouped matmul (issue 45) on the MoE shape (M 32768, K 4096, N 1536, 64 groups, bf16
lhs), the Triton forward swept over tiles, beside our bf16 grouped matmul (`auto`). Modes: MXFP4 and int4 affine
(groups of 128) `QuantizedArray`s packed along K, and DeepSeek-style FP8 with 128 x 128 block scales (v3
`rhs_scale`). Call 5 ran each tile also with a trial `swap_ab` field of the kernel's tiling (the transposed tile),
removed since (BENCHMARKS.md has its times). Writes `qgmm.json` to `--out`. `--fp8-lhs`: only the
FP8 x FP8 forward (`fp8_lhs`), at the implementation's default tiles and at the bf16 forward's (128, 64, 256, 8, 3).

    python3 exp/s36_qgmm.py --out $OUT
"""

import argparse
import functools
import json
import pathlib

import jax
import jax.numpy as jnp

from ejkernel.benchmarks._harness import time_variants
from ejkernel.benchmarks.grouped_matmul import fp8_block_scaled, random_group_sizes
from ejkernel.modules import grouped_matmul
from ejkernel.modules.operations.grouped_matmul import GroupedMatmulConfig
from ejkernel.ops.config import FwdParams
from ejkernel.quantization import quantize_array

M, K, N, G = 32768, 4096, 1536, 64
TILES = [(128, 64, 256, 8, 3), (128, 64, 128, 4, 3), (128, 128, 128, 8, 3), (128, 64, 128, 8, 4), (64, 128, 128, 4, 3),
         (256, 64, 128, 8, 3)]  # fmt: skip


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="out")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--fp8-lhs", action="store_true")
    args = p.parse_args()
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    lhs = jax.random.normal(keys[0], (M, K), jnp.float32).astype(jnp.bfloat16)
    w = (jax.random.normal(keys[1], (G, K, N), jnp.float32) * K**-0.5).astype(jnp.bfloat16)
    sizes = random_group_sizes(M, G)
    fp8, rhs_scale = fp8_block_scaled(w, 128)
    modes = {
        "mxfp4": (quantize_array(w, mode="mxfp4", axis="row"), {}),
        "int4 g128": (quantize_array(w, group_size=128, bits=4, axis="row"), {}),
        "fp8 block-scaled": (fp8, dict(rhs_scale=rhs_scale, use_v3=True)),
    }
    out = dict(preferred_element_type=jnp.bfloat16)

    def build(rhs, extra, tiles):
        def builder():
            cfg = None
            if tiles is not None:
                bm, bk, bn, warps, stages = tiles
                params = FwdParams(block_q=bm, block_k=bk, block_d=bn, num_warps=warps, num_stages=stages)
                cfg = GroupedMatmulConfig(platform="triton", fwd_params=params)
            fn = jax.jit(lambda a, b: grouped_matmul(a, b, sizes, cfg=cfg, platform="triton", **extra, **out))
            return functools.partial(fn, lhs, rhs)

        return builder

    bf16 = jax.jit(lambda a, b: grouped_matmul(a, b, sizes, **out))
    builders = {"bf16 auto": lambda: functools.partial(bf16, lhs, w)}
    if args.fp8_lhs:
        modes = {"fp8 x fp8": (fp8, dict(rhs_scale=rhs_scale, use_v3=True, fp8_lhs=True))}
        builders["fp8 x fp8 default"] = build(*modes["fp8 x fp8"], None)
        builders["fp8 x fp8 (128, 64, 256, 8, 3)"] = build(*modes["fp8 x fp8"], TILES[0])
    for mode, (rhs, extra) in {} if args.fp8_lhs else modes.items():
        for tiles in TILES if mode != "int4 g128" else TILES[:3]:
            builders[f"{mode} {tiles}"] = build(rhs, extra, tiles)
    timings = time_variants(builders, repeats=args.repeats, where="quantized gmm")
    base = timings.get("bf16 auto")
    rows = []
    for name, seconds in timings.items():
        row = dict(name=name, ms=1e3 * seconds, TFLOPs=2 * M * K * N / seconds / 1e12, x_bf16=base / seconds)
        rows.append(row)
        print(f"{name:48s} {row['ms']:.3f} ms  {row['TFLOPs']:.0f} TFLOP/s  {row['x_bf16']:.2f}x bf16", flush=True)
    folder = pathlib.Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "qgmm.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
