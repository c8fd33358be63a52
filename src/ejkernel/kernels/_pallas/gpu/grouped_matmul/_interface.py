"""Grouped matmul through Pallas Mosaic GPU kernels (Hopper): the public-contract entry point and its tilings.

The forward is `_kernel.gmm` (wgmma, TMA-pipelined K loop, persistent CTAs over the tile schedule);
the backward is `gmm` again with the other transpose (dlhs) and `_kernel.tgmm` (drhs), wired by
`_common.grouped_matmul.grouped_vjp`. Serves 16-bit lhs/rhs with any M and group layout; declines
(`NotImplementedError`, before anything is traced) other dtypes, `group_offset`, `existing_out`, v3
scales and biases, `QuantizedArray` weights but MXFP4 (below), interpret mode, contraction and output sizes no
tile divides, and devices other than Hopper GPUs, so that automatic selection falls through to the Triton kernels
that serve them.

`fp8_lhs=True` calls with FP8 block-scaled weights (float8_e4m3fn `[L, N, K]` with `transpose_rhs=True` and
v3's `rhs_scale`, scale blocks of a multiple of 128 rows) run the FP8 x FP8 forward (`_fp8.fp8_gmm`, tiles
`GroupedMatmulConfig.mosaic_fp8_tiling`): lhs is rounded to e4m3 per row and scale block first (by the
`_fp8.round_lhs_blocks` kernel, the codes and scales of `fp8_row_blocks` bit for bit; by XLA for scale
blocks wider than 512), then multiplied on FP8 tensor cores. Their weights are frozen: the lhs gradient (and the
scales' gradient) are the 16-bit kernels' products with the weights dequantised in memory. Other FP8
calls are declined (weights `[L, K, N]` among them: FP8 wgmma reads both operands K-major).

`QuantizedArray` weights of 4-bit codes along K (`quantize_array(w, mode=..., axis="row")` of `w [L, K, N]`: packed
rows N) in MXFP4 as gpt-oss ships it or in affine int4 (groups of a multiple of 64), with bfloat16 lhs, run the 4-bit
forward (`_four_bit.four_bit_gmm`: the codes decoded in registers as each step's wgmma A operand, the product computed
transposed), tiles `DEFAULT_FOUR_BIT`; the weights are frozen, and the lhs gradient is the 16-bit `gmm` on the weights
decoded in memory. Other quantized weights are declined (the Triton kernel decodes them).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from ejkernel.kernels._common.attention import decline
from ejkernel.kernels._common.code_bits import as_bytes
from ejkernel.kernels._common.device import is_hopper, num_sms
from ejkernel.kernels._common.grouped_matmul import compute_dtype, dequantize, implementation, tile_params
from ejkernel.kernels._common.grouped_matmul_quantized import (
    dense_weights,
    fp8_row_blocks,
    is_quantized,
    rows_are_n,
)

WHO = "mosaic gpu grouped_matmul"
DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
OUT_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
# (block_m, block_n, block_k, stages) defaults. gmm: output rows, output columns, contraction step.
# tgmm: x columns (the weights' rows), y columns, group rows per step. Stages are cut to fit shared memory.
DEFAULT_FWD = (128, 256, 64, 4)
DEFAULT_DLHS = (128, 256, 64, 4)
DEFAULT_DRHS = (128, 256, 64, 4)
ROW_BLOCKS = (128, 256)  # two compute warpgroups of 64 or 128 rows share a tile
PINGPONG_ROW_BLOCKS = (64, 128)  # one compute warpgroup per tile
ACC_ELEMENTS = 64 * 256  # a warpgroup's float32 accumulator: 128 registers per thread
FP8 = jnp.dtype(jnp.float8_e4m3fn)
# (block_m, block_n, stages, overlap) of the FP8 forward. Stages are cut to fit shared memory; wider tiles than
# 64 x 128 per warpgroup split each step's wgmma into column chunks (`_fp8.in_registers`). Measured on an H200 at
# M 32768, K 4096, N 1536, 64 groups, on spans (the default; `exp/s32_fp8spans.py`, lhs rounded in 0.106 ms):
# 128 x 128, 5 stages 0.625 ms; 128 x 256, 4 stages 0.636, 3 stages 0.691; fixed row tiles 128 x 256, 3 stages
# 0.738 (`exp/s31_fp8gmm.py`, session 31, fixed tiles: 128 x 256, 3 stages 0.832; 128 x 128, 5 stages 0.854).
DEFAULT_FP8 = (128, 128, 5, False)
# (block_m, stages) of the 4-bit forward (128 columns a tile). MXFP4, measured on an H200 at the MoE shape above
# (session 40's calls 3-4, BENCHMARKS.md; bf16 `auto` 0.70-0.72 ms): 256 rows, 4 stages 0.94 ms, 3 stages 0.955;
# 128 rows 1.43. Session 39's kernel (decoded tiles in shared memory as wgmma's B): 256 x 128, 3 stages 0.97-1.07
# ms; 128 x 256 1.28-1.44. Session 42 (steps in pairs, the output in row halves): 256 rows, 5 stages 0.866 ms, 4
# stages 0.875 (int4 g128: 1.003, 1.008; bf16 `auto` 0.73).
DEFAULT_FOUR_BIT = (256, 5)


def _given(params, *names):
    """The first of `names` set in `params` (None if none is)."""
    for name in names:
        value = None if params is None else getattr(params, name, None)
        if value is not None:
            return value
    return None


def _fit(block: int, size: int, smallest: int, what: str) -> int:
    """The largest power of two in [smallest, block] that divides `size`; NotImplementedError if none does."""
    b = block
    while b >= smallest and size % b:
        b //= 2
    if b < smallest:
        raise NotImplementedError(f"{WHO}: {what} = {size} is no multiple of a tile of {smallest} to {block}")
    return b


def _clamp(value: int, lowest: int, highest: int) -> int:
    return min(max(value, lowest), highest)


def plan_tiling(
    params,
    default,
    *,
    rows: int,
    contraction: int,
    cols: int,
    transposed: bool,
    b_nk: bool = False,
    spans: bool = False,
):
    """A product's `MosaicGpuGroupedMatmulTiling` from config params (None fields: `default`), fitted to its sizes.

    `transposed`: the tgmm product, whose rows (`block_m`) tile x's columns and whose contraction runs over
    the group's rows (any length, `block_k` 64 or 128); otherwise gmm, whose rows may be any M.
    `num_warps` says how many warps compute one output tile: 8 (the default), both compute warpgroups
    share it; 4, each warpgroup computes its own tiles (ping-pong). `b_nk`: gmm's rhs tiles are `[N, K]`
    (they take contraction steps of 16 and 32 too; `[K, N]` tiles lower only in steps of 64). `spans`: gmm's
    output tiles follow the groups (`MosaicGpuGroupedMatmulTiling.spans`).
    Knobs outside what the kernels take are brought into it (warps to 4 or 8, tiles into their ranges,
    at least 2 stages); NotImplementedError only for sizes no tile divides.
    """
    from ejkernel.kernels._pallas.gpu.grouped_matmul._kernel import MosaicGpuGroupedMatmulTiling

    pingpong = (_given(params, "num_warps") or 8) <= 4
    row_blocks = PINGPONG_ROW_BLOCKS if pingpong else ROW_BLOCKS
    bm = _clamp(_given(params, "block_q", "block_m") or default[0], *row_blocks)
    if transposed:
        bm = next((b for b in (bm, row_blocks[0]) if rows % b == 0), None)
        if bm is None:
            raise NotImplementedError(f"{WHO}: the weights' gradient needs rows {rows} in multiples of {row_blocks[0]}")
    wg_rows = bm if pingpong else bm // 2
    bn = _given(params, "block_d", "block_n") or (ACC_ELEMENTS if pingpong else default[1])
    bn = _fit(_clamp(bn, 64, ACC_ELEMENTS // wg_rows), cols, 64, "the output columns")  # (the accumulator's registers)
    bk = _given(params, "block_k") or default[2]
    stages = max(_given(params, "num_stages") or default[3], 2)  # one slot loads while one computes
    if transposed:
        bk = _clamp(bk, 64, 128)
    elif b_nk:
        bk = _fit(_clamp(bk, 16, 64), contraction, 16, "the contraction")
    elif contraction % 64:
        raise NotImplementedError(f"{WHO}: [K, N] weights need the contraction ({contraction}) in steps of 64")
    else:
        bk = 64
    return MosaicGpuGroupedMatmulTiling(bm, bn, bk, int(stages), num_sms(), pingpong, spans)


def spans_asked(cfg) -> bool:
    """`cfg.mosaic_spans`, read by name (True without a config, as `GroupedMatmulConfig`'s default)."""
    return bool(getattr(cfg, "mosaic_spans", True))


@dataclasses.dataclass(frozen=True)
class Planned:
    """The three products' tilings, planned by `mosaic_grouped_matmul` (which knows the transpose)."""

    fwd: object
    dlhs: object
    drhs: object


def plan(dims, transpose_rhs: bool, cfg) -> Planned:
    """Tiles of the forward, dlhs and drhs products of a call; NotImplementedError where none fits.
    `cfg.mosaic_spans` sets both gmm products' `spans` (`spans_asked`)."""
    fwd, bwd = tile_params(cfg)
    spans = spans_asked(cfg)
    # drhs is tgmm(lhs, dout) -> [G, K, N], or tgmm(dout, lhs) -> [G, N, K] for a transposed rhs
    drhs_rows, drhs_cols = (dims.n, dims.k) if transpose_rhs else (dims.k, dims.n)
    return Planned(
        plan_tiling(
            fwd,
            DEFAULT_FWD,
            rows=dims.m,
            contraction=dims.k,
            cols=dims.n,
            transposed=False,
            b_nk=transpose_rhs,
            spans=spans,
        ),
        plan_tiling(
            bwd,
            DEFAULT_DLHS,
            rows=dims.m,
            contraction=dims.n,
            cols=dims.k,
            transposed=False,
            b_nk=not transpose_rhs,
            spans=spans,
        ),
        plan_tiling(bwd, DEFAULT_DRHS, rows=drhs_rows, contraction=dims.m, cols=drhs_cols, transposed=True),
    )


def _tilings(dims, lhs, *, cfg, interpret, precision, transpose_rhs, quantized):
    """(`precision` is moot: 16-bit inputs, float32 sums.)"""
    del lhs, interpret, precision, quantized
    planned = plan(dims, transpose_rhs, cfg)
    return planned.fwd, planned.dlhs, planned.drhs


def _gmm(*args, **kwargs):
    from ejkernel.kernels._pallas.gpu.grouped_matmul._kernel import gmm  # loads Mosaic GPU when traced

    return gmm(*args, **kwargs)


def _tgmm(*args, **kwargs):
    from ejkernel.kernels._pallas.gpu.grouped_matmul._kernel import tgmm

    return tgmm(*args, **kwargs)


_core = implementation(
    _gmm,
    _tgmm,
    _tilings,
    """The Mosaic GPU kernels with the public contract (tiles from `cfg` by `plan`).""",
)


def plan_fp8(cfg, n: int):
    """The FP8 forward's `MosaicGpuFp8GroupedMatmulTiling` from `cfg.mosaic_fp8_tiling` (None fields:
    `DEFAULT_FP8`; read by field name), fitted: `block_m` 128 or 256, `block_n` the largest multiple of 64 up
    to the one asked that divides N and, in as few wgmma chunks as the registers need, fits shared memory with
    2 stages beside a 16-bit output tile; the kernel cuts stages (or, for a float32 output, columns) to fit its
    output (`_fp8.fit_smem`; with spans it first stores the output tile in column pieces). `round_in_kernel` and
    `column_blocks` are on unless set False; `spans` left None follows `cfg.mosaic_spans` for 128-row tiles (256-row
    ones run the fixed tiles). NotImplementedError where no tile fits, or for spans of 256 rows."""
    from ejkernel.kernels._pallas.gpu.grouped_matmul._fp8 import MosaicGpuFp8GroupedMatmulTiling, in_registers

    given = getattr(cfg, "mosaic_fp8_tiling", None)
    bm = 256 if (_given(given, "block_m") or DEFAULT_FP8[0]) >= 256 else 128
    overlap = _given(given, "overlap")
    overlap = DEFAULT_FP8[3] if overlap is None else bool(overlap)
    switches = {name: _given(given, name) is not False for name in ("round_in_kernel", "column_blocks")}
    spans = _given(given, "spans")
    # 256-row spans tiles pass the interpreter but hit a misaligned address on an H200 (session 33, the MoE shape):
    # until that is found, spans take 128-row tiles, and 256 rows run the fixed tiles.
    if spans and bm == 256:
        raise NotImplementedError(f"{WHO}: FP8 spans take 128-row tiles, got block_m={bm}")
    switches["spans"] = spans_asked(cfg) and bm == 128 if spans is None else bool(spans)
    stages = max(_given(given, "num_stages") or DEFAULT_FP8[2], 2)
    bn = _clamp(_given(given, "block_n") or DEFAULT_FP8[1], 64, 256) // 64 * 64
    for cols in range(bn, 0, -64):
        tiling = in_registers(MosaicGpuFp8GroupedMatmulTiling(bm, cols, stages, num_sms(), overlap, **switches))
        if n % cols == 0 and tiling is not None and dataclasses.replace(tiling, stages=2).fits(jnp.bfloat16):
            return tiling
    raise NotImplementedError(
        f"{WHO}: no FP8 tile of {bm} rows and a multiple of 64 columns dividing N = {n} fits (overlap={overlap})"
    )


def check_out_dtype(options: dict) -> None:
    """NotImplementedError for an output dtype (`preferred_element_type`) the kernels do not write."""
    out_dtype = jnp.dtype(options.get("preferred_element_type", jnp.float32))
    if out_dtype not in OUT_DTYPES:
        raise NotImplementedError(f"{WHO} writes float32/bfloat16/float16, got {out_dtype}")


def check_served_fp8(lhs, rhs, group_offset, existing_out, options: dict) -> None:
    """NotImplementedError for `fp8_lhs` calls the FP8 forward does not serve (before anything is traced)."""
    rhs_scale = options.get("rhs_scale")
    decline(
        WHO,
        {
            "group_offset": group_offset is not None,
            "existing_out": existing_out is not None,
            "interpret mode": bool(options.get("interpret")),
        },
    )
    if jnp.dtype(rhs.dtype) != FP8 or rhs_scale is None:
        raise NotImplementedError(f"{WHO}: fp8_lhs takes float8_e4m3fn rhs with rhs_scale, got {rhs.dtype}")
    if not options.get("transpose_rhs"):
        raise NotImplementedError(
            f"{WHO}: FP8 wgmma reads the weights K-major: pass them as [G, N, K] with transpose_rhs=True"
            " (w.swapaxes(1, 2), once), got [G, K, N]"
        )
    if jnp.dtype(lhs.dtype) not in DTYPES:
        raise NotImplementedError(f"{WHO}: fp8_lhs takes bfloat16/float16 lhs, got {lhs.dtype}")
    if lhs.ndim == 2 and rhs_scale.ndim == 4:  # (other shapes: the shared checks' errors)
        from ejkernel.kernels._pallas.gpu.grouped_matmul._fp8 import STEP  # (scale blocks hold whole steps)

        k, blocks = lhs.shape[1], rhs_scale.shape[1]
        if blocks == 0 or k % blocks or (k // blocks) % STEP:
            raise NotImplementedError(
                f"{WHO}: fp8_lhs needs scale blocks of a multiple of {STEP} K rows, got K {k} in {blocks} blocks"
            )
    check_out_dtype(options)


def _fp8_tilings(dims, lhs, *, cfg, interpret, precision, transpose_rhs, quantized):
    """The FP8 forward's tiling; the 16-bit kernels' for the backward products (on dequantised weights)."""
    del lhs, interpret, precision, quantized
    fwd = plan_fp8(cfg, dims.n)  # first: its reason names the FP8 tiles
    planned = plan(dims, transpose_rhs, cfg)
    return fwd, planned.dlhs, planned.drhs


def _fp8_forward_gmm(lhs, rhs, group_sizes, group_offset, *, transpose_rhs, out_dtype, tiling):
    """The FP8 forward (`tiling` from `plan_fp8`) or, in the backward,
    the lhs gradient: the 16-bit `gmm` on the weights dequantised in memory."""
    from ejkernel.kernels._pallas.gpu.grouped_matmul._fp8 import (
        MosaicGpuFp8GroupedMatmulTiling,
        fp8_gmm,
        round_lhs_blocks,
        rounding_served,
        step_col_scales,
        step_scales,
    )
    from ejkernel.kernels._pallas.gpu.grouped_matmul._kernel import padded_rows

    if not isinstance(tiling, MosaicGpuFp8GroupedMatmulTiling):
        dense = dequantize(rhs.data, rhs.scale, not rhs.k_first, lhs.dtype)
        return _gmm(
            lhs, dense, group_sizes, group_offset, transpose_rhs=transpose_rhs, out_dtype=out_dtype, tiling=tiling
        )
    m, k = lhs.shape
    row_tiles = -(-m // tiling.block_m) * tiling.block_m
    if tiling.round_in_kernel and rounding_served(k, rhs.block):
        codes, row_scales = round_lhs_blocks(lhs, rhs.block, padded_rows(m, tiling.block_m), row_tiles)
        col_scales = step_col_scales(rhs.scale, rhs.block)
    else:
        codes, lhs_scales = fp8_row_blocks(lhs, rhs.block)
        row_scales, col_scales = step_scales(lhs_scales, rhs.scale, rhs.block, row_tiles)
    return fp8_gmm(
        codes, row_scales, rhs.data, col_scales, group_sizes, group_offset, m=m, out_dtype=out_dtype, tiling=tiling
    )


_fp8_core = implementation(
    _fp8_forward_gmm,
    _tgmm,
    _fp8_tilings,
    """The FP8 x FP8 forward for `fp8_lhs` (tiles from `cfg.mosaic_fp8_tiling` by `plan_fp8`); backward on the
    16-bit kernels.""",
    decodes=lambda weights: True,  # (check_served_fp8 lets only v3 FP8 weights through)
    fp8_forward=lambda fwd, weights: fwd,  # the forward rounds lhs itself
)


def check_served_four_bit(lhs, rhs, group_offset, existing_out, options: dict) -> None:
    """NotImplementedError for `QuantizedArray` calls the 4-bit forward does not serve (before anything is traced)."""
    decline(
        WHO,
        {
            "group_offset": group_offset is not None,
            "existing_out": existing_out is not None,
            "rhs_bias": options.get("rhs_bias") is not None,
            "interpret mode": bool(options.get("interpret")),
            "fp8_lhs": bool(options.get("fp8_lhs")),
        },
    )
    from ejkernel.kernels._pallas.gpu.grouped_matmul._four_bit import BLOCK_N, STEP, unserved

    reason = unserved(rhs.mode, rhs.bits, rhs.group_size)
    if reason:
        raise NotImplementedError(f"{WHO}: of quantized weights {reason}")
    if not rows_are_n(rhs, options.get("transpose_rhs", False)):
        raise NotImplementedError(
            f"{WHO}: 4-bit weights must pack their codes along K (quantize_array(w, axis='row') of w [G, K, N])"
        )
    if jnp.dtype(lhs.dtype) != jnp.bfloat16:
        raise NotImplementedError(f"{WHO}: 4-bit weights take bfloat16 lhs, got {lhs.dtype}")
    if lhs.ndim == 2 and getattr(rhs.data, "ndim", 0) == 3:  # (other shapes: the shared checks' errors)
        k, n = lhs.shape[1], rhs.data.shape[1]
        if k % STEP or n % BLOCK_N:
            raise NotImplementedError(
                f"{WHO}: 4-bit weights need K in steps of {STEP} and N of {BLOCK_N}, got {k}, {n}"
            )
    check_out_dtype(options)


def _four_bit_tilings(dims, lhs, *, cfg, interpret, precision, transpose_rhs, quantized):
    """The 4-bit forward's tiling; the 16-bit kernels' for the backward products (on the decoded weights)."""
    from ejkernel.kernels._pallas.gpu.grouped_matmul._four_bit import MosaicGpuFourBitGroupedMatmulTiling

    del lhs, interpret, precision, quantized
    fwd = MosaicGpuFourBitGroupedMatmulTiling(*DEFAULT_FOUR_BIT, num_sms())
    planned = plan(dims, transpose_rhs, cfg)
    return fwd, planned.dlhs, planned.drhs


def _four_bit_forward_gmm(lhs, rhs, group_sizes, group_offset, *, transpose_rhs, out_dtype, tiling):
    """The 4-bit forward (`tiling` from `_four_bit_tilings`) or, in the backward, the lhs gradient: the 16-bit `gmm`
    on the weights decoded in memory."""
    from ejkernel.kernels._pallas.gpu.grouped_matmul._four_bit import (
        CodeFormat,
        MosaicGpuFourBitGroupedMatmulTiling,
        four_bit_gmm,
    )

    if not isinstance(tiling, MosaicGpuFourBitGroupedMatmulTiling):
        dense = dense_weights(rhs, lhs.dtype)
        return _gmm(
            lhs, dense, group_sizes, group_offset, transpose_rhs=transpose_rhs, out_dtype=out_dtype, tiling=tiling
        )
    fmt = CodeFormat(rhs.params.mode, rhs.params.group_size)
    codes = as_bytes(rhs.data)
    return four_bit_gmm(
        lhs, codes, rhs.scales, rhs.zeros, group_sizes, group_offset, fmt=fmt, out_dtype=out_dtype, tiling=tiling
    )


_four_bit_core = implementation(
    _four_bit_forward_gmm,
    _tgmm,
    _four_bit_tilings,
    """The 4-bit forward for `QuantizedArray` weights (MXFP4, affine int4); backward on the 16-bit kernels.""",
    decodes=lambda weights: True,  # (check_served_four_bit lets only 4-bit weights through)
)


def check_served(lhs, rhs, group_offset, existing_out, options: dict) -> None:
    """NotImplementedError for calls the kernels do not serve (before anything is traced); `options` are
    the call's keyword arguments."""
    decline(
        WHO,
        {
            "group_offset": group_offset is not None,
            "existing_out": existing_out is not None,
            "rhs_scale": options.get("rhs_scale") is not None,
            "rhs_bias": options.get("rhs_bias") is not None,
            "interpret mode": bool(options.get("interpret")),
        },
    )
    for name, x in (("lhs", lhs), ("rhs", rhs)):
        if jnp.dtype(x.dtype) not in DTYPES:
            raise NotImplementedError(f"{WHO} takes bfloat16/float16 {name}, got {x.dtype}")
    if compute_dtype(lhs, rhs) not in DTYPES:  # (bfloat16 with float16 is multiplied in float32)
        raise NotImplementedError(f"{WHO} takes one 16-bit dtype for lhs and rhs, got {lhs.dtype} and {rhs.dtype}")
    check_out_dtype(options)


def _served_core(lhs, rhs, group_sizes, group_offset, existing_out, options: dict):
    """The core serving the call (the FP8 forward's for `fp8_lhs` with FP8 weights, the 4-bit forward's for a
    `QuantizedArray`), after declining what it does not serve."""
    if options.get("fp8_lhs") and not is_quantized(rhs):
        check_served_fp8(lhs, rhs, group_offset, existing_out, options)
        return _fp8_core
    if is_quantized(rhs):
        check_served_four_bit(lhs, rhs, group_offset, existing_out, options)
        return _four_bit_core
    check_served(lhs, rhs, group_offset, existing_out, options)
    return _core


def mosaic_grouped_matmul(lhs, rhs, group_sizes, group_offset=None, existing_out=None, **options):
    """The kernels' differentiable grouped matmul without the device check (lets CPU tests lower it for CUDA)."""
    core = _served_core(lhs, rhs, group_sizes, group_offset, existing_out, options)
    return core(lhs, rhs, group_sizes, group_offset, existing_out, **options)


def grouped_matmul_mosaic_gpu(lhs, rhs, group_sizes, group_offset=None, existing_out=None, **options):
    """Grouped matmul `[M, K] x [G, K, N] -> [M, N]` (semantics: `grouped_matmul_reference`) on a Hopper GPU.

    Tiles from `cfg.fwd_params` (forward) and `cfg.bwd_params` (both backward products), or upstream's
    `cfg.block_m` / `block_n` / `block_k` for all three: `block_q` (or `block_m`) output rows per CTA, 128
    or 256 (64 or 128 with `num_warps=4`: ping-pong); `block_d` (or `block_n`) output columns; `block_k`
    the contraction step (the weights' gradient: group rows per step, 64 or 128); `num_stages`
    shared-memory slots (cut to fit). Tiles are brought into those ranges and shrink to divide the call's
    sizes (`plan_tiling`). Products accumulate in float32, whatever `precision` asks. Raises
    NotImplementedError, before anything is traced, for calls it does not serve (see the module doc).
    """
    core = _served_core(
        lhs, rhs, group_sizes, group_offset, existing_out, options
    )  # first: the reason names the feature
    if not is_hopper():
        raise NotImplementedError(
            f"{WHO} needs a Hopper GPU (compute capability 9.x), not {jax.devices()[0].device_kind}"
        )
    return core(lhs, rhs, group_sizes, group_offset, existing_out, **options)
