"""Mosaic GPU (Hopper) flash attention kernels in the FlashAttention-3 style: the design, and the parts
that the forward (`_fwd`) and backward (`_bwd`) kernels are built of.

Every kernel runs three warpgroups per CTA: one memory warpgroup that streams tiles from HBM into a
ring of shared-memory slots with TMA (`feed`), and two compute warpgroups that own 64 rows each,
multiply with `wgmma` from shared memory, and hand each slot back through "consumed" barriers. In
the forward the tensor cores are kept busy during the softmax in one of two ways (`MosaicGpuFlashStatic.overlap`):
the two compute warpgroups ping-pong on a schedule barrier, so one runs its softmax while the
other's matmuls run; or each warpgroup issues tile t's Q·Kᵀ together with tile t-1's P·V and runs
the softmax of tile t while its own P·V is in flight (optionally still taking turns with the other
warpgroup at issuing, `MosaicGpuFlashStatic.overlap_schedule`).

Causal and sliding-window calls visit only the tiles that hold an allowed (query, key) pair; tiles
fully inside the allowed band run without a mask. Both compute warpgroups walk the CTA's whole
range of tiles (each waits on every slot: barrier phases are counted per thread) and merely hand
back the slots outside their own rows' range. A short causal forward may run two query tiles per
CTA (`MosaicGpuFlashStatic.q_tiles_per_cta`), a head's longest and shortest rows through one key/value stream, so
that every CTA does the same work.

Which tiles a CTA streams, and how a partial tile is masked, is its walk (`KeyTiles` for the forward
and dQ, `QueryTiles` for dK/dV): flash attention's walks stream the contiguous runs above; block-sparse
attention (`_pallas/gpu/blocksparse_attention`) runs these same kernels with walks over its block table,
on `[B, H, S, D]` arrays (`MosaicGpuFlashStatic.heads_major`).

Scores live in base-2 units (`q·k · scale · log2 e`) so each exponential is one `exp2`. The forward
writes the log-sum-exp in the same units; the backward kernels take it back (+inf for rows with no
allowed key, so their probabilities are 0).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from ejkernel.kernels._common.attention import LOG2E
from ejkernel.kernels._pallas.gpu.flash_attention._tiling import (
    COMPUTE_WGS,
    CTA_ROWS,
    ROWS,
    MosaicGpuFlashStatic,
    allowed,
    key_ranges,
    query_ranges,
)

SUM_COLS = 16  # width of the unit-column tile whose P·e₀ gives row sums on the tensor cores (32-byte rows)
MASKED = -1e30  # finite, so a row whose tiles are all masked never computes inf - inf
COMPUTE_REGISTERS = 232  # 2 x 128 x 232 + 128 x 40 registers fill the 64K register file
MEMORY_REGISTERS = 40


# 2^f on [-1/2, 1/2] (relative error < 7.5e-5, far under bfloat16 rounding), and 1.5 · 2^23: adding it
# to a float32 of magnitude < 2^22 rounds it to an integer held in the low mantissa bits.
EXP2_POLY = (0.9999281093641528, 0.6932609856052565, 0.24261054228172088, 0.05517132143403896)
ROUND_MAGIC = 12582912.0


def exp2_fma(x, *, in_range: bool = False):
    """2^x for -125 <= x <= 127 on the FMA and integer units instead of the special-function unit (MUFU).

    x = n + f with n = round(x) and |f| <= 1/2: a cubic gives 2^f, and n is added to its exponent
    bits. Below -125 (and for -inf) it gives under 2^-125 rather than 0, a weight no softmax row can
    notice; `in_range=True` (x known to lie within [-125, 127], as bounded soft-capped logits do) drops
    that clamp, one instruction of about nine. (XLA on a CPU
    simplifies `(x + M) - M` to `x`, so this holds only where such rewrites do not run: the kernels,
    or eager CPU ops.)
    """
    if not in_range:
        x = jnp.maximum(x, -126.0)
    shifted = x + ROUND_MAGIC
    frac = x - (shifted - ROUND_MAGIC)
    c0, c1, c2, c3 = EXP2_POLY
    mantissa = ((c3 * frac + c2) * frac + c1) * frac + c0
    whole = lax.shift_left(lax.bitcast_convert_type(shifted, jnp.int32), jnp.int32(23))
    return lax.bitcast_convert_type(lax.bitcast_convert_type(mantissa, jnp.int32) + whole, jnp.float32)


def exp2_tile(x, fma_cols: int, *, in_range: bool = False):
    """2^x of a score tile, its last `fma_cols` columns by `exp2_fma`, so that both kinds of unit share the work."""
    if not fma_cols:
        return jnp.exp2(x)
    split = x.shape[1] - fma_cols
    return jnp.concatenate([jnp.exp2(x[:, :split]), exp2_fma(x[:, split:], in_range=in_range)], axis=1)


def logits2(st: MosaicGpuFlashStatic, qk, q_prescaled: bool = False):
    """Raw `q·k` tile -> (logits in base-2 units, the soft cap's tanh tile or None).

    `q_prescaled`: q was already multiplied by `st.tanh_scale`.
    """
    if st.soft_cap is None:
        return qk * st.scale2, None
    t = jnp.tanh(qk if q_prescaled else qk * st.tanh_scale)
    return t * (st.soft_cap * LOG2E), t


def score_grad(st: MosaicGpuFlashStatic, ds, t):
    """dS with respect to the scaled logits -> with respect to `scale · q·k` (through the soft cap)."""
    return ds if t is None else ds * (1.0 - t * t)


def wgmma_iota(shape, dim):
    return plgpu.broadcasted_iota(jnp.int32, shape, dim, layout=plgpu.Layout.WGMMA)


def along_rows(vector, shape):
    """A per-row vector (WGMMA row layout) broadcast over the tile's columns."""
    return lax.broadcast_in_dim(vector, shape, [0])


def along_cols(vector, shape):
    return lax.broadcast_in_dim(vector, shape, [1])


def zero_acc(shape):
    return plgpu.layout_cast(jnp.zeros(shape, jnp.float32), plgpu.Layout.WGMMA)


# ---- warp specialisation ----


@dataclasses.dataclass(frozen=True)
class Stream:
    """Tiles the memory warpgroup copies step by step into slot `step % stages` of each buffer.

    `copies` pairs `source(step)` (an HBM slice) with its `(stages, ...)` shared-memory buffer; all
    copies of a step complete `ready[slot]` (one arrival per copy). The compute warpgroups arrive on
    `consumed[slot]` (two arrivals) when done with the slot, and only then is it refilled.
    """

    copies: tuple[tuple[Callable[[Any], Any], Any], ...]
    ready: Any
    consumed: Any

    @staticmethod
    def barriers(copies: int, stages: int):
        """Scratch types of `ready` and `consumed`."""
        return (
            plgpu.Barrier(num_arrivals=copies, num_barriers=stages),
            plgpu.Barrier(num_arrivals=COMPUTE_WGS, num_barriers=stages),
        )


def feed(streams: list[Stream], steps, stages: int, start=0, prefetch: int = 0):
    """The memory warpgroup: copies steps 0..steps-1 of every stream into slot `(start + step) % stages`.

    `start` counts the steps fed before (a CTA's earlier query tile): the ring of slots goes on.
    `prefetch > 0`: after step n's copies, step n + prefetch's tiles are fetched into L2
    (`MosaicGpuFlashStatic.prefetch`).
    """

    @pl.loop(0, steps)
    def _(step):
        n = start + step
        slot = lax.rem(n, jnp.int32(stages))
        for s in streams:
            pl.when(n >= stages)(lambda s=s: plgpu.barrier_wait(s.consumed.at[slot]))
            for source, buffers in s.copies:
                plgpu.copy_gmem_to_smem(source(step), buffers.at[slot], s.ready.at[slot])
        if prefetch:

            @pl.when(step + prefetch < steps)
            def _():
                for s in streams:
                    for source, _ in s.copies:
                        plgpu.async_prefetch(source(step + prefetch))


def memory_warpgroup(run):
    """`run()` on the memory warpgroup, which gives its registers to the compute warpgroups."""

    def body():
        plgpu.set_max_registers(MEMORY_REGISTERS, action="decrease")
        run()

    pl.when(lax.axis_index("wg") == COMPUTE_WGS)(body)


class Turns:
    """How the two compute warpgroups order their matmul issues over the `schedule` barrier (one per warpgroup
    when `taking`): `sync` (both arrive, then both wait: the ping-pong's handover), `take` (wait until the other
    warpgroup has issued: the overlapped forward's turn) and `give` (let the other one issue); without `taking`,
    `take` and `give` do nothing."""

    def __init__(self, schedule, wg, taking: bool):
        self.schedule, self.wg, self.taking = schedule, wg, taking

    def sync(self):
        plgpu.barrier_arrive(self.schedule)
        plgpu.barrier_wait(self.schedule)

    def take(self):
        if self.taking:
            plgpu.barrier_wait(self.schedule.at[self.wg])

    def give(self):
        if self.taking:
            plgpu.barrier_arrive(self.schedule.at[1 - self.wg])


def skip_step(streams: list[Stream], slot):
    """A step outside this warpgroup's rows: keep the barrier phases in step, hand the slot back."""
    for s in streams:
        plgpu.barrier_wait(s.ready.at[slot])
        plgpu.barrier_arrive(s.consumed.at[slot])


def run_segments(step_fn, carry, lo, own_lo, full_lo, full_hi, own_hi, hi, masked: bool = True):
    """Runs `step_fn(mode, t, carry)` over the CTA's steps [lo, hi) for one warpgroup.

    Steps outside [own_lo, own_hi) are "skip"; those in [full_lo, full_hi) need no mask ("full");
    the rest are "masked". `masked=False`: the walk knows at trace time that no step needs a mask, so
    every own step is "full" and no masked step is traced.

    (Runs empty at trace time are not traced: a loop of masked steps traced before the full one, even one
    that never runs, once led LLVM to put the forward's new P tile into the registers that the in-flight
    P·V still read, and ptxas then serialised every wgmma of the kernel, C7513. The forward now keeps the
    old P live until P·V completes, and block-sparse walks stream their masked steps last.)
    """
    if masked:
        own = [(own_lo, full_lo, "masked"), (full_lo, full_hi, "full"), (full_hi, own_hi, "masked")]
    else:
        own = [(own_lo, own_hi, "full")]
    runs = [(lo, own_lo, "skip"), *own, (own_hi, hi, "skip")]
    for start, end, mode in runs:
        if isinstance(start, int) and isinstance(end, int) and start >= end:
            continue  # empty at trace time: no loop traced
        carry = lax.fori_loop(start, end, lambda t, c, mode=mode: step_fn(mode, t, c), carry)
    return carry


def own_order(ranges):
    """`(lo, hi, full_lo, full_hi)` of `key_ranges` / `query_ranges` in `run_segments` order."""
    lo, hi, full_lo, full_hi = ranges
    return lo, full_lo, full_hi, hi


def swizzled_smem(shape, dtype):
    """Shared memory in the swizzled layout wgmma and TMA use for 16-bit tiles of 64-element rows."""
    return plgpu.SMEM(shape, dtype, transforms=(plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128)))


def unit_col_smem(rows: int, dtype):
    """The compute warpgroups' `(rows, SUM_COLS)` unit-column tile e₀, a wgmma B operand of 32-byte rows."""
    transforms = (plgpu.TilingTransform((8, SUM_COLS)), plgpu.SwizzleTransform(32))
    return plgpu.SMEM((rows, SUM_COLS), dtype, transforms=transforms)


def launch_kernel(body, out_type, scratch, grid, grid_names, *args):
    return plgpu.kernel(
        body,
        out_type=out_type,
        scratch_types=scratch,
        grid=grid,
        grid_names=grid_names,
        num_threads=COMPUTE_WGS + 1,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(approx_math=True),
    )(*args)


def two_products(a, b, c, d):
    """`a·bᵀ` and `c·dᵀ` of (ROWS, D) shared-memory tiles against (N, D) ones, as float32 (ROWS, N) tiles.

    Issued together, so the second matmul runs while the first finishes.
    """

    def products(refs):
        ab_ref, cd_ref = refs
        plgpu.wgmma(ab_ref, a, b.transpose((1, 0)))
        plgpu.wgmma(cd_ref, c, d.transpose((1, 0)))

    zeros = zero_acc((ROWS, b.shape[0]))
    return pl.run_state(products)((plgpu.ACC.init(zeros), plgpu.ACC.init(zeros)))


def masked_scores(st: MosaicGpuFlashStatic, s, row0, col0, *, transposed: bool = False, fill=MASKED):
    """`s` with the disallowed (query, key) pairs set to `fill`; `transposed` tiles are [key, query].

    `row0`, `col0`: the absolute positions of the tile's first row and column.
    """
    q_axis, k_axis, q0, k0 = (1, 0, col0, row0) if transposed else (0, 1, row0, col0)
    key = wgmma_iota(s.shape, k_axis)
    ok = allowed(st, key - wgmma_iota(s.shape, q_axis), key, q0, k0)
    return s if ok is None else jnp.where(ok, s, fill)


# ---- layouts: [B, S, H, D] (flash attention) or [B, H, S, D] (block-sparse attention) ----


def bshd(st: MosaicGpuFlashStatic, shape) -> tuple[int, int, int, int]:
    """`(batch, seq, heads, dim)` of a q/k/v-like array in the call's layout."""
    return (shape[0], shape[2], shape[1], shape[3]) if st.heads_major else tuple(shape)


def rows_at(st: MosaicGpuFlashStatic, ref, b, rows, h):
    """Rows `rows` (a `pl.ds`) of head h of batch row b of a q/k/v-like ref: a `(rows, D)` tile for TMA."""
    return ref.at[b, h, rows] if st.heads_major else ref.at[b, rows, h]


# ---- which tiles a CTA streams ----


class KeyTiles:
    """The key tiles each query tile of a forward / dQ CTA streams, and how each is masked.

    This one streams, for every query tile, the contiguous run of key tiles that hold an allowed pair
    of its rows (`key_ranges`), and masks by the positional rules (`masked_scores`). Block-sparse
    attention subclasses it to stream the key tiles its block table lists. The kernels index steps
    t in [lo, hi); a warpgroup's "own" steps `own(row0)` split them as in `run_segments`.

    `arrays` are extra kernel operands (appended to the kernel's inputs); `bind` receives their refs
    and the CTA's batch row and head inside the kernel, and returns the walk that the kernel uses.
    """

    arrays: tuple = ()
    masked = True  # some step may need a mask (else `run_segments` traces none)
    copies = 1  # TMA copies that fill one key (value) tile: `streams` makes that many per step
    # a walk whose tiles read their queries from, and write only their own rows into, token rows of `forward`'s
    # `into` at any row (its `tokens(row0)`), through an untiled shared-memory tile per warpgroup
    in_place = False

    def __init__(self, st: MosaicGpuFlashStatic, block: int, num_blocks: int, num_q_tiles: int, tiles_per_cta: int = 1):
        self.st, self.block, self.num_blocks = st, block, num_blocks
        self.num_q_tiles, self.tiles_per_cta = num_q_tiles, tiles_per_cta

    def bind(self, refs, b, h) -> KeyTiles:
        del refs, b, h
        return self

    def row(self, cta, j):
        """First query row of the CTA's j-th query tile (of `tiles_per_cta`, 1 or 2).

        One tile: N-1-cta, so causal calls launch their longest rows first. Two: N-1-cta, then cta, so
        every CTA of a causal call does the same work, and the second tile's first key/value tiles load
        while the first tile finishes.
        """
        last = self.num_q_tiles - 1 - cta
        return (last if self.tiles_per_cta == 1 else jnp.where(j == 0, last, cta)) * CTA_ROWS

    def tile(self, cta, j):
        """`(row, lo, hi, key_row)`: the j-th query tile's first row, its steps [lo, hi), and
        `key_row(i)`, the first key row of step lo + i (the memory warpgroup counts from 0).

        `row` is the tile's first output row, which `own` and `mask` take rows from; `row(cta, j)` is its first
        row of q. They are one here; a walk that reads its queries in place writes them elsewhere
        (`forward`'s `out_rows`)."""
        row = self.row(cta, j)
        lo, hi = cta_key_tiles(self.st, row, self.block, self.num_blocks)
        return row, lo, hi, lambda i: (lo + i) * self.block

    def own(self, row0):
        """`(own_lo, full_lo, full_hi, own_hi)` of the warpgroup whose rows start at `row0`."""
        return own_order(key_ranges(self.st, row0, ROWS, self.block, self.num_blocks))

    def mask(self, s, row0, t, **kwargs):
        """Score tile `s` of step t for the rows from `row0`, disallowed pairs set to `fill`."""
        return masked_scores(self.st, s, row0, t * self.block, **kwargs)

    def live(self):
        """Whether the CTA has query rows to compute (a traced bool), or None: always. A CTA that has none
        leaves its output rows unwritten (a walk over a static bound of tiles, whose caller drops them)."""
        return None

    def streams(self, k_ref, v_ref, smem, barriers, b, h, key_row) -> tuple[Stream, Stream]:
        """The forward's key and value streams (`key_value_streams`; a walk over other layouts, such as
        a paged cache, makes its own, of `copies` copies a step)."""
        return key_value_streams(self.st, k_ref, v_ref, smem, barriers, b, h, key_row, self.block)


class QueryTiles:
    """The query tiles a dK/dV (or fused backward) CTA streams for each query head of its group.

    This one streams, per head, the contiguous run of query tiles that see some of the CTA's keys
    (`query_ranges`): step i of the stream is tile `lo + i % (hi - lo)` of head `i // (hi - lo)`.
    Block-sparse attention subclasses it (its block table's lists, head after head). `span` is what
    a CTA computes once; `head(g)` gives head g's steps [lo, hi), its warpgroup's "own" split
    (`run_segments` order) and the slot of each step.
    """

    arrays: tuple = ()
    masked = True  # as `KeyTiles.masked`

    def __init__(self, st: MosaicGpuFlashStatic, block: int, num_blocks: int):
        self.st, self.block, self.num_blocks = st, block, num_blocks

    def bind(self, refs, b, kv_h) -> QueryTiles:
        del refs, b, kv_h
        return self

    def key_tile(self, cta):
        """The 128-key tile of the CTA launched `cta`-th among its head's."""
        return cta

    def span(self, cta_col):
        """The CTA's query tiles (both warpgroups' needs): `(lo, hi, tiles per head)`."""
        lo = query_ranges(self.st, cta_col, ROWS, self.block, self.num_blocks)[0]
        hi = query_ranges(self.st, cta_col + ROWS, ROWS, self.block, self.num_blocks)[1]
        return lo, hi, jnp.maximum(hi - lo, 1)

    def position(self, span, kv_h, i):
        """Stream step i -> (query head, first query row)."""
        lo, _, per_head = span
        return kv_h * self.st.group + lax.div(i, per_head), (lo + lax.rem(i, per_head)) * self.block

    def total(self, span):
        """Steps the memory warpgroup streams."""
        lo, hi, _ = span
        return self.st.group * (hi - lo)

    def prepare(self, span, col0):
        """What a warpgroup whose keys start at `col0` computes before its loop over heads."""
        del span
        return own_order(query_ranges(self.st, col0, ROWS, self.block, self.num_blocks))

    def head(self, span, own, g):
        """Head g of the group: `(lo, own, hi, slot_of)` for `run_segments` and the slot of step t."""
        lo, hi, _ = span
        return lo, own, hi, lambda t: lax.rem(g * (hi - lo) + t - lo, jnp.int32(self.st.stages_bwd))

    def query_row(self, span, t):
        """First query row of step t."""
        del span
        return t * self.block

    def mask(self, s, col0, span, t):
        """Transposed score tile `s` ([key, query]) of step t for the keys from `col0`; disallowed pairs 0."""
        del span
        return masked_scores(self.st, s, col0, t * self.block, transposed=True, fill=0.0)


@dataclasses.dataclass(frozen=True)
class QueryCta:
    """A CTA of the dQ kernel: 128 query rows of one head, key/value tiles [lo, hi) streamed.

    (The forward places its one or two query tiles itself: `KeyTiles.tile`.)
    """

    batch: Any
    head: Any
    wg: Any
    row: Any  # first query row of the CTA
    lo: Any
    hi: Any
    walk: KeyTiles
    streams: tuple[Stream, Stream]  # key, value


def stream_key_tiles(
    st: MosaicGpuFlashStatic, walk: KeyTiles, walk_refs, k_ref, v_ref, smem, barriers, block: int, stages: int
):
    """Places the CTA (longest causal rows first) and starts its memory warpgroup feeding K/V tiles.

    `smem` are the `(stages, block, D)` key and value buffers, `barriers` their ready/consumed pairs.
    The CTA needs the tiles from its first warpgroup's `lo` to its second's `hi`.
    """
    b, h, wg = lax.axis_index("batch"), lax.axis_index("heads"), lax.axis_index("wg")
    walk = walk.bind(walk_refs, b, h)
    cta_row, lo, hi, key_row = walk.tile(lax.axis_index("q_tiles"), 0)
    streams = key_value_streams(st, k_ref, v_ref, smem, barriers, b, h, key_row, block)
    memory_warpgroup(lambda: feed(list(streams), hi - lo, stages, prefetch=st.prefetch))
    return QueryCta(b, h, wg, cta_row, lo, hi, walk, streams)


def cta_key_tiles(st: MosaicGpuFlashStatic, cta_row, block: int, num_blocks: int):
    """Key tiles `[lo, hi)` a CTA streams for query rows [cta_row, cta_row + CTA_ROWS): both warpgroups' needs."""
    lo = key_ranges(st, cta_row, ROWS, block, num_blocks)[0]
    hi = key_ranges(st, cta_row + ROWS, ROWS, block, num_blocks)[1]
    return lo, hi


def key_value_streams(
    st: MosaicGpuFlashStatic, k_ref, v_ref, smem, barriers, b, h, key_row, block: int
) -> tuple[Stream, Stream]:
    """Query head h's key and value tiles, step i's from key row `key_row(i)` (`smem`, `barriers` as in
    `stream_key_tiles`)."""
    kv_h = lax.div(h, jnp.int32(st.group))

    def tile(ref):
        return lambda i: rows_at(st, ref, b, pl.ds(key_row(i), block), kv_h)

    k_ready, k_consumed, v_ready, v_consumed = barriers
    return (
        Stream(((tile(k_ref), smem[0]),), k_ready, k_consumed),
        Stream(((tile(v_ref), smem[1]),), v_ready, v_consumed),
    )
