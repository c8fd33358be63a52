"""Grouped matmul kernels in Pallas Mosaic GPU (Hopper): the forward product and the transposed product.

Both kernels are persistent and warp-specialised. A launch runs one CTA per SM, and each CTA walks
its share of the output tiles (`cta`, `cta + num_ctas`, ...) with three warpgroups:

- a memory warpgroup streams the operand tiles of every contraction step with TMA into a ring of
  `stages` shared-memory slots; the ring runs on across output tiles, so the next tile's first
  operands load while the compute warpgroups finish the current one;
- two compute warpgroups multiply with `wgmma` straight from the slots (one wgmma in flight while
  the next slot is awaited), hand each slot back through its "consumed" barrier, and write their
  output rows through shared memory with a TMA store (rows past the array's end are clipped by the
  TMA unit). By default (cooperative) they share each output tile, `block_m // 2` rows each; with
  `MosaicGpuGroupedMatmulTiling.pingpong` each computes whole tiles, the CTA's tiles alternating between them: the ring
  hands the tiles' steps out in order, so one warpgroup's epilogue runs while the other multiplies.

`gmm`: output tile = (`block_m` rows of lhs, `block_n` columns); its groups are the items of the
shared tile schedule (`_common.grouped_matmul.work_items`) that fall in the tile. A tile inside one
group runs one K loop; a tile straddling groups runs one K loop per group and merges the rows in the
shared-memory copy of the output tile, each group keeping only its own rows (a cooperative
warpgroup skips the groups that own none of its rows). No group is padded and no store is masked;
rows no group owns are zeros. With `MosaicGpuGroupedMatmulTiling.spans` the row tiles are instead the spans of
`row_spans(align=8)`: each follows one group from its first row rounded down to 8 (TMA reads HBM in 8-row tiles),
runs one K loop, and stores only the rows it owns from an untiled shared-memory tile, in TMA boxes of `rows`,
`rows / 2`, ..., 1 rows (the binary digits of their count), so that a group boundary costs a partial span, not a
second K loop over a whole tile.
The CTA's walk over its units (`ForwardWalk`: the memory warpgroup's feed, the compute warpgroups' stores) is
shared with the FP8 forward (`_fp8.fp8_gmm`), whose copies and K loop differ.

`tgmm`: output tile = (group, `block_m` columns of x, `block_n` columns of y); its K loop walks the
group's rows in `block_k`-row steps from the group's first row rounded down to a multiple of 8 (TMA
reads HBM in 8-row tiles), and zeroes the rows of other groups (first and last step) in x's slot
before multiplying. An empty group writes zeros.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from ejkernel.kernels._common import SMEM_BYTES
from ejkernel.kernels._common.grouped_matmul import local_group_bounds, row_spans, work_items
from ejkernel.kernels._pallas.gpu._stores import store_rows

COMPUTE_WGS = 2
COMPUTE_REGISTERS = 232  # 2 x 128 x 232 + 128 x 40 registers fill the 64K register file
MEMORY_REGISTERS = 40
SMEM_BUDGET = SMEM_BYTES - 1024  # less room for the barriers (8 bytes each)
SPAN_STORE_COLS = 128
"""The most columns of the untiled tile a span's rows are stored from, here and in the FP8 forward; a wider output
tile is stored in pieces (`store_span_rows`). JAX 0.12's Mosaic GPU layout inference finds no layout for a 64 x 256
16-bit untiled tile written from registers (0.11 does; the FP8 forward's lowering hangs), at 128 columns both lower,
at the cost of one wait between the pieces."""


@dataclasses.dataclass(frozen=True)
class MosaicGpuGroupedMatmulTiling:
    """One product's tiles (hashable: it keys the custom VJP).

    `gmm`: `block_m` output rows, `block_n` output columns, `block_k` contraction step. `tgmm`: `block_m`
    columns of x (the output's rows), `block_n` columns of y, `block_k` group rows per step. `stages`:
    shared-memory slots of the operand ring; `num_ctas`: persistent CTAs (the GPU's SM count).
    `pingpong=False`: both compute warpgroups share each output tile, `block_m // 2` rows each;
    `pingpong=True`: each warpgroup computes whole tiles, the CTA's tiles alternating between them, so
    that one warpgroup's epilogue runs while the other's matmuls do. `spans=True` (`gmm` only): the output
    tiles follow each group from its first row (`row_spans`) and store only their own rows, in place of fixed
    row tiles whose straddling groups each run a K loop.
    """

    block_m: int
    block_n: int
    block_k: int
    stages: int
    num_ctas: int
    pingpong: bool = False
    spans: bool = False

    @property
    def wg_rows(self) -> int:
        """Output rows a compute warpgroup holds (a multiple of the 64-row wgmma)."""
        return self.block_m if self.pingpong else self.block_m // COMPUTE_WGS

    def smem_bytes(self, in_dtype, out_dtype) -> int:
        """Shared memory of the operand ring (per slot `(block_m + block_n) x block_k` operands) and of the
        output tiles (one `block_m x block_n` tile per CTA, one per warpgroup with `pingpong`)."""
        operands = (self.block_m + self.block_n) * self.block_k * jnp.dtype(in_dtype).itemsize
        out_tiles = (COMPUTE_WGS if self.pingpong else 1) * self.block_m * self.block_n
        return self.stages * operands + out_tiles * jnp.dtype(out_dtype).itemsize


def fit_smem(t: MosaicGpuGroupedMatmulTiling, in_dtype, out_dtype) -> MosaicGpuGroupedMatmulTiling:
    """`t` cut to fit shared memory: fewer stages down to 3, then narrower output tiles, then 2 stages."""
    for fewest in (min(t.stages, 3), 2):
        bn = t.block_n
        while bn >= min(64, t.block_n):
            for stages in range(t.stages, fewest - 1, -1):
                fitted = dataclasses.replace(t, block_n=bn, stages=stages)
                if fitted.smem_bytes(in_dtype, out_dtype) <= SMEM_BUDGET:
                    return fitted
            bn //= 2
    raise NotImplementedError(f"mosaic gpu grouped_matmul: tiles {t} do not fit shared memory")


@dataclasses.dataclass(frozen=True)
class Ring:
    """The operand ring: slot `step % stages` holds step `step`'s tiles.

    `ready[offset + slot]` completes when a step's copies have landed (one arrival per TMA copy) and
    `consumed[slot]` when its consumers are done (one arrival per consuming warpgroup). With ping-pong
    each compute warpgroup has its own `ready` barriers (`offset = wg * stages`), so that each waits
    only for the phases of its own steps.
    """

    ready: Any
    consumed: Any
    stages: int
    offset: Any = 0

    def slot(self, step):
        return lax.rem(step, jnp.int32(self.stages))

    def ready_at(self, slot):
        return self.ready.at[self.offset + slot]

    def for_wg(self, wg):
        return dataclasses.replace(self, offset=wg * self.stages)

    @staticmethod
    def barriers(t: MosaicGpuGroupedMatmulTiling, copies: int):
        """Scratch types of `ready` and `consumed` for `copies` TMA copies per step."""
        consumers = 1 if t.pingpong else COMPUTE_WGS
        return (
            plgpu.Barrier(num_arrivals=copies, num_barriers=t.stages * (COMPUTE_WGS if t.pingpong else 1)),
            plgpu.Barrier(num_arrivals=consumers, num_barriers=t.stages),
        )


def swizzled(shape, dtype):
    """Shared memory in the tiled, swizzled layout that TMA and wgmma share (swizzle from the minor dim)."""
    itemsize = jnp.dtype(dtype).itemsize
    swizzle = min(128, shape[-1] * itemsize)
    if swizzle not in (32, 64, 128):
        raise NotImplementedError(f"mosaic gpu grouped_matmul: a minor tile dim of {shape[-1]} has no swizzle")
    transforms = (plgpu.TilingTransform((8, swizzle // itemsize)), plgpu.SwizzleTransform(swizzle))
    return plgpu.SMEM(shape, dtype, transforms=transforms)


def wgmma_iota(shape, dim):
    return plgpu.broadcasted_iota(jnp.int32, shape, dim, layout=plgpu.Layout.WGMMA)


def cta_units(num_units: int, num_ctas: int):
    """(this CTA's index, how many of the `num_units` output tiles it runs: cta, cta + num_ctas, ...)."""
    cta = lax.axis_index("cta")
    return cta, lax.div(jnp.int32(num_units - 1) - cta, jnp.int32(num_ctas)) + 1


def feed_step(ring: Ring, step, copies):
    """Memory warpgroup: TMA `copies` `[(source, slot -> buffer)]` into slot `step % stages` once it is free."""
    slot = ring.slot(step)
    pl.when(step >= ring.stages)(lambda: plgpu.barrier_wait(ring.consumed.at[slot]))
    for source, buffer in copies:
        plgpu.copy_gmem_to_smem(source, buffer(slot), ring.ready_at(slot))


def drain(ring: Ring, steps):
    """Memory warpgroup, after its last step: wait for the slots' last consumption too, so that it has
    observed every phase of the `consumed` barriers (nothing on the GPU needs it; interpret mode checks it)."""

    def wait(s, carry):
        plgpu.barrier_wait(ring.consumed.at[ring.slot(s)])
        return carry

    lax.fori_loop(jnp.maximum(steps - ring.stages, 0), steps, wait, None)


def k_loop(ring: Ring, step0, steps, acc_shape, multiply):
    """Compute warpgroup: `sum over s < steps of multiply(acc_ref, s, slot)`, a float32 `acc_shape` tile.

    Step s uses slot `(step0 + s) % stages`; one wgmma stays in flight while the next slot is awaited, and
    each slot is handed back as soon as the wgmma that read it is done. `steps` may be traced (and 0).
    """

    def scope(acc_ref):
        def step(s, carry):
            slot = ring.slot(step0 + s)
            plgpu.barrier_wait(ring.ready_at(slot))
            multiply(acc_ref, s, slot)
            plgpu.wgmma_wait(1)  # the previous step's wgmma is done: its slot may be refilled
            pl.when(s > 0)(lambda: plgpu.barrier_arrive(ring.consumed.at[ring.slot(step0 + s - 1)]))
            return carry

        lax.fori_loop(0, steps, step, None)
        acc = acc_ref[...]  # waits for the last wgmma

        def release_last():
            plgpu.barrier_arrive(ring.consumed.at[ring.slot(step0 + steps - 1)])

        release_last() if isinstance(steps, int) else pl.when(steps > 0)(release_last)
        return acc

    return pl.run_scoped(scope, plgpu.ACC(acc_shape, jnp.float32))


def skip_steps(ring: Ring, step0, steps: int):
    """Compute warpgroup: pass over `steps` slots it has no use for (barrier phases stay in step)."""

    def step(s, carry):
        slot = ring.slot(step0 + s)
        plgpu.barrier_wait(ring.ready_at(slot))
        plgpu.barrier_arrive(ring.consumed.at[slot])
        return carry

    lax.fori_loop(0, steps, step, None)


def launch(body, out_type, scratch, num_ctas: int, *args):
    return plgpu.kernel(
        body,
        out_type=out_type,
        scratch_types=scratch,
        grid=(num_ctas,),
        grid_names=("cta",),
        num_threads=COMPUTE_WGS + 1,
        thread_name="wg",
    )(*args)


def on_memory_warpgroup(fn):
    def body():
        plgpu.set_max_registers(MEMORY_REGISTERS, action="decrease")
        fn()

    pl.when(lax.axis_index("wg") == COMPUTE_WGS)(body)


def on_compute_warpgroups(fn):
    def body():
        plgpu.set_max_registers(COMPUTE_REGISTERS, action="increase")
        fn()

    pl.when(lax.axis_index("wg") < COMPUTE_WGS)(body)


def padded_rows(m: int, block: int) -> int:
    """Rows of `pad_rows` of an array of `m` rows."""
    return max(block, -(-m // 8) * 8)


def pad_rows(x, block: int):
    """`x` with zero rows added up to a multiple of 8 (TMA's tiled view of HBM) and at least one `block`."""
    rows = padded_rows(x.shape[0], block)
    return x if x.shape[0] == rows else jnp.pad(x, ((0, rows - x.shape[0]), (0, 0)))


# ---- the forward product ----


def tile_items(group_sizes, group_offset, num_local: int, m: int, block_m: int):
    """Per `block_m`-row tile of lhs, the groups that own rows of it, from the shared tile schedule.

    Returns `(group, row_lo, row_hi, first, count)`: items `first[t] .. first[t] + count[t] - 1` of the
    first three arrays are tile t's groups and the rows `[row_lo, row_hi)` each keeps. A tile with
    count 0 owns no row (it is written as zeros). The schedule's computing items are contiguous and in
    tile order, so a scatter-add and a cumulative sum place them (no sort, no binary search).
    """
    num_tiles = -(-m // block_m)
    items = work_items(group_sizes, group_offset, num_local, m, block_m)
    computes = items.group >= 0
    key = jnp.where(computes, items.tile, num_tiles)  # the other items land in a dropped last bin
    count = jnp.zeros((num_tiles + 1,), jnp.int32).at[key].add(1)[:num_tiles]
    first = jnp.argmax(computes).astype(jnp.int32) + jnp.cumsum(count) - count
    return items.group, items.row_lo, items.row_hi, first, count


class TileRefs(NamedTuple):
    """The kernel's refs of `tile_items`: per item its group and kept rows, per row tile its first item and count."""

    group: Any
    lo: Any
    hi: Any
    first: Any
    count: Any


def unit_tile(cta, i, num_ctas: int, col_tiles: int):
    """(row tile, column tile) of unit i of this CTA: units `cta, cta + num_ctas, ...`, row tile by row tile
    (the CTAs running at once share the row tile's lhs rows and read different columns of the weights)."""
    u = cta + i * num_ctas
    tile = lax.div(u, jnp.int32(col_tiles))
    return tile, u - tile * col_tiles


def feed_units(ring: Ring, refs: TileRefs, my_units, unit_of, k_steps: int, copies, pingpong: bool):
    """Memory warpgroup of a forward product: for each unit of this CTA, each group of its row tile and each
    of the `k_steps` contraction steps, TMA `copies(tile, col, group, kk)` (`[(source, slot -> buffer)]`) into
    the ring; with `pingpong` the units alternate between the compute warpgroups' `ready` barriers."""

    def unit(i, step):
        tile, col = unit_of(i)
        unit_ring = ring.for_wg(lax.rem(i, COMPUTE_WGS)) if pingpong else ring

        def item(j, step):
            g = refs.group[refs.first[tile] + j]

            def k_step(kk, step):
                feed_step(unit_ring, step, copies(tile, col, g, kk))
                return step + 1

            return lax.fori_loop(0, k_steps, k_step, step)

        return lax.fori_loop(0, refs.count[tile], item, step)

    drain(ring, lax.fori_loop(0, my_units, unit, jnp.int32(0)))


def compute_units(my_units, unit_of, unit_steps, output_tile, pingpong: bool):
    """Compute warpgroup of a forward product: `output_tile(tile, col, step)` for each unit of this CTA whose
    first ring step is `step` (with `pingpong` every other unit; the others' `unit_steps(tile)` only counted)."""
    wg = lax.axis_index("wg")

    def unit(i, step):
        tile, col = unit_of(i)
        if pingpong:
            pl.when(lax.rem(i, COMPUTE_WGS) == wg)(lambda: output_tile(tile, col, step))
        else:
            output_tile(tile, col, step)
        return step + unit_steps(tile)

    lax.fori_loop(0, my_units, unit, jnp.int32(0))
    plgpu.wait_smem_to_gmem(0)


def store_group_rows(ring: Ring, refs: TileRefs, tile, row0, shape, step, k_steps: int, product, out_tile, out_dst):
    """Compute warpgroup: its `shape[0]` rows from `row0` of row tile `tile`, group by group, stored to `out_dst`.

    For each group of the tile that owns some of these rows, `product(step)` (the float32 tile of the group's
    `k_steps` ring steps from `step`) is merged into `out_tile` (shared memory) keeping only the group's own
    rows; groups owning none of them pass over their steps. Rows no group owns are zeros.
    """
    rows = shape[0]
    items = refs.first[tile]
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the previous tile's store has read out_tile

    def item(j, carry):
        step, written = carry
        lo, hi = refs.lo[items + j], refs.hi[items + j]
        mine = (lo < row0 + rows) & (hi > row0)  # the group owns some of this warpgroup's rows

        @pl.when(mine)
        def _():
            acc = product(step)
            row = row0 + wgmma_iota(shape, 0)
            keep = (row >= lo) & (row < hi)
            value = acc.astype(out_tile.dtype)

            @pl.when(~written)  # rows no group owns are zeros
            def _():
                out_tile[...] = jnp.where(keep, value, jnp.zeros_like(value))

            @pl.when(written)  # a later group of a straddling tile: keep the earlier groups' rows
            def _():
                out_tile[...] = jnp.where(keep, value, plgpu.load(out_tile, layout=plgpu.Layout.WGMMA))

        pl.when(~mine)(lambda: skip_steps(ring, step, k_steps))
        return step + k_steps, written | mine

    _, written = lax.fori_loop(0, refs.count[tile], item, (step, jnp.bool_(False)))

    @pl.when(~written)
    def _():
        out_tile[...] = plgpu.layout_cast(jnp.zeros(shape, out_tile.dtype), plgpu.Layout.WGMMA)

    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(out_tile, out_dst)


class SpanRefs(NamedTuple):
    """The kernel's refs of `row_spans` (8-row aligned): per span the first lhs row it reads, its local group
    (-1: no product) and the output rows `[lo, hi)` it writes (zeros where its group is -1)."""

    start: Any
    group: Any
    lo: Any
    hi: Any

    def steps(self, span, k_steps: int):
        """Ring steps of one unit of `span`: a K loop, or none for a span of zeros (or past the schedule)."""
        return jnp.where(self.group[span] >= 0, jnp.int32(k_steps), jnp.int32(0))


def feed_spans(ring: Ring, spans: SpanRefs, my_units, unit_of, k_steps: int, copies, pingpong: bool):
    """Memory warpgroup of a forward product over spans: for each unit of this CTA with a group, its `k_steps`
    contraction steps, TMA `copies(row0, col, group, kk)` into the ring (units alternating as in `feed_units`)."""

    def unit(i, step):
        span, col = unit_of(i)
        unit_ring = ring.for_wg(lax.rem(i, COMPUTE_WGS)) if pingpong else ring
        row0, g = pl.multiple_of(spans.start[span], 8), spans.group[span]

        def k_step(kk, step):
            feed_step(unit_ring, step, copies(row0, col, g, kk))
            return step + 1

        return lax.fori_loop(0, spans.steps(span, k_steps), k_step, step)

    drain(ring, lax.fori_loop(0, my_units, unit, jnp.int32(0)))


def store_span_rows(ring: Ring, spans: SpanRefs, span, row0, shape, step, k_steps: int, product, out_tile, out_dst):
    """Compute warpgroup: its `shape[0]` rows from `row0` of span `span`, stored (only those the span writes) to
    `out_dst(row, rows)` (`shape[1]` columns): `product(step)` (the float32 tile of the span's `k_steps` ring steps
    from `step`), or zeros for a span without a group. A warpgroup holding none of the span's rows passes over its
    steps. An `out_tile` narrower than `shape[1]` (an untiled shared-memory tile; room for another ring slot) takes
    the tile in column pieces of its width, each stored before the next is written."""
    g, lo, hi = spans.group[span], spans.lo[span], spans.hi[span]
    mine = (lo < row0 + shape[0]) & (hi > row0)
    width = out_tile.shape[1]

    def put(piece):
        """`piece(col0)`: the tile's `width` columns from `col0`, written to `out_tile` and stored, piece by piece."""
        for col0 in range(0, shape[1], width):
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the previous stores have read out_tile
            out_tile[...] = piece(col0)
            plgpu.commit_smem()
            dst = out_dst if width == shape[1] else lambda row, rows, c=col0: out_dst(row, rows).at[:, pl.ds(c, width)]
            store_rows(out_tile, dst, row0, lo, hi)

    @pl.when(mine & (g >= 0))
    def _():
        value = product(step).astype(out_tile.dtype)
        put(lambda col0: value if width == shape[1] else value[:, col0 : col0 + width])

    @pl.when(mine & (g < 0))
    def _():
        put(lambda col0: plgpu.layout_cast(jnp.zeros(out_tile.shape, out_tile.dtype), plgpu.Layout.WGMMA))

    pl.when(~mine & (g >= 0))(lambda: skip_steps(ring, step, k_steps))


def forward_schedule(group_sizes, group_offset, num_local: int, m: int, block_m: int, spans: bool):
    """(The arrays of a forward product's row schedule, its row units): the spans of `row_spans` (8-row aligned) with
    `spans`, else the `block_m`-row tiles of `tile_items`."""
    if spans:  # spans start at multiples of 8 rows (TMA reads HBM in 8-row tiles)
        schedule = tuple(row_spans(group_sizes, group_offset, num_local, m, block_m, align=8))
        return schedule, schedule[0].shape[0]
    return tile_items(group_sizes, group_offset, num_local, m, block_m), -(-m // block_m)


@dataclasses.dataclass(frozen=True)
class ForwardWalk:
    """A forward product's CTA over its units (a row tile or span by a column tile), of tiling `t` (`block_m`,
    `block_n`, `wg_rows`, `stages`, `pingpong`, `spans`): `feed` is the memory warpgroup, `compute` a compute
    warpgroup's rows of each unit. The 16-bit and FP8 forwards differ only in their copies and K loops."""

    t: Any
    schedule: Any  # TileRefs, or SpanRefs with `t.spans`
    ring: Ring
    my_units: Any
    unit_of: Any
    k_steps: int

    @staticmethod
    def start(t, schedule_refs, barriers, *, num_units: int, num_ctas: int, col_tiles: int, k_steps: int):
        """This CTA's walk: `schedule_refs` the refs of `forward_schedule`'s arrays, `barriers` the ring's."""
        cta, my_units = cta_units(num_units, num_ctas)
        unit_of = functools.partial(unit_tile, cta, num_ctas=num_ctas, col_tiles=col_tiles)
        schedule = (SpanRefs if t.spans else TileRefs)(*schedule_refs)
        return ForwardWalk(t, schedule, Ring(*barriers, t.stages), my_units, unit_of, k_steps)

    def feed(self, copies):
        """The memory warpgroup: `copies(row0, col, group, kk)` (`[(source, slot -> buffer)]`: lhs rows from `row0`,
        a multiple of 8, the group's column tile `col`, K step `kk`) of every step into the ring."""
        t, args = self.t, (self.ring, self.schedule, self.my_units, self.unit_of, self.k_steps)
        if t.spans:
            on_memory_warpgroup(lambda: feed_spans(*args, copies, t.pingpong))
        else:
            tile_copies = lambda tile, col, g, kk: copies(tile * t.block_m, col, g, kk)
            on_memory_warpgroup(lambda: feed_units(*args, tile_copies, t.pingpong))

    def compute(self, product, out_tile, out_ref):
        """A compute warpgroup: its rows of each of its units, `product(ring, step)` the float32 `[wg_rows, block_n]`
        tile of one K loop from ring step `step` (`ring`: this warpgroup's view of it), stored to `out_ref` through
        its shared-memory `out_tile`."""
        t, k_steps = self.t, self.k_steps
        wg = lax.axis_index("wg")
        ring = self.ring.for_wg(wg) if t.pingpong else self.ring
        rows, bn = t.wg_rows, t.block_n
        half = 0 if t.pingpong else wg * rows  # this warpgroup's first row in the unit
        shape, unit_product = (rows, bn), functools.partial(product, ring)

        if t.spans:
            spans = self.schedule

            def output_span(span, col, step):
                out_dst = lambda row, count: out_ref.at[pl.ds(row, count), pl.ds(col * bn, bn)]
                row0 = spans.start[span] + half
                store_span_rows(ring, spans, span, row0, shape, step, k_steps, unit_product, out_tile, out_dst)

            compute_units(self.my_units, self.unit_of, lambda span: spans.steps(span, k_steps), output_span, t.pingpong)
        else:
            refs = self.schedule

            def output_tile(tile, col, step):
                row0 = tile * t.block_m + half
                out_dst = out_ref.at[pl.ds(row0, rows), pl.ds(col * bn, bn)]
                store_group_rows(ring, refs, tile, row0, shape, step, k_steps, unit_product, out_tile, out_dst)

            unit_steps = lambda tile: refs.count[tile] * k_steps
            compute_units(self.my_units, self.unit_of, unit_steps, output_tile, t.pingpong)


def gmm(lhs, rhs, group_sizes, group_offset, *, transpose_rhs: bool, out_dtype, tiling: MosaicGpuGroupedMatmulTiling):
    """`out [M, N]`: each owned row of `lhs [M, K]` times its group's `rhs` (`[L, K, N]`, or `[L, N, K]`
    with `transpose_rhs`); zeros on every other row. K must be a multiple of `block_k`, N of `block_n`."""
    m, k = lhs.shape
    num_local = rhs.shape[0]
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    t = fit_smem(tiling, lhs.dtype, out_dtype)
    bm, bn, bk, stages, rows = t.block_m, t.block_n, t.block_k, t.stages, t.wg_rows
    if k % bk or n % bn or rows % 64:
        raise ValueError(f"gmm: K={k} and N={n} must be multiples of block_k={bk} and block_n={bn}; block_m={bm}")
    x = pad_rows(lhs, bm)
    col_tiles, k_steps = n // bn, k // bk
    schedule, row_units = forward_schedule(group_sizes, group_offset, num_local, m, bm, t.spans)
    num_units = row_units * col_tiles
    num_ctas = min(t.num_ctas, num_units)
    a_parts = 1 if t.pingpong else COMPUTE_WGS  # lhs tile copies per step: one per warpgroup's rows

    def body(*kernel_refs):
        schedule_refs, (lhs_ref, rhs_ref, out_ref, (a_smem, b_smem, o_smem), barriers) = (
            kernel_refs[: len(schedule)],
            kernel_refs[len(schedule) :],
        )
        walk = ForwardWalk.start(
            t, schedule_refs, barriers, num_units=num_units, num_ctas=num_ctas, col_tiles=col_tiles, k_steps=k_steps
        )

        def copies(row0, col, g, kk):
            """Step kk's copies for the lhs rows from `row0` (a multiple of 8) and group g's column tile `col`."""
            ks, cols = pl.ds(kk * bk, bk), pl.ds(col * bn, bn)
            b_src = rhs_ref.at[g, cols, ks] if transpose_rhs else rhs_ref.at[g, ks, cols]
            a_rows = bm // a_parts
            a_copies = [
                (lhs_ref.at[pl.ds(row0 + p * a_rows, a_rows), ks], lambda slot, p=p: a_smem.at[slot * a_parts + p])
                for p in range(a_parts)
            ]
            return [*a_copies, (b_src, lambda slot: b_smem.at[slot])]

        walk.feed(copies)

        @on_compute_warpgroups
        def _():
            wg = lax.axis_index("wg")

            def multiply(acc_ref, s, slot):
                a = a_smem.at[slot] if t.pingpong else a_smem.at[slot * COMPUTE_WGS + wg]
                b = b_smem.at[slot]
                plgpu.wgmma(acc_ref, a, b.transpose((1, 0)) if transpose_rhs else b)

            product = lambda ring, step: k_loop(ring, step, k_steps, (rows, bn), multiply)
            walk.compute(product, o_smem.at[wg], out_ref)

    b_shape = (bn, bk) if transpose_rhs else (bk, bn)
    # The output tiles of spans are untiled, so that a store may start at any of their rows.
    if t.spans:
        o_type = plgpu.SMEM((COMPUTE_WGS, rows, math.gcd(bn, SPAN_STORE_COLS)), out_dtype)  # (whole pieces)
    else:
        o_type = swizzled((COMPUTE_WGS, rows, bn), out_dtype)
    scratch = (
        (
            swizzled((stages * a_parts, bm // a_parts, bk), lhs.dtype),
            swizzled((stages, *b_shape), rhs.dtype),
            o_type,
        ),
        Ring.barriers(t, a_parts + 1),
    )
    out_rows = m if t.spans else x.shape[0]  # (spans write rows [0, M) only: no rows to cut off)
    out_type = jax.ShapeDtypeStruct((out_rows, n), out_dtype)
    out = launch(body, out_type, scratch, num_ctas, *schedule, x, rhs)
    return out if out.shape[0] == m else out[:m]


# ---- the transposed product (the weights' gradient) ----


def tgmm(x, y, group_sizes, group_offset, *, num_local: int, out_dtype, tiling: MosaicGpuGroupedMatmulTiling):
    """`[L, Kx, Ny]`: per local group l, `x_lᵀ · y_l` over its rows; zeros for an empty group.

    Kx must be a multiple of `block_m`, Ny of `block_n`; `block_k` (rows per step) a multiple of 64.
    """
    m, kx = x.shape
    ny = y.shape[1]
    t = fit_smem(tiling, x.dtype, out_dtype)
    bm, bn, bk, stages, rows = t.block_m, t.block_n, t.block_k, t.stages, t.wg_rows
    if kx % bm or ny % bn or bk % 64 or rows % 64:
        raise ValueError(f"tgmm: Kx={kx}, Ny={ny} must be multiples of block_m={bm}, block_n={bn}; block_k={bk}")
    starts, ends = local_group_bounds(group_sizes, group_offset, num_local, m)
    xp, yp = pad_rows(x, bk), pad_rows(y, bk)
    a_tiles, b_tiles = kx // bm, ny // bn
    per_group = a_tiles * b_tiles
    num_units = num_local * per_group
    num_ctas = min(t.num_ctas, num_units)
    x_parts = 1 if t.pingpong else COMPUTE_WGS  # x tile copies per step: one per warpgroup's columns

    def body(starts_ref, ends_ref, x_ref, y_ref, out_ref, smem, barriers):
        x_smem, y_smem, o_smem = smem
        ring = Ring(*barriers, stages)
        cta, my_units = cta_units(num_units, num_ctas)
        wg = lax.axis_index("wg")

        def unit_of(i):
            """Unit i of this CTA: (group, x column tile, y column tile, group rows [start, end), first row, steps).

            Steps start at the group's first row rounded down to a multiple of 8 (TMA reads HBM in 8-row
            tiles), so the first step may hold rows of the previous group and the last of the next one.
            """
            u = cta + i * num_ctas
            g = lax.div(u, jnp.int32(per_group))
            r = u - g * per_group
            a = lax.div(r, jnp.int32(b_tiles))
            start, end = starts_ref[g], ends_ref[g]
            row0 = lax.div(start, jnp.int32(8)) * 8
            steps = jnp.where(end > start, lax.div(end - row0 + (bk - 1), jnp.int32(bk)), 0)
            return g, a, r - a * b_tiles, start, end, row0, steps

        @on_memory_warpgroup
        def _():
            def unit(i, step):
                _, a, b, _, _, row0, steps = unit_of(i)
                unit_ring = ring.for_wg(lax.rem(i, COMPUTE_WGS)) if t.pingpong else ring

                def k_step(s, step):
                    rows_s = pl.ds(pl.multiple_of(row0 + s * bk, 8), bk)
                    x_cols = bm // x_parts
                    copies = [
                        (
                            x_ref.at[rows_s, pl.ds(a * bm + p * x_cols, x_cols)],
                            lambda slot, p=p: x_smem.at[slot * x_parts + p],
                        )
                        for p in range(x_parts)
                    ]
                    copies.append((y_ref.at[rows_s, pl.ds(b * bn, bn)], lambda slot: y_smem.at[slot]))
                    feed_step(unit_ring, step, copies)
                    return step + 1

                return lax.fori_loop(0, steps, k_step, step)

            drain(ring, lax.fori_loop(0, my_units, unit, jnp.int32(0)))

        @on_compute_warpgroups
        def _():
            out_tile = o_smem.at[wg]
            wg_ring = ring.for_wg(wg) if t.pingpong else ring

            def output_tile(g, a, b, start, end, row0, steps, step):
                def multiply(acc_ref, s, slot):
                    xs = x_smem.at[slot] if t.pingpong else x_smem.at[slot * COMPUTE_WGS + wg]
                    lo, hi = start - row0 - s * bk, end - row0 - s * bk  # the group's rows within the step

                    @pl.when((lo > 0) | (hi < bk))  # zero the other groups' rows (x's suffices)
                    def _():
                        row = wgmma_iota((bk, rows), 0)
                        keep = (row >= lo) & (row < hi)
                        xs[...] = jnp.where(keep, plgpu.load(xs, layout=plgpu.Layout.WGMMA), 0)
                        plgpu.commit_smem()

                    plgpu.wgmma(acc_ref, xs.transpose((1, 0)), y_smem.at[slot])

                acc = k_loop(wg_ring, step, steps, (rows, bn), multiply)
                plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the previous tile's store has read out_tile
                out_tile[...] = acc.astype(out_dtype)
                plgpu.commit_smem()
                col0 = a * bm + (0 if t.pingpong else wg * rows)
                plgpu.copy_smem_to_gmem(out_tile, out_ref.at[g, pl.ds(col0, rows), pl.ds(b * bn, bn)])

            def unit(i, step):
                g, a, b, start, end, row0, steps = unit_of(i)
                args = (g, a, b, start, end, row0, steps, step)
                if t.pingpong:  # every other tile is this warpgroup's; the others' steps only count
                    pl.when(lax.rem(i, COMPUTE_WGS) == wg)(lambda: output_tile(*args))
                else:
                    output_tile(*args)
                return step + steps

            lax.fori_loop(0, my_units, unit, jnp.int32(0))
            plgpu.wait_smem_to_gmem(0)

    scratch = (
        (
            swizzled((stages * x_parts, bk, bm // x_parts), x.dtype),
            swizzled((stages, bk, bn), y.dtype),
            swizzled((COMPUTE_WGS, rows, bn), out_dtype),
        ),
        Ring.barriers(t, x_parts + 1),
    )
    out_type = jax.ShapeDtypeStruct((num_local, kx, ny), out_dtype)
    return launch(body, out_type, scratch, num_ctas, starts, ends, xp, yp)
