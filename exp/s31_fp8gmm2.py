"""Thirty-first session, round two of the Mosaic GPU FP8 x FP8 grouped matmul forward (issue 45: <= 0.55 ms, 1.4x
our bf16 forward, at `ejkernel bench grouped_matmul --part quantized`'s shape: M 32768, K 4096, N 1536, 64 groups,
bf16 output). Two switches of `GroupedMatmulMosaicFp8Tiling`, A/B'd at the tiles measured best in round one and
a few others:

- `round_in_kernel`: lhs rounded to e4m3 by the Mosaic GPU pass `round_lhs_blocks` (bit for bit
  `fp8_row_blocks`) instead of XLA's `fp8_row_blocks` (0.247 ms in round one; copy speed is ~0.1 ms);
- `column_blocks`: with DeepSeek-V3 weight scales (constant over each 128 columns, as the bench's
  `fp8_block_scaled` makes them) each K step's product is promoted with one scale per row, one FMA an element,
  instead of a multiply and an FMA an element (the kernel checks the scales on the device and keeps the other
  promotion for scales that vary by column).

    PYTHONPATH=src python exp/s31_fp8gmm2.py            # on an H100/H200, about two minutes with compilation
    PYTHONPATH=src python exp/s31_fp8gmm2.py --only "fp8 128x256 s3 old,fp8 128x256 s3 new"

Rows: `bf16 auto` (our bf16 forward), `pre-pass xla` (`fp8_row_blocks` and the kernel's scale layout, round one's
pre-pass), `pre-pass kernel` (`round_lhs_blocks`), a device copy of lhs (what copy speed means here), then the FP8
forwards, their time including the pre-pass (`old`: both switches off, round one's default; `round`: only the
rounding kernel; `colblk`: only the per-row promotion; `new`: both). Each FP8 output is checked against `fp8
128x256 s3 old` (`rel`: the same codes, so float32 summation order and the bf16 output only) and against bf16
(FP8's rounding, a few percent). One flushed line a row: ms, TFLOP/s (2·M·K·N), the ratio to bf16 auto.
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
from _kit import first_lines, log, rel, start_watchdog

from ejkernel.benchmarks.grouped_matmul import SHAPES, fp8_block_scaled, random_group_sizes
from ejkernel.kernels._common.grouped_matmul_quantized import fp8_row_blocks
from ejkernel.kernels._pallas.gpu.grouped_matmul._fp8 import round_lhs_blocks, step_scales
from ejkernel.modules import GroupedMatmulConfig, GroupedMatmulMosaicFp8Tiling, grouped_matmul
from ejkernel.ops.autotune import time_fns

SWITCHES = {
    "old": dict(round_in_kernel=False, column_blocks=False),
    "round": dict(round_in_kernel=True, column_blocks=False),
    "colblk": dict(round_in_kernel=False, column_blocks=True),
    "new": dict(round_in_kernel=True, column_blocks=True),
}
TILES = {
    "128x256 s3": dict(block_m=128, block_n=256, num_stages=3, overlap=False),  # two 128-column wgmmas a step
    "256x128 s4": dict(block_m=256, block_n=128, num_stages=4, overlap=False),  # 128 rows a warpgroup, 2 wgmmas
    "128x128 s5": dict(block_m=128, block_n=128, num_stages=5, overlap=False),
    "128x128 ov s5": dict(block_m=128, block_n=128, num_stages=5, overlap=True),
}
TILINGS = {
    f"fp8 {tiles} {name}": GroupedMatmulMosaicFp8Tiling(**TILES[tiles], **SWITCHES[name])
    for tiles in TILES
    for name in (SWITCHES if tiles == "128x256 s3" else ("old", "new"))
}
REFERENCE = "fp8 128x256 s3 old"


def variants(m: int, k: int, n: int, groups: int, tilings: dict, bf16_cfgs: dict) -> dict:
    """name -> zero-argument call (arrays bound as arguments, not closed over: XLA would fold them); `bf16_cfgs`
    (name -> `GroupedMatmulConfig`) adds bf16 rows after `bf16 auto`."""
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    lhs = jax.random.normal(keys[0], (m, k), jnp.bfloat16)
    w = (jax.random.normal(keys[1], (groups, k, n), jnp.float32) * k**-0.5).astype(jnp.bfloat16)
    sizes = random_group_sizes(m, groups)
    fp8, scale = fp8_block_scaled(w, 128)
    fp8_nk = jnp.swapaxes(fp8, 1, 2)  # the K-major layout FP8 wgmma reads, made once
    out = dict(preferred_element_type=jnp.bfloat16)
    v3 = dict(use_v3=True, rhs_scale=scale, **out)
    bound = lambda fn, *xs: functools.partial(jax.jit(fn), *xs)
    rows = -(-m // 128) * 128

    def xla_pass(a):
        codes, scales = fp8_row_blocks(a, 128)
        return codes, step_scales(scales, scale, 128, rows)[0]

    calls = {
        "bf16 auto": bound(lambda a, b: grouped_matmul(a, b, sizes, **out), lhs, w),
        **{
            name: bound(lambda a, b, cfg=cfg: grouped_matmul(a, b, sizes, cfg=cfg, **out), lhs, w)
            for name, cfg in bf16_cfgs.items()
        },
        "pre-pass xla": bound(xla_pass, lhs),
        "pre-pass kernel": bound(lambda a: round_lhs_blocks(a, 128, m, rows), lhs),
        "copy of lhs": bound(lambda a: a + jnp.bfloat16(1), lhs),
    }
    for name, tiling in tilings.items():
        cfg = GroupedMatmulConfig(mosaic_fp8_tiling=tiling)
        fn = lambda a, b, cfg=cfg: grouped_matmul(
            a, b, sizes, platform="pallas", cfg=cfg, fp8_lhs=True, transpose_rhs=True, **v3
        )
        calls[name] = bound(fn, lhs, fp8_nk)
    return calls


def main(
    all_tilings: dict = TILINGS, reference: str = REFERENCE, doc: str = __doc__, bf16_cfgs: dict | None = None
) -> None:
    """Time `all_tilings` (name -> FP8 tiling; `--only` picks some) beside the bf16 rows (`bf16 auto` and
    `bf16_cfgs`), the pre-pass and copy rows, each FP8 output compared with `reference`'s (another session's
    script passes its own rows)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", help="M,K,N,G instead of the bench's MoE shape")
    p.add_argument("--only", help="comma-separated FP8 rows (the bf16, pre-pass and copy rows always run)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--stall", type=float, default=180.0, help="watchdog: seconds without progress before exiting")
    args = p.parse_args()
    start_watchdog(args.stall)
    m, k, n, groups = tuple(map(int, args.shape.split(","))) if args.shape else SHAPES[0]
    tilings = all_tilings if not args.only else {name: all_tilings[name] for name in args.only.split(",")}
    where = f"M={m} K={k} N={n} G={groups}"
    log(f"device {jax.devices()[0].device_kind}, jax {jax.__version__}, {where}, rows {list(tilings)}")
    calls, outputs = {}, {}
    for name, call in variants(m, k, n, groups, tilings, bf16_cfgs or {}).items():
        log(f"{where}: compiling and running {name}")
        try:
            outputs[name] = jax.block_until_ready(call())
            calls[name] = call
        except Exception as err:  # a variant that cannot run: report, go on
            log(f"{where}: {name} failed: {first_lines(err)}")
    log(f"{where}: timing {len(calls)} calls")
    timings = time_fns(calls, repeats=args.repeats, warmup=2)
    flops, bf16 = 2.0 * m * k * n, timings.get("bf16 auto")
    for name, seconds in timings.items():
        line = f"{where}: {name:24s} {1e3 * seconds:8.3f} ms {flops / seconds / 1e12:7.1f} TFLOP/s"
        line += f"  x{bf16 / seconds:.2f} bf16" if bf16 else ""
        if name.startswith("fp8 "):
            if reference in outputs:
                line += f"  rel {rel(outputs[name], outputs[reference]):.1e} to {reference}"
            line += f", {rel(outputs[name], outputs['bf16 auto']):.1e} vs bf16" if "bf16 auto" in outputs else ""
        log(line)
    log("done")


if __name__ == "__main__":
    main()
