"""What every grouped matmul implementation shares: argument checks, the tile schedule, the VJP wiring.

A grouped matmul multiplies the rows of `lhs [M, K]` group by group: rows `[start_g, end_g)` (groups
laid out back to back by `group_sizes`) with `rhs[g] [K, N]`. With `group_offset = o` and an `rhs` of
`L` groups, this call owns groups `o .. o + L - 1` (an expert-parallel shard); every other row is
zeros, and `existing_out`, where given, is added to every row (upstream's rule: owned rows accumulate).

The tile schedule maps groups to `block_m`-row tiles of `lhs` WITHOUT padding each group to a tile:
the work items are the (tile, group) pairs that meet, in tile order. A tile inside one group is one
item; a tile that straddles a group boundary is one item per group, each keeping only its own rows
(the masking costs at most one extra tile per group). Tiles holding no owned row are `fill` items
(group -1) that write zeros, so a kernel that writes whole tiles leaves no row unwritten.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ejkernel.kernels._common.bounds import check_with
from ejkernel.kernels._common.checks import is_traced, require_float, require_int
from ejkernel.kernels._common.grouped_matmul_quantized import (
    PackedGroupWeights,
    ScaledGroupWeights,
    check_fp8_lhs,
    check_quantized_rhs,
    dense_weights,
    fp8_rows,
    frozen_vjp,
    is_quantized,
    packed_weights,
    rows_are_n,
)
from ejkernel.kernels._common.search import sorted_position

# ---- argument checks ----


@dataclasses.dataclass(frozen=True)
class Dims:
    """Sizes of one grouped matmul call."""

    m: int
    k: int
    n: int
    num_groups: int  # groups in group_sizes (all shards)
    num_local: int  # groups of rhs (this call's)


def result_dtype(preferred_element_type) -> jnp.dtype:
    """The output dtype: `preferred_element_type`, float32 when None (as upstream)."""
    return jnp.dtype(jnp.float32 if preferred_element_type is None else preferred_element_type)


def compute_dtype(lhs, rhs) -> jnp.dtype:
    """The dtype both operands are multiplied in: the promotion of two float dtypes (what `jax.lax.ragged_dot`
    does with mixed inputs), lhs's for an integer or 8-bit float (quantized) rhs."""
    if is_quantized(rhs):
        return jnp.dtype(lhs.dtype)
    if jnp.issubdtype(rhs.dtype, jnp.floating) and jnp.dtype(rhs.dtype).itemsize > 1:
        return jnp.promote_types(lhs.dtype, rhs.dtype)
    return jnp.dtype(lhs.dtype)


def check_versions(use_v2: bool, use_v3: bool, rhs_scale=None, rhs_bias=None) -> None:
    """ValueError for both kernel versions at once, or a v3 option without `use_v3`."""
    if use_v2 and use_v3:
        raise ValueError("grouped_matmul: use_v2 and use_v3 are mutually exclusive; got both True")
    if not use_v3:
        for name, x in (("rhs_scale", rhs_scale), ("rhs_bias", rhs_bias)):
            if x is not None:
                raise ValueError(
                    f"grouped_matmul: {name} is a grouped_matmulv3 option: expected use_v3=True, got {use_v3}"
                )


def check_args(
    lhs,
    rhs,
    group_sizes,
    group_offset=None,
    existing_out=None,
    *,
    preferred_element_type=jnp.float32,
    rhs_scale=None,
    rhs_bias=None,
    transpose_rhs: bool = False,
    use_v2: bool = False,
    use_v3: bool = False,
    fp8_lhs: bool = False,
) -> Dims:
    """Checks a call of the public contract (see `grouped_matmul_reference`) and returns its sizes.

    Shapes, ranks and option conflicts raise ValueError, dtypes TypeError; so do bad values of
    `group_sizes` and `group_offset` outside `jit` (under it with `EJKERNEL_CHECKS=1`; else `owned_groups`).
    """
    check_versions(use_v2, use_v3, rhs_scale, rhs_bias)
    if getattr(lhs, "ndim", None) != 2:
        raise ValueError(f"lhs must be [M, K], got shape {getattr(lhs, 'shape', None)}")
    require_float("lhs", lhs)
    m, k = lhs.shape
    if is_quantized(rhs):
        if rhs_scale is not None:
            raise ValueError("rhs_scale scales a float or int8 rhs: a QuantizedArray rhs carries its own scales")
        num_local, n = check_quantized_rhs(rhs, k, transpose_rhs)
    else:
        num_local, n = _check_array_rhs(rhs, k, rhs_scale, transpose_rhs)
    check_fp8_lhs(fp8_lhs, rhs, rhs_scale)
    if num_local == 0:
        raise ValueError(f"rhs must hold at least one group, got {num_local}")
    if getattr(group_sizes, "ndim", None) != 1:
        raise ValueError(f"group_sizes must be [groups], got shape {getattr(group_sizes, 'shape', None)}")
    require_int("group_sizes", group_sizes)
    num_groups = group_sizes.shape[0]
    if num_groups < num_local:
        raise ValueError(f"group_sizes must have at least rhs.shape[0] = {num_local} entries, got {num_groups}")
    if group_offset is not None:
        group_offset = jnp.asarray(group_offset) if isinstance(group_offset, int) else group_offset
        if group_offset.shape not in ((), (1,)):
            raise ValueError(f"group_offset must be a scalar or shape [1], got shape {group_offset.shape}")
        require_int("group_offset", group_offset)
        last = num_groups - num_local
        check_with(
            "group_offset",
            group_offset.reshape(()),
            lambda xp, o: (o >= 0) & (o <= last),
            f"[0, {last}] (rhs holds {num_local} of the {num_groups} groups of group_sizes)",
        )
    elif num_groups != num_local:
        raise ValueError(
            f"group_sizes has {num_groups} groups but rhs holds {num_local}: pass group_offset to say which it holds"
        )
    check_with(
        "group_sizes",
        group_sizes,
        lambda xp, sizes: (sizes >= 0) & (running_ends(xp, sizes, m + 1) <= m),
        f"its range: non-negative sizes that sum to at most lhs.shape[0] = {m}",
    )
    if not jnp.issubdtype(result_dtype(preferred_element_type), jnp.floating):
        raise TypeError(f"preferred_element_type must be a float dtype, got {preferred_element_type}")
    if existing_out is not None:
        if getattr(existing_out, "shape", None) != (m, n):
            raise ValueError(f"existing_out must be [M, N] = [{m}, {n}], got {getattr(existing_out, 'shape', None)}")
        require_float("existing_out", existing_out)
    if rhs_scale is not None:
        require_float("rhs_scale", rhs_scale)
        blocks = rhs_scale.shape[1] if rhs_scale.ndim == 4 else 0
        if rhs_scale.ndim != 4 or rhs_scale.shape[0] != num_local or rhs_scale.shape[2:] != (1, n) or blocks == 0:
            raise ValueError(f"rhs_scale must be [groups={num_local}, blocks, 1, N={n}], got {rhs_scale.shape}")
        if k % blocks:
            raise ValueError(f"rhs_scale's {blocks} blocks must divide K = {k}")
    if rhs_bias is not None:
        require_float("rhs_bias", rhs_bias)
        if rhs_bias.shape != (num_local, 1, n):
            raise ValueError(f"rhs_bias must be [groups={num_local}, 1, N={n}], got {rhs_bias.shape}")
    return Dims(m=m, k=k, n=n, num_groups=num_groups, num_local=num_local)


def _check_array_rhs(rhs, k: int, rhs_scale, transpose_rhs: bool) -> tuple[int, int]:
    """`(L, N)` of an array `rhs` for `lhs [M, k]`, after checking its rank, dtype and K."""
    if getattr(rhs, "ndim", None) != 3:
        layout = "[groups, N, K] (transpose_rhs=True)" if transpose_rhs else "[groups, K, N]"
        raise ValueError(f"rhs must be {layout} or a QuantizedArray, got shape {getattr(rhs, 'shape', None)}")
    integer = jnp.issubdtype(rhs.dtype, jnp.integer)
    if not jnp.issubdtype(rhs.dtype, jnp.floating) and not (integer and rhs_scale is not None):
        raise TypeError(f"rhs must be a float array (or integer with rhs_scale), got dtype {rhs.dtype}")
    n, rhs_k = (rhs.shape[1], rhs.shape[2]) if transpose_rhs else (rhs.shape[2], rhs.shape[1])
    if rhs_k != k:
        where = "rhs.shape[2] (transpose_rhs=True)" if transpose_rhs else "rhs.shape[1]"
        raise ValueError(f"{where} must equal lhs.shape[1] = {k} (the contraction), got {rhs_k}")
    return rhs.shape[0], n


# ---- configs ----


@dataclasses.dataclass(frozen=True)
class TileParams:
    """One product's tiling asked for by a config, in our field names (None: the implementation's default):
    `block_q` rows, `block_k` contraction step, `block_d` columns, `num_warps`, `num_stages`."""

    block_q: int | None = None
    block_k: int | None = None
    block_d: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None


# Our tiling fields, each with the names a `FwdParams` may carry it under (its matmul names `block_m`, `block_n`
# mean rows and columns too) and the flat field of upstream's `GroupedMatmulConfig` that fills it.
_TILE_FIELDS = {
    "block_q": (("block_q", "block_m"), "block_m"),
    "block_k": (("block_k",), "block_k"),
    "block_d": (("block_d", "block_n"), "block_n"),
    "num_warps": (("num_warps",), "num_warps"),
    "num_stages": (("num_stages",), "num_stages"),
}


def _power_of_two_below(value: int) -> int:
    return 1 << (value.bit_length() - 1)


def tile_params(cfg) -> tuple[TileParams | None, TileParams | None]:
    """A config's tilings of the forward product and of both backward products, as `TileParams` (read from
    the config's fields by name: this module imports no config type).

    `fwd_params` / `bwd_params` set their own product's; upstream's flat fields (`cfg.block_m`, `block_n`,
    `block_k`, `num_warps`, `num_stages`) fill what those leave unset, in both, tiles and warps rounded down
    to a power of two. None where nothing is set. ValueError where a flat field contradicts a product's.
    """
    flat = {}
    for ours, (_, name) in _TILE_FIELDS.items():
        value = getattr(cfg, name, None)
        if value is not None:
            flat[ours] = value if ours == "num_stages" else _power_of_two_below(value)
    tilings = []
    for attribute in ("fwd_params", "bwd_params"):
        given = getattr(cfg, attribute, None)
        fields = {}
        for ours, (names, name) in _TILE_FIELDS.items():
            own = next((v for v in (getattr(given, n, None) for n in names) if v is not None), None)
            if own is not None and flat.get(ours, own) != own:
                raise ValueError(
                    f"{type(cfg).__name__}: {name}={getattr(cfg, name)!r} contradicts {attribute}.{ours}={own!r}"
                )
            fields[ours] = own if own is not None else flat.get(ours)
        tilings.append(TileParams(**fields) if any(v is not None for v in fields.values()) else None)
    return tilings[0], tilings[1]


def offset_scalar(group_offset) -> jax.Array:
    """`group_offset` (None, an int, shape () or [1]) as an int32 scalar."""
    if group_offset is None:
        return jnp.int32(0)
    return jnp.asarray(group_offset).reshape(()).astype(jnp.int32)


def running_ends(xp, sizes, cap: int):
    """Where each group ends: running sums of the sizes clamped to >= 0, saturating at `cap` (int32 never
    overflows); `xp` is numpy or jax.numpy."""
    if xp is np:
        return np.minimum(np.cumsum(np.clip(np.asarray(sizes, np.int64), 0, cap)), cap)
    return lax.associative_scan(lambda a, b: jnp.minimum(a + b, cap), jnp.clip(sizes, 0, cap))


def owned_groups(group_sizes, group_offset, num_local: int, m: int) -> tuple[jax.Array, jax.Array]:
    """`(group sizes int32, offset int32 scalar)` in range, the rule under `jit` (checked values pass as
    they are): each size clamped to >= 0 and their running sum to M (the group crossing M ends there, later
    ones are empty); an offset outside `[0, G - L]` owns no rows (every size 0)."""
    sizes, offset = group_sizes.astype(jnp.int32), offset_scalar(group_offset)
    if not is_traced(sizes, offset):
        return sizes, offset
    ends = running_ends(jnp, sizes, m)
    inside = (offset >= 0) & (offset <= sizes.shape[0] - num_local)
    return jnp.where(inside, jnp.diff(ends, prepend=0), 0), jnp.where(inside, offset, 0)


# ---- the tile schedule ----


def local_group_bounds(group_sizes, group_offset, num_local: int, m: int):
    """Row ranges `[starts[l], ends[l])` of the local groups `l = 0 .. num_local - 1` (int32, clamped to M)."""
    sizes = group_sizes.astype(jnp.int32)
    ends = jnp.minimum(jnp.cumsum(sizes), m)
    starts = jnp.concatenate([jnp.zeros((1,), jnp.int32), ends[:-1]])
    local = offset_scalar(group_offset) + jnp.arange(num_local, dtype=jnp.int32)
    return starts[local], ends[local]


def row_groups(group_sizes, group_offset, num_local: int, m: int):
    """Local group of every row of lhs (int32 [M]); -1 for rows this call does not own."""
    starts, ends = local_group_bounds(group_sizes, group_offset, num_local, m)
    rows = jnp.arange(m, dtype=jnp.int32)
    group = jnp.searchsorted(ends, rows, side="right").astype(jnp.int32)
    owned = (rows >= starts[0]) & (rows < ends[-1])
    return jnp.where(owned, jnp.minimum(group, num_local - 1), -1)


def max_work_items(m: int, block_m: int, num_local: int) -> int:
    """Static bound on the work items: every tile once, plus one per boundary between local groups."""
    return -(-m // block_m) + num_local - 1


class WorkItems(NamedTuple):
    """The schedule, int32 arrays of `max_work_items` entries in tile order.

    Item `w` computes `lhs[tile rows] @ rhs[group]` and keeps rows `[row_lo, row_hi)`; it writes rows
    `[write_lo, write_hi)` (its own plus, for the items at either end of the owned rows, the unowned rows
    of their tile, as zeros). `group` is -1 for fill items (no owned row) and for the padding items past
    the schedule's end (which write nothing and repeat the last tile).
    """

    tile: jax.Array
    group: jax.Array
    row_lo: jax.Array
    row_hi: jax.Array
    write_lo: jax.Array
    write_hi: jax.Array


def work_items(group_sizes, group_offset, num_local: int, m: int, block_m: int) -> WorkItems:
    """The tile schedule of one call (plain jnp: runs under jit with traced group sizes)."""
    num_tiles = -(-m // block_m)
    count = max_work_items(m, block_m, num_local)
    starts, ends = local_group_bounds(group_sizes, group_offset, num_local, m)
    owned_lo, owned_hi = starts[0], ends[-1]
    any_owned = owned_hi > owned_lo
    first_tile = starts // block_m
    last_tile = (ends - 1) // block_m
    per_group = jnp.where(ends > starts, last_tile - first_tile + 1, 0)
    group_end = jnp.cumsum(per_group)  # items of group l end here (exclusive), counted from the first group item
    group_begin = group_end - per_group
    num_group_items = group_end[-1]
    lead = jnp.where(any_owned, owned_lo // block_m, num_tiles)  # fill tiles before the owned rows
    tail = jnp.where(any_owned, -(-owned_hi // block_m), num_tiles)  # first fill tile after them

    w = jnp.arange(count, dtype=jnp.int32)
    k = w - lead
    group = sorted_position(group_end, k)
    group = jnp.clip(group, 0, num_local - 1).astype(jnp.int32)
    group_tile = first_tile[group] + (k - group_begin[group])
    tail_tile = tail + (k - num_group_items)
    in_lead = w < lead
    in_groups = (k >= 0) & (k < num_group_items)
    in_tail = (k >= num_group_items) & (tail_tile < num_tiles)
    tile = jnp.where(in_lead, w, jnp.where(in_groups, group_tile, jnp.where(in_tail, tail_tile, num_tiles - 1)))
    tile_lo = tile * block_m
    tile_hi = jnp.minimum(tile_lo + block_m, m)
    row_lo = jnp.where(in_groups, jnp.maximum(starts[group], tile_lo), tile_lo)
    row_hi = jnp.where(in_groups, jnp.minimum(ends[group], tile_hi), tile_lo)
    write_lo = jnp.where(in_groups & (row_lo == owned_lo), tile_lo, row_lo)
    write_hi = jnp.where(in_groups & (row_hi == owned_hi), tile_hi, row_hi)
    fill = in_lead | in_tail
    write_hi = jnp.where(fill, tile_hi, write_hi)
    padding = ~(in_lead | in_groups | in_tail)
    write_lo = jnp.where(padding, tile_hi, write_lo)
    write_hi = jnp.where(padding, tile_hi, write_hi)
    row_lo, row_hi = jnp.where(padding, tile_hi, row_lo), jnp.where(padding, tile_hi, row_hi)
    group = jnp.where(in_groups, group, -1)
    return WorkItems(tile, group, row_lo, row_hi, write_lo, write_hi)


def max_row_spans(m: int, block_m: int, num_local: int, align: int = 1) -> int:
    """Static bound on `row_spans`: the rows before, in and after the local groups are `num_local + 2`
    runs, each of whole spans but its last (and ceil(a) + ceil(b) <= ceil(a + b) + 1); a run after the
    first starts up to `align - 1` rows early."""
    return -(-(m + (align - 1) * (num_local + 1)) // block_m) + num_local + 1


class RowSpans(NamedTuple):
    """A schedule in which no span mixes groups, int32 arrays of `max_row_spans` entries in row order.

    Span `w` multiplies lhs rows `[start, start + block_m)` by its group's rhs and writes rows
    `[write_lo, write_hi)` of the product, all of them its group's; with `group` -1 it writes zeros there
    (rows outside the local groups) or, past the schedule's end, nothing. Spans follow each run of rows
    from its first row, so only a run's last span is partial; one that would pass M starts earlier
    (reading rows it does not write), so that no span reads past M when M >= block_m. (With `row_spans`'
    `align`, a run's spans start at its first row rounded down, and none is moved back from M.)
    """

    start: jax.Array
    group: jax.Array
    write_lo: jax.Array
    write_hi: jax.Array


def row_spans(group_sizes, group_offset, num_local: int, m: int, block_m: int, align: int = 1) -> RowSpans:
    """The span schedule of one call (plain jnp: runs under jit with traced group sizes).

    Unlike `work_items`' tiles, which a group boundary inside a tile makes computed once per group (a
    quarter more work at 64 groups of 512 rows in 128-row tiles), spans waste only each group's partial
    last span: half as much. Whatever reads rows at any offset takes it (the Triton kernel, the XLA loop).
    With `align` > 1 each run's spans start at its first row rounded down to a multiple of `align` (TMA reads
    HBM in 8-row tiles), so that its first span reads up to `align - 1` rows of the run before, which it does
    not write, and no span is moved back from M (reads past M are the kernel's to clip).
    """
    starts, ends = local_group_bounds(group_sizes, group_offset, num_local, m)
    runs_lo = jnp.concatenate([jnp.zeros((1,), jnp.int32), starts, ends[-1:]])
    runs_hi = jnp.concatenate([starts[:1], ends, jnp.full((1,), m, jnp.int32)])
    runs_group = jnp.concatenate(
        [jnp.full((1,), -1, jnp.int32), jnp.arange(num_local, dtype=jnp.int32), jnp.full((1,), -1, jnp.int32)]
    )
    first = runs_lo // align * align  # where a run's first span starts
    per_run = jnp.where(runs_hi > runs_lo, (runs_hi - first + block_m - 1) // block_m, 0)
    run_end = jnp.cumsum(per_run)
    w = jnp.arange(max_row_spans(m, block_m, num_local, align), dtype=jnp.int32)
    run = sorted_position(run_end, w)
    run = jnp.minimum(run, num_local + 1).astype(jnp.int32)
    lo = first[run] + (w - (run_end - per_run)[run]) * block_m
    live = w < run_end[-1]
    write_lo = jnp.where(live, jnp.maximum(lo, runs_lo[run]), m)
    write_hi = jnp.where(live, jnp.minimum(lo + block_m, runs_hi[run]), m)
    start = lo if align > 1 else jnp.clip(lo, 0, max(m - block_m, 0))
    return RowSpans(jnp.where(live, start, 0), jnp.where(live, runs_group[run], -1), write_lo, write_hi)


# ---- v3 options, applied around the core ----


def dequantize(rhs, rhs_scale, transpose_rhs: bool, dtype):
    """`rhs` with each K block of each output column multiplied by its `rhs_scale [G, blocks, 1, N]`, in `dtype`."""
    if rhs_scale is None:
        return rhs.astype(dtype)
    blocks = rhs_scale.shape[1]
    k = rhs.shape[2] if transpose_rhs else rhs.shape[1]
    scale = jnp.repeat(rhs_scale[:, :, 0, :], k // blocks, axis=1)  # [G, K, N]
    if transpose_rhs:
        scale = jnp.swapaxes(scale, 1, 2)
    return (rhs.astype(jnp.float32) * scale.astype(jnp.float32)).astype(dtype)


def add_group_bias(out, rhs_bias, groups):
    """`out [M, N]` plus each owned row's group bias `rhs_bias [G, 1, N]` (`groups`: `row_groups`)."""
    if rhs_bias is None:
        return out
    bias = jnp.where((groups >= 0)[:, None], rhs_bias[jnp.maximum(groups, 0), 0], 0)
    return (out.astype(jnp.float32) + bias.astype(jnp.float32)).astype(out.dtype)


# ---- the differentiable core ----


@dataclasses.dataclass(frozen=True)
class GroupedMatmulStatic:
    """Static part of a core call (hashable): it keys the custom VJP.

    `fwd`, `dlhs` and `drhs` are what the implementation's products take as `tiling=` in the forward and
    in the two backward products (any hashable value: block sizes, warps, precision).
    """

    transpose_rhs: bool
    out_dtype: jnp.dtype
    num_local: int
    fwd: object = None
    dlhs: object = None
    drhs: object = None


def grouped_vjp(gmm, tgmm):
    """The differentiable core `(st, lhs, rhs, group_sizes, group_offset) -> out [M, N]` (zeros on unowned rows).

    `gmm(lhs, rhs, group_sizes, group_offset, transpose_rhs=, out_dtype=, tiling=)` is an implementation's
    forward product and `tgmm(x, y, group_sizes, group_offset, num_local=, out_dtype=, tiling=)` its
    transposed product `[L, Kx, Ny]` (per local group, `x_lᵀ · y_l` over the group's rows). The backward
    is `dlhs = gmm(dout, rhs)` with the other transpose (unowned rows get zeros) and
    `drhs = tgmm(lhs, dout)` (`tgmm(dout, lhs)` for a `[G, N, K]` rhs). The cotangent is cast to the
    inputs' dtype first.
    """

    @functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
    def core(st: GroupedMatmulStatic, lhs, rhs, group_sizes, group_offset):
        return gmm(
            lhs, rhs, group_sizes, group_offset, transpose_rhs=st.transpose_rhs, out_dtype=st.out_dtype, tiling=st.fwd
        )

    def core_fwd(st, lhs, rhs, group_sizes, group_offset):
        return core(st, lhs, rhs, group_sizes, group_offset), (lhs, rhs, group_sizes, group_offset)

    def core_bwd(st, residuals, dout):
        lhs, rhs, group_sizes, group_offset = residuals
        dout = dout.astype(lhs.dtype)
        dlhs = gmm(
            dout,
            rhs,
            group_sizes,
            group_offset,
            transpose_rhs=not st.transpose_rhs,
            out_dtype=lhs.dtype,
            tiling=st.dlhs,
        )
        x, y = (dout, lhs) if st.transpose_rhs else (lhs, dout)
        drhs = tgmm(x, y, group_sizes, group_offset, num_local=st.num_local, out_dtype=rhs.dtype, tiling=st.drhs)
        return dlhs, drhs, None, None

    core.defvjp(core_fwd, core_bwd)
    return core


def implementation(gmm, tgmm, tilings, doc: str, untiled=None, decodes=None, fp8_forward=None):
    """A registered implementation with the public contract, from an implementation's two products.

    `gmm` and `tgmm` are as `grouped_vjp` takes them; `tilings(dims, lhs, cfg=, interpret=, precision=,
    transpose_rhs=, quantized=)` returns their `tiling=` values `(fwd, dlhs, drhs)` for a call (`quantized`:
    quantized weights, unless `fp8_lhs` asks for FP8 products), or raises NotImplementedError for a call the
    implementation does not serve.
    `untiled(lhs, rhs, group_sizes, group_offset, transpose_rhs=, out_dtype=, precision=)`, where given,
    replaces the core (its own derivatives) when `cfg.bypass_xla_tiling` is set. `decodes(weights)`, where
    given, says whether `gmm` takes `PackedGroupWeights` or `ScaledGroupWeights`
    (`_common.grouped_matmul_quantized`) in place of a float rhs, or raises NotImplementedError for weights it
    declines; without it a `QuantizedArray` rhs is declined and v3 scales are applied before the core.
    `fp8_forward(fwd_tiling, weights)`, where given, returns the forward's tiling set to multiply FP8 by FP8 in
    the kernel for `fp8_lhs` (None where it cannot); otherwise lhs is rounded through FP8 first (`fp8_rows`).
    Around the core: the checks, the operands cast to `compute_dtype` (autodiff casts each gradient back to its
    input's dtype), v3 dequantisation and bias, and `existing_out` added to every row.
    """
    core = grouped_vjp(gmm, tgmm)
    frozen = frozen_vjp(gmm, tgmm)

    def grouped_matmul(
        lhs,
        rhs,
        group_sizes,
        group_offset=None,
        existing_out=None,
        *,
        preferred_element_type=jnp.float32,
        rhs_scale=None,
        rhs_bias=None,
        transpose_rhs: bool = False,
        precision=jax.lax.Precision.DEFAULT,
        use_v2: bool = False,
        use_v3: bool = False,
        interpret=None,
        do_padding: bool = True,
        fp8_lhs: bool = False,
        cfg=None,
    ):
        dims = check_args(
            lhs,
            rhs,
            group_sizes,
            group_offset,
            existing_out,
            preferred_element_type=preferred_element_type,
            rhs_scale=rhs_scale,
            rhs_bias=rhs_bias,
            transpose_rhs=transpose_rhs,
            use_v2=use_v2,
            use_v3=use_v3,
            fp8_lhs=fp8_lhs,
        )
        out_dtype = result_dtype(preferred_element_type)
        dtype = compute_dtype(lhs, rhs)
        transpose_rhs, weights = bool(transpose_rhs), None
        if is_quantized(rhs):
            if decodes is None:
                raise NotImplementedError(
                    "grouped_matmul: this platform takes no QuantizedArray rhs (xla and triton do)"
                )
            weights, transpose_rhs = packed_weights(rhs), rows_are_n(rhs, transpose_rhs)
            decodes(weights)
        elif rhs_scale is not None and decodes is not None:
            scaled = ScaledGroupWeights(rhs, rhs_scale, k_first=not transpose_rhs)
            weights = scaled if decodes(scaled) else None
        lhs = lhs.astype(dtype)
        bypass = untiled is not None and getattr(cfg, "bypass_xla_tiling", False)
        if not bypass:
            fwd, *bwd = tilings(
                dims,
                lhs,
                cfg=cfg,
                interpret=interpret,
                precision=precision,
                transpose_rhs=transpose_rhs,
                quantized=weights is not None and not fp8_lhs,
            )
            if fp8_lhs and weights is not None and fp8_forward is not None:
                in_kernel = fp8_forward(fwd, weights)
                if in_kernel is not None:  # the implementation rounds lhs into FP8 codes itself
                    fwd, fp8_lhs = in_kernel, False
            st = GroupedMatmulStatic(transpose_rhs, out_dtype, dims.num_local, fwd, *bwd)
        if fp8_lhs:
            lhs = fp8_rows(lhs, dims.k // rhs_scale.shape[1])
        if isinstance(weights, PackedGroupWeights) and bypass:
            rhs, weights = dense_weights(weights, dtype), None
        elif weights is None:
            rhs = dequantize(rhs, rhs_scale, transpose_rhs, dtype)
        group_sizes, offset = owned_groups(group_sizes, group_offset, dims.num_local, dims.m)
        if min(dims.m, dims.n, dims.k) == 0:
            out = jnp.zeros((dims.m, dims.n), out_dtype)
        elif bypass:
            options = dict(transpose_rhs=transpose_rhs, out_dtype=out_dtype, precision=precision)
            out = untiled(lhs, rhs, group_sizes, None if group_offset is None else offset, **options)
        elif weights is not None:
            out = frozen(st, jnp.dtype(dtype), lhs, weights, group_sizes, offset)
        else:
            out = core(st, lhs, rhs, group_sizes, offset)
        if rhs_bias is not None:
            out = add_group_bias(out, rhs_bias, row_groups(group_sizes, offset, dims.num_local, dims.m))
        return out if existing_out is None else out + existing_out.astype(out_dtype)

    grouped_matmul.__doc__ = doc
    return grouped_matmul
