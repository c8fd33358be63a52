"""Thirty-first session: the Mosaic GPU FP8 x FP8 grouped matmul forward by tiling (issue 45: FP8 block-scaled
forward >= 1.4x our bf16 forward, i.e. <= 0.55 ms at the bench's MoE shape), beside the bf16 forwards (auto: the
Triton kernel; Mosaic GPU) and the Triton FP8 paths, at `ejkernel bench grouped_matmul --part quantized`'s shape
(M 32768, K 4096, N 1536, 64 groups, bf16 output).

    PYTHONPATH=src python exp/s31_fp8gmm.py                   # on an H100/H200, a few minutes with compilation
    PYTHONPATH=src python exp/s31_fp8gmm.py --only "fp8 128x128 ov s5,fp8 128x128 s5"
    PYTHONPATH=src python exp/s31_fp8gmm.py --quick           # a tiny shape in Mosaic GPU interpret mode (CPU)

Variants: `fp8 BMxBN [ov] sS` the Mosaic GPU FP8 forward (`GroupedMatmulMosaicFp8Tiling(block_m, block_n,
num_stages, overlap)`; stages that fit a bf16 output tile; 256 columns: 2 wgmmas a step, 4 when overlapped) on
`[G, N, K]` weights (made once, outside the timing), its time including the lhs pre-pass (`fp8 pre-pass` times
that alone); `triton fp8 x fp8` the Triton kernel with `fp8_lhs` on `[G, K, N]` weights, `triton fp8 weights`
without (lhs stays bf16). Each variant is compiled and run once alone, its output checked against the Triton FP8 x
FP8 output (`rel` = ‖x − ref‖ / ‖ref‖: the same rounding of lhs, so float32 summation order and the bf16 output
only) and against bf16 (`vs bf16`: FP8's rounding, a few percent); then all that ran are timed together
(interleaved). A variant whose barriers deadlock hangs the GPU: the watchdog names it after `--stall` seconds
without progress and exits (rerun with `--skip` it). One line per variant: ms, TFLOP/s (2·M·K·N) and the ratio to
the bf16 forward (auto: Triton) and to the bf16 Mosaic GPU forward.
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
from _kit import compile_and_time, interpret_context, log, rel, start_watchdog

from ejkernel.benchmarks.grouped_matmul import SHAPES, fp8_block_scaled, random_group_sizes
from ejkernel.kernels._common.grouped_matmul_quantized import fp8_row_blocks
from ejkernel.kernels._pallas.gpu.grouped_matmul._interface import mosaic_grouped_matmul
from ejkernel.modules import GroupedMatmulConfig, GroupedMatmulMosaicFp8Tiling, grouped_matmul

TILINGS = {
    "fp8 128x128 ov s5": GroupedMatmulMosaicFp8Tiling(block_m=128, block_n=128, num_stages=5, overlap=True),
    "fp8 128x128 s5": GroupedMatmulMosaicFp8Tiling(block_m=128, block_n=128, num_stages=5, overlap=False),
    "fp8 128x256 s3": GroupedMatmulMosaicFp8Tiling(block_m=128, block_n=256, num_stages=3, overlap=False),  # 2 wgmmas
    "fp8 128x256 ov s3": GroupedMatmulMosaicFp8Tiling(block_m=128, block_n=256, num_stages=3, overlap=True),  # 4
}
REFERENCE = "triton fp8 x fp8"
QUICK_SHAPE = (300, 256, 384, 5)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a tiny shape in Mosaic GPU interpret mode (CPU)")
    p.add_argument("--shape", help="M,K,N,G instead of the bench's MoE shape")
    p.add_argument("--only", help="comma-separated FP8 tiling names (the bf16 and Triton rows always run)")
    p.add_argument("--skip", help="comma-separated variant names to leave out (one that hung)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--stall", type=float, default=180.0, help="watchdog: seconds without progress before exiting")
    args = p.parse_args()
    start_watchdog(args.stall)
    shape = tuple(map(int, args.shape.split(","))) if args.shape else (QUICK_SHAPE if args.quick else SHAPES[0])
    tilings = TILINGS if not args.only else {n: TILINGS[n] for n in args.only.split(",")}
    context = interpret_context(args.quick)  # (the Triton and cuDNN rows need a GPU)
    log(f"device {jax.devices()[0].device_kind}, jax {jax.__version__}, shape {shape}, tilings {list(tilings)}")
    with context:
        run(args, shape, tilings)
    log("done")


def variants(m: int, k: int, n: int, groups: int, tilings: dict, quick: bool) -> dict:
    """name -> zero-argument call (arrays bound as arguments, not closed over: XLA would fold them)."""
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    lhs = jax.random.normal(keys[0], (m, k), jnp.bfloat16)
    w = (jax.random.normal(keys[1], (groups, k, n), jnp.float32) * k**-0.5).astype(jnp.bfloat16)
    sizes = random_group_sizes(m, groups)
    fp8, scale = fp8_block_scaled(w, 128)
    fp8_nk = jnp.swapaxes(fp8, 1, 2)  # the K-major layout FP8 wgmma reads, made once
    out = dict(preferred_element_type=jnp.bfloat16)
    v3 = dict(use_v3=True, rhs_scale=scale, **out)
    bound = lambda fn, *xs: functools.partial(jax.jit(fn), *xs)
    if quick:  # the kernels without the device check (a CPU is no Hopper GPU)
        mosaic = lambda a, b, cfg=None, **kw: mosaic_grouped_matmul(a, b, sizes, cfg=cfg, **kw)
    else:
        mosaic = lambda a, b, cfg=None, **kw: grouped_matmul(a, b, sizes, platform="pallas", cfg=cfg, **kw)
    calls = {}
    if not quick:
        calls["bf16 auto"] = bound(lambda a, b: grouped_matmul(a, b, sizes, **out), lhs, w)
    calls["bf16 mosaic"] = bound(lambda a, b: mosaic(a, b, **out), lhs, w)
    for name, tiling in tilings.items():
        cfg = GroupedMatmulConfig(mosaic_fp8_tiling=tiling)
        fn = lambda a, b, cfg=cfg: mosaic(a, b, cfg=cfg, fp8_lhs=True, transpose_rhs=True, **v3)
        calls[name] = bound(fn, lhs, fp8_nk)
    if not quick:
        calls["fp8 pre-pass"] = bound(lambda a: fp8_row_blocks(a, 128), lhs)
        calls[REFERENCE] = bound(
            lambda a, b: grouped_matmul(a, b, sizes, fp8_lhs=True, platform="triton", **v3), lhs, fp8
        )
        calls["triton fp8 weights"] = bound(lambda a, b: grouped_matmul(a, b, sizes, platform="triton", **v3), lhs, fp8)
    else:  # the XLA path stands in for Triton as the reference
        calls[REFERENCE] = bound(lambda a, b: grouped_matmul(a, b, sizes, fp8_lhs=True, platform="xla", **v3), lhs, fp8)
    return calls


def run(args, shape, tilings: dict) -> None:
    m, k, n, groups = shape
    where = f"M={m} K={k} N={n} G={groups}"
    calls = variants(m, k, n, groups, tilings, args.quick)
    timings, outputs = compile_and_time(where, calls, skip=args.skip, quick=args.quick, repeats=args.repeats)
    flops = 2.0 * m * k * n
    auto, mosaic = timings.get("bf16 auto"), timings.get("bf16 mosaic")
    reference, bf16 = outputs.get(REFERENCE), outputs.get("bf16 auto", outputs.get("bf16 mosaic"))
    for name, seconds in timings.items():
        ratios = "".join(
            f"  x{base / seconds:.2f} {label}" for base, label in ((auto, "bf16"), (mosaic, "mosaic bf16")) if base
        )
        checks = ""
        if name.startswith("fp8 ") and name != "fp8 pre-pass":
            checks = f"  rel {rel(outputs[name], reference):.1e} to {REFERENCE}" if reference is not None else ""
            checks += f", {rel(outputs[name], bf16):.1e} vs bf16" if bf16 is not None else ""
        log(f"{where}: {name:20s} {1e3 * seconds:8.3f} ms {flops / seconds / 1e12:7.1f} TFLOP/s{ratios}{checks}")


if __name__ == "__main__":
    main()
