"""Grouped matmul through Pallas Mosaic GPU kernels (Hopper): the public-contract entry point and its tilings.

The forward is `_kernel.gmm` (wgmma, TMA-pipelined K loop, persistent CTAs over the tile schedule);
the backward is `gmm` again with the other transpose (dlhs) and `_kernel.tgmm` (drhs), wired by
`_common.grouped_matmul.grouped_vjp`. Serves 16-bit lhs/rhs with any M and group layout; declines
(`NotImplementedError`, before anything is traced) other dtypes, `group_offset`, `existing_out`, v3
scales and biases, `QuantizedArray` weights, interpret mode, contraction and output sizes no tile divides,
and devices other than Hopper GPUs, so that automatic selection falls through to the Triton kernels that
serve them.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from ejkernel.kernels._common.attention import decline
from ejkernel.kernels._common.grouped_matmul import compute_dtype, implementation, tile_params
from ejkernel.kernels._common.grouped_matmul_quantized import is_quantized

WHO = "mosaic gpu grouped_matmul"
DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
OUT_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
DEFAULT_SMS = 132  # H100 SXM and H200: the CTA count of a launch traced off a GPU
# (block_m, block_n, block_k, stages) defaults. gmm: output rows, output columns, contraction step.
# tgmm: x columns (the weights' rows), y columns, group rows per step. Stages are cut to fit shared memory.
DEFAULT_FWD = (128, 256, 64, 4)
DEFAULT_DLHS = (128, 256, 64, 4)
DEFAULT_DRHS = (128, 256, 64, 4)
ROW_BLOCKS = (128, 256)  # two compute warpgroups of 64 or 128 rows share a tile
PINGPONG_ROW_BLOCKS = (64, 128)  # one compute warpgroup per tile
ACC_ELEMENTS = 64 * 256  # a warpgroup's float32 accumulator: 128 registers per thread


def num_sms() -> int:
    device = jax.devices()[0]
    if device.platform == "gpu":
        return int(getattr(device, "core_count", 0) or DEFAULT_SMS)
    return DEFAULT_SMS


def is_hopper() -> bool:
    device = jax.devices()[0]
    return device.platform == "gpu" and str(getattr(device, "compute_capability", "")).startswith("9.")


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


def plan_tiling(params, default, *, rows: int, contraction: int, cols: int, transposed: bool, b_nk: bool = False):
    """A product's `MosaicGpuGroupedMatmulTiling` from config params (None fields: `default`), fitted to its sizes.

    `transposed`: the tgmm product, whose rows (`block_m`) tile x's columns and whose contraction runs over
    the group's rows (any length, `block_k` 64 or 128); otherwise gmm, whose rows may be any M.
    `num_warps` says how many warps compute one output tile: 8 (the default), both compute warpgroups
    share it; 4, each warpgroup computes its own tiles (ping-pong). `b_nk`: gmm's rhs tiles are `[N, K]`
    (they take contraction steps of 16 and 32 too; `[K, N]` tiles lower only in steps of 64).
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
    return MosaicGpuGroupedMatmulTiling(bm, bn, bk, int(stages), num_sms(), pingpong)


@dataclasses.dataclass(frozen=True)
class Planned:
    """The three products' tilings, planned by `mosaic_grouped_matmul` (which knows the transpose)."""

    fwd: object
    dlhs: object
    drhs: object


def plan(dims, transpose_rhs: bool, cfg) -> Planned:
    """Tiles of the forward, dlhs and drhs products of a call; NotImplementedError where none fits."""
    fwd, bwd = tile_params(cfg)
    # drhs is tgmm(lhs, dout) -> [G, K, N], or tgmm(dout, lhs) -> [G, N, K] for a transposed rhs
    drhs_rows, drhs_cols = (dims.n, dims.k) if transpose_rhs else (dims.k, dims.n)
    return Planned(
        plan_tiling(
            fwd, DEFAULT_FWD, rows=dims.m, contraction=dims.k, cols=dims.n, transposed=False, b_nk=transpose_rhs
        ),
        plan_tiling(
            bwd, DEFAULT_DLHS, rows=dims.m, contraction=dims.n, cols=dims.k, transposed=False, b_nk=not transpose_rhs
        ),
        plan_tiling(bwd, DEFAULT_DRHS, rows=drhs_rows, contraction=dims.m, cols=drhs_cols, transposed=True),
    )


def _tilings(dims, lhs, *, cfg, interpret, precision, transpose_rhs):
    """(`precision` is moot: 16-bit inputs, float32 sums.)"""
    del lhs, interpret, precision
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
            "a QuantizedArray rhs": is_quantized(rhs),
        },
    )
    for name, x in (("lhs", lhs), ("rhs", rhs)):
        if jnp.dtype(x.dtype) not in DTYPES:
            raise NotImplementedError(f"{WHO} takes bfloat16/float16 {name}, got {x.dtype}")
    if compute_dtype(lhs, rhs) not in DTYPES:  # (bfloat16 with float16 is multiplied in float32)
        raise NotImplementedError(f"{WHO} takes one 16-bit dtype for lhs and rhs, got {lhs.dtype} and {rhs.dtype}")
    out_dtype = jnp.dtype(options.get("preferred_element_type", jnp.float32))
    if out_dtype not in OUT_DTYPES:
        raise NotImplementedError(f"{WHO} writes float32/bfloat16/float16, got {out_dtype}")


def mosaic_grouped_matmul(lhs, rhs, group_sizes, group_offset=None, existing_out=None, **options):
    """The kernels' differentiable grouped matmul without the device check (lets CPU tests lower it for CUDA)."""
    check_served(lhs, rhs, group_offset, existing_out, options)
    return _core(lhs, rhs, group_sizes, group_offset, existing_out, **options)


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
    check_served(lhs, rhs, group_offset, existing_out, options)  # first: the reason names the feature
    if not is_hopper():
        raise NotImplementedError(
            f"{WHO} needs a Hopper GPU (compute capability 9.x), not {jax.devices()[0].device_kind}"
        )
    return _core(lhs, rhs, group_sizes, group_offset, existing_out, **options)
