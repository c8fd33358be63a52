"""Mosaic GPU (Hopper) flash attention kernels in the FlashAttention-3 style.

Every kernel runs three warpgroups per CTA: one memory warpgroup that streams tiles from HBM into a
ring of shared-memory slots with TMA (`feed`), and two compute warpgroups that own 64 rows each,
multiply with `wgmma` from shared memory, and hand each slot back through "consumed" barriers. In
the forward the tensor cores are kept busy during the softmax in one of two ways (`Static.overlap`):
the two compute warpgroups ping-pong on a schedule barrier, so one runs its softmax while the
other's matmuls run; or each warpgroup issues tile t's Q·Kᵀ together with tile t-1's P·V and runs
the softmax of tile t while its own P·V is in flight (optionally still taking turns with the other
warpgroup at issuing, `Static.overlap_schedule`).

Causal and sliding-window calls visit only the tiles that hold an allowed (query, key) pair; tiles
fully inside the allowed band run without a mask. Both compute warpgroups walk the CTA's whole
range of tiles (each waits on every slot: barrier phases are counted per thread) and merely hand
back the slots outside their own rows' range. A short causal forward may run two query tiles per
CTA (`Static.q_tiles_per_cta`), a head's longest and shortest rows through one key/value stream, so
that every CTA does the same work.

Scores live in base-2 units (`q·k · scale · log2 e`) so each exponential is one `exp2`. The forward
writes the log-sum-exp in the same units; the backward kernels take it back (+inf for rows with no
allowed key, so their probabilities are 0).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from ejkernel.kernels._common.attention import LOG2E, join_sink
from ejkernel.kernels._pallas.gpu.flash_attention._tiling import (
    COMPUTE_WGS,
    CTA_ROWS,
    ROWS,
    Static,
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


def logits2(st: Static, qk, q_prescaled: bool = False):
    """Raw `q·k` tile -> (logits in base-2 units, the soft cap's tanh tile or None).

    `q_prescaled`: q was already multiplied by `st.tanh_scale`.
    """
    if st.soft_cap is None:
        return qk * st.scale2, None
    t = jnp.tanh(qk if q_prescaled else qk * st.tanh_scale)
    return t * (st.soft_cap * LOG2E), t


def score_grad(st: Static, ds, t):
    """dS with respect to the scaled logits -> with respect to `scale · q·k` (through the soft cap)."""
    return ds if t is None else ds * (1.0 - t * t)


def _iota(shape, dim):
    return plgpu.broadcasted_iota(jnp.int32, shape, dim, layout=plgpu.Layout.WGMMA)


def _rows(vector, shape):
    """A per-row vector (WGMMA row layout) broadcast over the tile's columns."""
    return lax.broadcast_in_dim(vector, shape, [0])


def _cols(vector, shape):
    return lax.broadcast_in_dim(vector, shape, [1])


def _zeros(shape):
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


def feed(streams: list[Stream], steps, stages: int, start=0):
    """The memory warpgroup: copies steps 0..steps-1 of every stream into slot `(start + step) % stages`.

    `start` counts the steps fed before (a CTA's earlier query tile): the ring of slots goes on.
    """

    @pl.loop(0, steps)
    def _(step):
        n = start + step
        slot = lax.rem(n, jnp.int32(stages))
        for s in streams:
            pl.when(n >= stages)(lambda s=s: plgpu.barrier_wait(s.consumed.at[slot]))
            for source, buffers in s.copies:
                plgpu.copy_gmem_to_smem(source(step), buffers.at[slot], s.ready.at[slot])


def memory_warpgroup(run):
    """`run()` on the memory warpgroup, which gives its registers to the compute warpgroups."""

    def body():
        plgpu.set_max_registers(MEMORY_REGISTERS, action="decrease")
        run()

    pl.when(lax.axis_index("wg") == COMPUTE_WGS)(body)


def skip_step(streams: list[Stream], slot):
    """A step outside this warpgroup's rows: keep the barrier phases in step, hand the slot back."""
    for s in streams:
        plgpu.barrier_wait(s.ready.at[slot])
        plgpu.barrier_arrive(s.consumed.at[slot])


def run_segments(step_fn, carry, lo, own_lo, full_lo, full_hi, own_hi, hi):
    """Runs `step_fn(mode, t, carry)` over the CTA's steps [lo, hi) for one warpgroup.

    Steps outside [own_lo, own_hi) are "skip"; those in [full_lo, full_hi) need no mask ("full");
    the rest are "masked".
    """
    runs = [
        (lo, own_lo, "skip"),
        (own_lo, full_lo, "masked"),
        (full_lo, full_hi, "full"),
        (full_hi, own_hi, "masked"),
        (own_hi, hi, "skip"),
    ]
    for start, end, mode in runs:
        carry = lax.fori_loop(start, end, lambda t, c, mode=mode: step_fn(mode, t, c), carry)
    return carry


def own_order(ranges):
    """`(lo, hi, full_lo, full_hi)` of `key_ranges` / `query_ranges` in `run_segments` order."""
    lo, hi, full_lo, full_hi = ranges
    return lo, full_lo, full_hi, hi


def _smem(shape, dtype):
    """Shared memory in the swizzled layout wgmma and TMA use for 16-bit tiles of 64-element rows."""
    return plgpu.SMEM(shape, dtype, transforms=(plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128)))


def _unit_col_smem(rows: int, dtype):
    """The compute warpgroups' `(rows, SUM_COLS)` unit-column tile e₀, a wgmma B operand of 32-byte rows."""
    transforms = (plgpu.TilingTransform((8, SUM_COLS)), plgpu.SwizzleTransform(32))
    return plgpu.SMEM((rows, SUM_COLS), dtype, transforms=transforms)


def _launch(body, out_type, scratch, grid, grid_names, *args):
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


def _two_products(a, b, c, d):
    """`a·bᵀ` and `c·dᵀ` of (ROWS, D) shared-memory tiles against (N, D) ones, as float32 (ROWS, N) tiles.

    Issued together, so the second matmul runs while the first finishes.
    """

    def products(refs):
        ab_ref, cd_ref = refs
        plgpu.wgmma(ab_ref, a, b.transpose((1, 0)))
        plgpu.wgmma(cd_ref, c, d.transpose((1, 0)))

    zeros = _zeros((ROWS, b.shape[0]))
    return pl.run_state(products)((plgpu.ACC.init(zeros), plgpu.ACC.init(zeros)))


def _mask(st: Static, s, row0, col0, *, transposed: bool = False, fill=MASKED):
    """`s` with the disallowed (query, key) pairs set to `fill`; `transposed` tiles are [key, query].

    `row0`, `col0`: the absolute positions of the tile's first row and column.
    """
    q_axis, k_axis, q0, k0 = (1, 0, col0, row0) if transposed else (0, 1, row0, col0)
    key = _iota(s.shape, k_axis)
    ok = allowed(st, key - _iota(s.shape, q_axis), key, q0, k0)
    return s if ok is None else jnp.where(ok, s, fill)


@dataclasses.dataclass(frozen=True)
class QueryCta:
    """A CTA of the dQ kernel: 128 query rows of one head, key/value tiles [lo, hi) streamed.

    (The forward places its one or two query tiles itself: `query_tile_row`, `cta_key_tiles`.)
    """

    batch: Any
    head: Any
    wg: Any
    row: Any  # first query row of the CTA
    lo: Any
    hi: Any
    num_blocks: int  # key tiles in the padded key/value arrays
    streams: tuple[Stream, Stream]  # key, value


def stream_key_tiles(st: Static, k_ref, v_ref, smem, barriers, block: int, stages: int, num_q_tiles: int) -> QueryCta:
    """Places the CTA (longest causal rows first) and starts its memory warpgroup feeding K/V tiles.

    `smem` are the `(stages, block, D)` key and value buffers, `barriers` their ready/consumed pairs.
    The CTA needs the tiles from its first warpgroup's `lo` to its second's `hi`.
    """
    b, h, wg = lax.axis_index("batch"), lax.axis_index("heads"), lax.axis_index("wg")
    cta_row = query_tile_row(lax.axis_index("q_tiles"), 0, num_q_tiles, 1)
    num_blocks = k_ref.shape[1] // block
    lo, hi = cta_key_tiles(st, cta_row, block, num_blocks)
    streams = key_value_streams(st, k_ref, v_ref, smem, barriers, b, h, lo, block)
    memory_warpgroup(lambda: feed(list(streams), hi - lo, stages))
    return QueryCta(b, h, wg, cta_row, lo, hi, num_blocks, streams)


def query_tile_row(cta, j, num_q_tiles: int, tiles_per_cta: int):
    """First query row of a CTA's j-th query tile (of `tiles_per_cta`, 1 or 2).

    One tile: N-1-cta, so causal calls launch their longest rows first. Two: N-1-cta, then cta, so
    every CTA of a causal call does the same work, and the second tile's first key/value tiles load
    while the first tile finishes.
    """
    last = num_q_tiles - 1 - cta
    return (last if tiles_per_cta == 1 else jnp.where(j == 0, last, cta)) * CTA_ROWS


def cta_key_tiles(st: Static, cta_row, block: int, num_blocks: int):
    """Key tiles `[lo, hi)` a CTA streams for query rows [cta_row, cta_row + CTA_ROWS): both warpgroups' needs."""
    lo = key_ranges(st, cta_row, ROWS, block, num_blocks)[0]
    hi = key_ranges(st, cta_row + ROWS, ROWS, block, num_blocks)[1]
    return lo, hi


def key_value_streams(st: Static, k_ref, v_ref, smem, barriers, b, h, lo, block: int) -> tuple[Stream, Stream]:
    """Query head h's key and value tiles from tile `lo` on (`smem`, `barriers` as in `stream_key_tiles`)."""
    kv_h = lax.div(h, jnp.int32(st.group))

    def tile(ref):
        return lambda i: ref.at[b, pl.ds((lo + i) * block, block), kv_h]

    k_ready, k_consumed, v_ready, v_consumed = barriers
    return (
        Stream(((tile(k_ref), smem[0]),), k_ready, k_consumed),
        Stream(((tile(v_ref), smem[1]),), v_ready, v_consumed),
    )


# ---- forward ----


def forward(st: Static, q, k, v, sinks=None):
    """`q [B, Sq, H, D]`, `k, v [B, Sk, Hkv, D]` (padded) -> `out [B, Sq, H, D]`, `lse [B, H, Sq]` (base 2).

    `sinks`: optional `[H]` float32 sink logit per head (natural units), one more softmax column
    without a value: it joins each row's denominator and log-sum-exp when the row is written.
    """
    batch, q_pad_len, heads, head_dim = q.shape
    bk, stages, dtype = st.block_k, st.stages, q.dtype
    num_q_tiles, num_blocks = q_pad_len // CTA_ROWS, k.shape[1] // bk
    tiles = st.q_tiles_per_cta
    if num_q_tiles % tiles:
        raise ValueError(f"q_tiles_per_cta={tiles} needs a multiple of it in query tiles, got {num_q_tiles}")
    has_sinks = sinks is not None
    row_sums = st.row_sums_on_tc
    if row_sums and st.overlap:
        raise ValueError("row_sums_on_tc: the overlapped forward keeps its row sums as a vector")

    def body(q_ref, k_ref, v_ref, *refs):
        sink_ref = refs[0] if has_sinks else None
        unit_col_ref = refs[has_sinks] if row_sums else None
        out_ref, lse_ref, smem, barriers = refs[has_sinks + row_sums :]
        q_smem, k_smem, v_smem, lse_smem, *unit_col = smem
        unit_col_smem = unit_col[0] if row_sums else None
        q_ready, k_ready, k_consumed, v_ready, v_consumed, schedule, *unit_col_ready = barriers
        b, h, wg, cta = (lax.axis_index(a) for a in ("batch", "heads", "wg", "q_tiles"))

        def query_tile(j):
            """The CTA's j-th query tile: its first row, its key tiles [lo, hi) and their K/V streams."""
            row = query_tile_row(cta, j, num_q_tiles, tiles)
            lo, hi = cta_key_tiles(st, row, bk, num_blocks)
            streams = key_value_streams(st, k_ref, v_ref, (k_smem, v_smem), barriers[1:5], b, h, lo, bk)
            return row, lo, hi, list(streams)

        def over_tiles(fn):
            """`start = fn(j, start)` for each query tile j; `start` counts the key tiles streamed before."""
            return fn(0, 0) if tiles == 1 else lax.fori_loop(0, tiles, fn, jnp.int32(0))

        def feed_tile(j, start):
            _, lo, hi, streams = query_tile(j)
            feed(streams, hi - lo, stages, start)
            return start + hi - lo

        def feed_all():
            if row_sums:  # e₀ first: the compute warpgroups need it for their first P·V
                plgpu.copy_gmem_to_smem(unit_col_ref, unit_col_smem, unit_col_ready[0])
            over_tiles(feed_tile)

        memory_warpgroup(feed_all)

        def schedule_sync():
            plgpu.barrier_arrive(schedule)
            plgpu.barrier_wait(schedule)

        def take_turn():
            """Overlapped forward: wait until the other warpgroup has issued its matmuls (`schedule` = turns)."""
            if st.overlap_schedule:
                plgpu.barrier_wait(schedule.at[wg])

        def pass_turn():
            if st.overlap_schedule:
                plgpu.barrier_arrive(schedule.at[1 - wg])

        @pl.when(wg < COMPUTE_WGS)
        def _():
            plgpu.set_max_registers(COMPUTE_REGISTERS, action="increase")
            for j in range(tiles):  # every query tile at once: the later ones load while the first runs
                rows = pl.ds(query_tile_row(cta, j, num_q_tiles, tiles) + wg * ROWS, ROWS)
                plgpu.copy_gmem_to_smem(q_ref.at[b, rows, h], q_smem.at[j * COMPUTE_WGS + wg], q_ready.at[wg])
            if has_sinks:  # this head's sink in every row, base 2, through the first lse buffer
                plgpu.copy_gmem_to_smem(sink_ref.at[h], lse_smem.at[wg], q_ready.at[wg])
            plgpu.barrier_wait(q_ready.at[wg])
            if row_sums:
                plgpu.barrier_wait(unit_col_ready[0])
            if has_sinks:
                sink = plgpu.load(lse_smem.at[wg], layout=plgpu.Layout.WGMMA.reduce(1))
            if st.q_prescaled:
                for j in range(tiles):
                    qj = q_smem.at[j * COMPUTE_WGS + wg]
                    qj[...] = (qj[...].astype(jnp.float32) * st.tanh_scale).astype(dtype)
                plgpu.commit_smem()
            if st.overlap and st.overlap_schedule:  # warpgroup 0 issues first (once: turns run on across tiles)
                pl.when(wg == 1)(lambda: plgpu.barrier_arrive(schedule.at[0]))

            def run_tile(j, start):
                """Query tile j of the CTA, whose key tiles follow the `start` streamed before."""
                cta_row, lo, hi, streams = query_tile(j)
                row0 = cta_row + wg * ROWS
                # (buffers indexed by tile and warpgroup in one traced index: a literal one fails inside run_state)
                qo, lse_out = q_smem.at[j * COMPUTE_WGS + wg], lse_smem.at[j * COMPUTE_WGS + wg]

                def softmax(mode, t, s, m, denom):
                    """Raw scores of key tile t -> (bf16 P, new row max, new denominator, rescale of the old rows)."""
                    if st.bounded:  # logits within ±cap·log2(e): offset 0 for every row, nothing to rescale
                        p = exp2_tile(logits2(st, s, st.q_prescaled)[0], st.exp2_fma_cols, in_range=True)
                        p = _mask(st, p, row0, t * bk, fill=0.0) if mode == "masked" else p
                        return p.astype(dtype), m, denom if row_sums else denom + p.sum(axis=1), None
                    if not st.fused_scale:
                        s = logits2(st, s)[0]
                        s = _mask(st, s, row0, t * bk) if mode == "masked" else s
                        m_new = jnp.maximum(m, s.max(axis=1))
                        p = exp2_tile(s - _rows(m_new, s.shape), st.exp2_fma_cols)
                    else:  # scale inside the exponent (a max commutes with a positive scale): one FMA per score
                        s = _mask(st, s, row0, t * bk, fill=MASKED / st.scale2) if mode == "masked" else s
                        m_new = jnp.maximum(m, s.max(axis=1) * st.scale2)
                        p = exp2_tile(s * st.scale2 - _rows(m_new, s.shape), st.exp2_fma_cols)
                    alpha = jnp.exp2(m - m_new)
                    if row_sums:  # the caller rescales the row sums tile with the accumulator
                        return p.astype(dtype), m_new, denom, alpha
                    return p.astype(dtype), m_new, denom * alpha + p.sum(axis=1), alpha

                def rescale(acc, alpha):
                    return acc if alpha is None else acc * _rows(alpha, acc.shape)

                def slot_of(t):
                    """The shared-memory slot that holds key/value tile t."""
                    return lax.rem(start + t - lo, jnp.int32(stages))

                def scores(slot, before=lambda: None, after=schedule_sync):
                    """S = Q·K_slotᵀ, synchronised with the other warpgroup around issuing it.

                    Ping-pong (the default `after`): the other warpgroup's softmax runs while this matmul does.
                    """

                    def qk(acc_ref):
                        before()
                        plgpu.wgmma(acc_ref, qo, k_smem.at[slot].transpose((1, 0)))
                        after()
                        return acc_ref[...]

                    return pl.run_scoped(qk, plgpu.ACC((ROWS, bk), jnp.float32))

                def add_pv(acc, p16, slot, denom):
                    """(acc + P·V_slot, denom), and with `row_sums` denom is a tile of row sums that adds P·e₀.

                    (The caller has waited for V_slot.)
                    """

                    def pv(refs):
                        plgpu.wgmma(refs[0], p16, v_smem.at[slot])
                        if row_sums:
                            plgpu.wgmma(refs[1], p16, unit_col_smem)

                    state = (plgpu.ACC.init(acc), plgpu.ACC.init(denom)) if row_sums else (plgpu.ACC.init(acc),)
                    acc, *sums = pl.run_state(pv)(state)
                    plgpu.barrier_arrive(v_consumed.at[slot])
                    return acc, sums[0] if row_sums else denom

                def step(mode, t, carry):
                    """Tile t: S, softmax (while the other warpgroup's matmuls run), then P·V."""
                    slot = slot_of(t)
                    if mode == "skip":
                        skip_step(streams, slot)
                        schedule_sync()
                        schedule_sync()
                        return carry
                    acc, m, denom = carry
                    plgpu.barrier_wait(k_ready.at[slot])
                    s = scores(slot)
                    plgpu.barrier_arrive(k_consumed.at[slot])
                    p16, m, denom, alpha = softmax(mode, t, s, m, denom)
                    acc = rescale(acc, alpha)
                    denom = rescale(denom, alpha) if row_sums else denom
                    acc, denom, m, p16 = lax.optimization_barrier((acc, denom, m, p16))
                    plgpu.barrier_arrive(schedule)  # softmax done: the other warpgroup's QK may start
                    plgpu.barrier_wait(v_ready.at[slot])
                    plgpu.barrier_wait(schedule)
                    acc, denom = add_pv(acc, p16, slot, denom)
                    return acc, m, denom

                def overlapped_step(mode, t, carry):
                    """Tile t's S and tile t-1's P·V issued together; S's softmax runs while P·V does."""
                    acc, m, denom, p16 = carry
                    slot, prev = slot_of(t), slot_of(t - 1)
                    plgpu.barrier_wait(k_ready.at[slot])
                    plgpu.barrier_wait(v_ready.at[prev])

                    def matmuls(refs):
                        s_ref, acc_ref, p_ref, m_ref, denom_ref, alpha_ref = refs
                        take_turn()
                        plgpu.wgmma(s_ref, qo, k_smem.at[slot].transpose((1, 0)))
                        plgpu.wgmma(acc_ref, p16, v_smem.at[prev])
                        pass_turn()
                        # S is done; P·V may still run, except beside a mask (whose index tiles need its registers)
                        s = plgpu.wgmma_accumulator_load(s_ref, wait_n=0 if mode == "masked" else 1)
                        plgpu.barrier_arrive(k_consumed.at[slot])
                        p_ref[...], m_ref[...], denom_ref[...], alpha_ref[...] = softmax(mode, t, s, m, denom)

                    # (never `bounded`, which has no alpha: the overlapped forward runs without soft cap;
                    # the alpha slot starts as a copy of m, which has its shape and layout)
                    state = (plgpu.ACC.init(_zeros((ROWS, bk))), plgpu.ACC.init(acc), p16, m, denom, m)
                    _, acc, p16, m_new, denom, alpha = pl.run_state(matmuls)(state)
                    plgpu.barrier_arrive(v_consumed.at[prev])
                    return rescale(acc, alpha), m_new, denom, p16

                m0 = 0.0 if st.bounded else MASKED
                m = plgpu.layout_cast(jnp.full((ROWS,), m0, jnp.float32), plgpu.Layout.WGMMA.reduce(1))
                if row_sums:  # column 0 of the P·e₀ tile holds the row sums, the others 0
                    denom = _zeros((ROWS, SUM_COLS))
                else:
                    denom = plgpu.layout_cast(jnp.zeros((ROWS,), jnp.float32), plgpu.Layout.WGMMA.reduce(1))
                acc = _zeros((ROWS, head_dim))
                own = own_order(key_ranges(st, row0, ROWS, bk, num_blocks))

                def write(acc, m, denom):
                    """Normalised rows into `qo`, their log-sum-exp into shared memory (for the TMA store)."""
                    if row_sums:
                        denom = denom.sum(axis=1)  # (column 0 plus zeros: exact)
                    weight = 1.0  # of the rows' 2^(logit - m) against the final denominator
                    if has_sinks:  # a row with no allowed key but a finite sink: output 0, lse = the sink
                        m, weight, denom = join_sink(m, denom, sink, jnp.exp2)
                    empty = (denom == 0.0) if st.bounded else (m < MASKED / 2)  # no allowed key: output 0, lse -inf
                    denom = jnp.where(empty, 1.0, denom)
                    inv = jnp.where(empty, 0.0, weight / denom)
                    qo[...] = (acc * _rows(inv, acc.shape)).astype(dtype)
                    lse_out[...] = jnp.where(empty, -jnp.inf, m + jnp.log(denom) * LOG2E)

                if not st.overlap:
                    pl.when(wg == 1)(schedule_sync)
                    write(*run_segments(step, (acc, m, denom), lo, *own, hi))
                    pl.when(wg == 0)(schedule_sync)
                else:
                    own_lo, full_lo, full_hi, own_hi = own

                    def skip(t, _):
                        # Turn first: the other warpgroup's matching turn may hold the slot this waits for.
                        take_turn()
                        pass_turn()
                        skip_step(streams, slot_of(t))

                    lax.fori_loop(lo, own_lo, skip, None)

                    @pl.when(own_lo < own_hi)
                    def _():
                        first = slot_of(own_lo)
                        plgpu.barrier_wait(k_ready.at[first])
                        s = scores(first, take_turn, pass_turn)
                        plgpu.barrier_arrive(k_consumed.at[first])
                        p16, m1, denom1, _ = softmax("masked", own_lo, s, m, denom)  # (acc is 0: no rescale)
                        t1 = own_lo + 1
                        clip = lambda t: jnp.clip(t, t1, own_hi)
                        carry = (acc, m1, denom1, p16)
                        acc1, m1, denom1, p16 = run_segments(
                            overlapped_step, carry, t1, t1, clip(full_lo), clip(full_hi), own_hi, own_hi
                        )
                        last = slot_of(own_hi - 1)
                        plgpu.barrier_wait(v_ready.at[last])
                        acc1, denom1 = add_pv(acc1, p16, last, denom1)
                        write(acc1, m1, denom1)

                    pl.when(own_lo >= own_hi)(lambda: write(acc, m, denom))
                    lax.fori_loop(own_hi, hi, skip, None)

                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(qo, out_ref.at[b, pl.ds(row0, ROWS), h])
                plgpu.copy_smem_to_gmem(lse_out, lse_ref.at[b, h, pl.ds(row0, ROWS)])
                return start + hi - lo

            over_tiles(run_tile)
            plgpu.wait_smem_to_gmem(0)

    scratch = (
        (
            _smem((tiles * COMPUTE_WGS, ROWS, head_dim), dtype),
            _smem((stages, bk, head_dim), dtype),
            _smem((stages, bk, head_dim), dtype),
            plgpu.SMEM((tiles * COMPUTE_WGS, ROWS), jnp.float32),
            *((_unit_col_smem(bk, dtype),) if row_sums else ()),
        ),
        (
            # a warpgroup's q tiles (and sink)
            plgpu.Barrier(num_arrivals=tiles + has_sinks, num_barriers=COMPUTE_WGS),
            *Stream.barriers(1, stages),
            *Stream.barriers(1, stages),
            # ping-pong: a rendezvous of both warpgroups; overlapped: one "your turn" barrier per warpgroup
            plgpu.Barrier(num_barriers=COMPUTE_WGS) if st.overlap else plgpu.Barrier(num_arrivals=COMPUTE_WGS),
            *((plgpu.Barrier(),) if row_sums else ()),  # e₀, fed once by the memory warpgroup
        ),
    )
    out_type = (q, jax.ShapeDtypeStruct((batch, heads, q_pad_len), jnp.float32))
    args = (q, k, v) + ((jnp.broadcast_to((sinks * LOG2E)[:, None], (heads, ROWS)),) if has_sinks else ())
    args += (jnp.zeros((bk, SUM_COLS), dtype).at[:, 0].set(1),) if row_sums else ()
    grid = (heads, num_q_tiles // tiles, batch)
    return _launch(body, out_type, scratch, grid, ("heads", "q_tiles", "batch"), *args)


# ---- backward ----


def backward_dq(st: Static, q, k, v, do, lse, delta):
    """dQ: per CTA 128 query rows (two warpgroups); key/value tiles streamed as in the forward.

    `lse` (base 2, +inf for rows with no allowed key) and `delta = rowsum(dO · O)` are `[B, H, Sq]`.
    """
    batch, q_pad_len, heads, head_dim = q.shape
    bk, stages, dtype = st.block_k_dq, st.stages_bwd, q.dtype
    num_q_tiles = q_pad_len // CTA_ROWS

    def body(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, smem, barriers):
        q_smem, do_smem, lse_smem, delta_smem, k_smem, v_smem = smem
        row_ready, k_ready, k_consumed, v_ready, v_consumed = barriers
        cta = stream_key_tiles(st, k_ref, v_ref, (k_smem, v_smem), barriers[1:], bk, stages, num_q_tiles)
        b, h, wg, lo, hi, streams = cta.batch, cta.head, cta.wg, cta.lo, cta.hi, list(cta.streams)

        @pl.when(wg < COMPUTE_WGS)
        def _():
            plgpu.set_max_registers(COMPUTE_REGISTERS, action="increase")
            row0 = cta.row + wg * ROWS
            qs, dos = q_smem.at[wg], do_smem.at[wg]
            rows_at, vec_at = (b, pl.ds(row0, ROWS), h), (b, h, pl.ds(row0, ROWS))
            for src, dst in (
                (q_ref.at[rows_at], qs),
                (do_ref.at[rows_at], dos),
                (lse_ref.at[vec_at], lse_smem.at[wg]),
                (delta_ref.at[vec_at], delta_smem.at[wg]),
            ):
                plgpu.copy_gmem_to_smem(src, dst, row_ready.at[wg])
            plgpu.barrier_wait(row_ready.at[wg])
            lse_w = plgpu.load(lse_smem.at[wg], layout=plgpu.Layout.WGMMA.reduce(1))
            delta_w = plgpu.load(delta_smem.at[wg], layout=plgpu.Layout.WGMMA.reduce(1))

            def step(mode, t, dq):
                slot = lax.rem(t - lo, jnp.int32(stages))
                if mode == "skip":
                    skip_step(streams, slot)
                    return dq
                plgpu.barrier_wait(k_ready.at[slot])
                plgpu.barrier_wait(v_ready.at[slot])

                s, dp = _two_products(qs, k_smem.at[slot], dos, v_smem.at[slot])
                plgpu.barrier_arrive(v_consumed.at[slot])
                s, tanh = logits2(st, s)
                p = jnp.exp2(s - _rows(lse_w, s.shape))
                if mode == "masked":
                    p = _mask(st, p, row0, t * bk, fill=0.0)
                ds = score_grad(st, p * (dp - _rows(delta_w, dp.shape)), tanh).astype(dtype)

                def dq_mma(acc_ref):
                    plgpu.wgmma(acc_ref, ds, k_smem.at[slot])

                dq = pl.run_state(dq_mma)(plgpu.ACC.init(dq))
                plgpu.barrier_arrive(k_consumed.at[slot])
                return dq

            own = key_ranges(st, row0, ROWS, bk, cta.num_blocks)
            dq = run_segments(step, _zeros((ROWS, head_dim)), lo, *own_order(own), hi)
            qs[...] = (dq * st.softmax_scale).astype(dtype)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(qs, dq_ref.at[rows_at])
            plgpu.wait_smem_to_gmem(0)

    scratch = (
        (
            _smem((COMPUTE_WGS, ROWS, head_dim), dtype),
            _smem((COMPUTE_WGS, ROWS, head_dim), dtype),
            plgpu.SMEM((COMPUTE_WGS, ROWS), jnp.float32),
            plgpu.SMEM((COMPUTE_WGS, ROWS), jnp.float32),
            _smem((stages, bk, head_dim), dtype),
            _smem((stages, bk, head_dim), dtype),
        ),
        (
            plgpu.Barrier(num_arrivals=4, num_barriers=COMPUTE_WGS),
            *Stream.barriers(1, stages),
            *Stream.barriers(1, stages),
        ),
    )
    grid, names = (heads, num_q_tiles, batch), ("heads", "q_tiles", "batch")
    return _launch(body, q, scratch, grid, names, q, k, v, do, lse, delta)


@dataclasses.dataclass(frozen=True)
class KeyCta:
    """A CTA of the dK/dV and fused backward kernels: 128 key rows of one key/value head (64 per
    compute warpgroup); the query tiles [lo, hi) of every query head of the group are streamed."""

    batch: Any
    kv_head: Any
    col0: Any  # first key row of this warpgroup
    keys: Any  # this warpgroup's (ROWS, D) key and value tiles in shared memory
    values: Any
    lo: Any
    hi: Any
    num_blocks: int  # query tiles in the padded query array
    streams: tuple[Stream, Stream]  # query; output gradient with log-sum-exp and delta


def _key_cta_scratch(st: Static, bq: int, head_dim: int, dtype, *extra_smem):
    """Shared memory and barriers of a `KeyCta` kernel; `extra_smem` follows the common buffers."""
    stages = st.stages_bwd
    smem = (
        _smem((COMPUTE_WGS, ROWS, head_dim), dtype),
        _smem((COMPUTE_WGS, ROWS, head_dim), dtype),
        _smem((stages, bq, head_dim), dtype),
        _smem((stages, bq, head_dim), dtype),
        plgpu.SMEM((stages, bq), jnp.float32),
        plgpu.SMEM((stages, bq), jnp.float32),
        *extra_smem,
    )
    barriers = (
        plgpu.Barrier(num_arrivals=2, num_barriers=COMPUTE_WGS),
        *Stream.barriers(1, stages),
        *Stream.barriers(3, stages),
    )
    return smem, barriers


def stream_query_tiles(st: Static, q_ref, do_ref, lse_ref, delta_ref, smem, barriers) -> KeyCta:
    """Places the CTA and starts its memory warpgroup feeding the group's query-side tiles.

    `smem` and `barriers` are laid out by `_key_cta_scratch`. Grouped-query heads are streamed one
    after another, so their gradients are summed in registers, never through a per-head copy.
    """
    k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem = smem[:6]
    _, q_ready, q_consumed, do_ready, do_consumed = barriers
    bq, group = st.block_q_dkv, st.group
    b, kv_h, wg = lax.axis_index("batch"), lax.axis_index("kv_heads"), lax.axis_index("wg")
    cta_col = lax.axis_index("kv_tiles") * CTA_ROWS
    num_blocks = q_ref.shape[1] // bq
    lo = query_ranges(st, cta_col, ROWS, bq, num_blocks)[0]
    hi = query_ranges(st, cta_col + ROWS, ROWS, bq, num_blocks)[1]
    per_head = jnp.maximum(hi - lo, 1)

    def position(i):
        """Stream step -> (query head, first query row)."""
        return kv_h * group + lax.div(i, per_head), (lo + lax.rem(i, per_head)) * bq

    def rows_of(ref):
        def source(i):
            head, row = position(i)
            return ref.at[b, pl.ds(row, bq), head]

        return source

    def vec_of(ref):
        def source(i):
            head, row = position(i)
            return ref.at[b, head, pl.ds(row, bq)]

        return source

    streams = (
        Stream(((rows_of(q_ref), q_smem),), q_ready, q_consumed),
        Stream(
            ((rows_of(do_ref), do_smem), (vec_of(lse_ref), lse_smem), (vec_of(delta_ref), delta_smem)),
            do_ready,
            do_consumed,
        ),
    )
    memory_warpgroup(lambda: feed(list(streams), group * (hi - lo), st.stages_bwd))
    return KeyCta(b, kv_h, cta_col + wg * ROWS, k_smem.at[wg], v_smem.at[wg], lo, hi, num_blocks, streams)


def key_gradients(st: Static, cta: KeyCta, k_ref, v_ref, dk_ref, dv_ref, kv_ready, step):
    """The compute warpgroups of a `KeyCta`: dK and dV of their 64 keys, summed over the group's heads.

    `step(g, mode, t, slot, (dk, dv))` handles query tile `t` of query head `g` of the group, whose
    tiles wait in `slot`; it hands the slot back (`consumed`) and returns the new `(dk, dv)`.
    """
    plgpu.set_max_registers(COMPUTE_REGISTERS, action="increase")
    wg = lax.axis_index("wg")
    rows_at = (cta.batch, pl.ds(cta.col0, ROWS), cta.kv_head)
    plgpu.copy_gmem_to_smem(k_ref.at[rows_at], cta.keys, kv_ready.at[wg])
    plgpu.copy_gmem_to_smem(v_ref.at[rows_at], cta.values, kv_ready.at[wg])
    plgpu.barrier_wait(kv_ready.at[wg])
    own = own_order(query_ranges(st, cta.col0, ROWS, st.block_q_dkv, cta.num_blocks))

    def head(g, carry):
        def one(mode, t, carry):
            slot = lax.rem(g * (cta.hi - cta.lo) + t - cta.lo, jnp.int32(st.stages_bwd))
            if mode == "skip":
                skip_step(list(cta.streams), slot)
                return carry
            for s in cta.streams:
                plgpu.barrier_wait(s.ready.at[slot])
            return step(g, mode, t, slot, carry)

        return run_segments(one, carry, cta.lo, *own, cta.hi)

    zeros = _zeros((ROWS, k_ref.shape[-1]))
    dk, dv = lax.fori_loop(0, st.group, head, (zeros, zeros))
    cta.keys[...] = (dk * st.softmax_scale).astype(k_ref.dtype)
    cta.values[...] = dv.astype(v_ref.dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(cta.keys, dk_ref.at[rows_at])
    plgpu.copy_smem_to_gmem(cta.values, dv_ref.at[rows_at])
    plgpu.wait_smem_to_gmem(0)


def _launch_key_ctas(body, scratch, q, k, v, do, lse, delta, *refs):
    """Launches `body` on one `KeyCta` per 128 key rows of each key/value head; outputs dK and dV."""
    batch, kv_pad_len, kv_heads = k.shape[:3]
    grid, names = (kv_heads, kv_pad_len // CTA_ROWS, batch), ("kv_heads", "kv_tiles", "batch")
    return _launch(body, (k, v), scratch, grid, names, q, k, v, do, lse, delta, *refs)


def _query_tile_inputs(cta: KeyCta, slot):
    """This step's log-sum-exp and delta, laid out along the columns of a [key, query] tile."""
    stream = cta.streams[1]
    lse_smem, delta_smem = stream.copies[1][1], stream.copies[2][1]
    layout = plgpu.Layout.WGMMA.reduce(0)
    return plgpu.load(lse_smem.at[slot], layout=layout), plgpu.load(delta_smem.at[slot], layout=layout)


def backward_dkv(st: Static, q, k, v, do, lse, delta):
    """dK, dV: per CTA 128 key rows (two warpgroups) of one key/value head."""
    bq, dtype = st.block_q_dkv, q.dtype

    def body(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref, smem, barriers):
        cta = stream_query_tiles(st, q_ref, do_ref, lse_ref, delta_ref, smem, barriers)
        q_smem, do_smem = smem[2], smem[3]
        (q_stream, do_stream), ks, vs = cta.streams, cta.keys, cta.values

        def step(g, mode, t, slot, carry):
            dk, dv = carry

            def scores_t(acc_ref):
                plgpu.wgmma(acc_ref, ks, q_smem.at[slot].transpose((1, 0)))
                return acc_ref[...]

            s_t = pl.run_scoped(scores_t, plgpu.ACC((ROWS, bq), jnp.float32))
            lse_t, delta_t = _query_tile_inputs(cta, slot)
            s_t, tanh_t = logits2(st, s_t)
            p_t = jnp.exp2(s_t - _cols(lse_t, s_t.shape))
            if mode == "masked":
                p_t = _mask(st, p_t, cta.col0, t * bq, transposed=True, fill=0.0)

            def dv_and_dp(refs):
                dv_ref, dp_ref = refs
                plgpu.wgmma(dv_ref, p_t.astype(dtype), do_smem.at[slot])
                plgpu.wgmma(dp_ref, vs, do_smem.at[slot].transpose((1, 0)))

            dv, dp_t = pl.run_state(dv_and_dp)((plgpu.ACC.init(dv), plgpu.ACC.init(_zeros((ROWS, bq)))))
            plgpu.barrier_arrive(do_stream.consumed.at[slot])
            ds_t = score_grad(st, p_t * (dp_t - _cols(delta_t, dp_t.shape)), tanh_t).astype(dtype)

            def dk_mma(acc_ref):
                plgpu.wgmma(acc_ref, ds_t, q_smem.at[slot])

            dk = pl.run_state(dk_mma)(plgpu.ACC.init(dk))
            plgpu.barrier_arrive(q_stream.consumed.at[slot])
            return dk, dv

        pl.when(lax.axis_index("wg") < COMPUTE_WGS)(
            lambda: key_gradients(st, cta, k_ref, v_ref, dk_ref, dv_ref, barriers[0], step)
        )

    scratch = _key_cta_scratch(st, bq, q.shape[-1], dtype)
    return _launch_key_ctas(body, scratch, q, k, v, do, lse, delta)


def _smem_f32(shape):
    """Shared memory for float32 tiles of 32-element (128-byte) rows, swizzled like `_smem`'s 16-bit tiles."""
    return plgpu.SMEM(shape, jnp.float32, transforms=(plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(128)))


def backward_fused(st: Static, q, k, v, do, lse, delta):
    """dQ, dK and dV in one pass over the (query tile, key tile) pairs; returns float32 dQ (unscaled), dK, dV.

    CTAs as in `backward_dkv`. Each step also multiplies its warpgroup's dS tile, written to shared
    memory, by the warpgroup's keys and adds that share of dQ into a float32 dQ in HBM with a TMA
    reduction: five matmuls per tile pair instead of the seven of the two-kernel backward.
    """
    bq, head_dim, dtype = st.block_q_dkv, q.shape[-1], q.dtype
    dq_acc = jax.new_ref(jnp.zeros(q.shape, jnp.float32))

    def body(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, dk_ref, dv_ref, smem, barriers):
        cta = stream_query_tiles(st, q_ref, do_ref, lse_ref, delta_ref, smem, barriers)
        q_smem, do_smem, ds_smem, dq_smem = smem[2], smem[3], smem[6], smem[7]
        (q_stream, do_stream), ks, vs = cta.streams, cta.keys, cta.values
        wg = lax.axis_index("wg")
        dss, dqs = ds_smem.at[wg], dq_smem.at[wg]

        def step(g, mode, t, slot, carry):
            dk, dv = carry

            s_t, dp_t = _two_products(ks, q_smem.at[slot], vs, do_smem.at[slot])
            lse_t, delta_t = _query_tile_inputs(cta, slot)
            s_t, tanh_t = logits2(st, s_t)
            p_t = jnp.exp2(s_t - _cols(lse_t, s_t.shape))
            if mode == "masked":
                p_t = _mask(st, p_t, cta.col0, t * bq, transposed=True, fill=0.0)
            ds_t = score_grad(st, p_t * (dp_t - _cols(delta_t, dp_t.shape)), tanh_t).astype(dtype)
            dss[...] = ds_t
            plgpu.commit_smem()

            def dv_dk(refs):
                dv_ref, dk_ref = refs
                plgpu.wgmma(dv_ref, p_t.astype(dtype), do_smem.at[slot])
                plgpu.wgmma(dk_ref, ds_t, q_smem.at[slot])

            dv, dk = pl.run_state(dv_dk)((plgpu.ACC.init(dv), plgpu.ACC.init(dk)))
            plgpu.barrier_arrive(do_stream.consumed.at[slot])
            plgpu.barrier_arrive(q_stream.consumed.at[slot])

            def dq_share(acc_ref):  # dS [query, key] of this warpgroup's keys · K
                plgpu.wgmma(acc_ref, dss.transpose((1, 0)), ks)

            dq = pl.run_state(dq_share)(plgpu.ACC.init(_zeros((bq, head_dim))))
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the last share has left `dqs`
            dqs[...] = dq
            plgpu.commit_smem()
            dst = dq_ref.at[cta.batch, pl.ds(t * bq, bq), cta.kv_head * st.group + g]
            plgpu.copy_smem_to_gmem(dqs, dst, reduction_op="add")
            return dk, dv

        pl.when(wg < COMPUTE_WGS)(lambda: key_gradients(st, cta, k_ref, v_ref, dk_ref, dv_ref, barriers[0], step))

    scratch = _key_cta_scratch(
        st, bq, head_dim, dtype, _smem((COMPUTE_WGS, ROWS, bq), dtype), _smem_f32((COMPUTE_WGS, bq, head_dim))
    )
    dk, dv = _launch_key_ctas(body, scratch, q, k, v, do, lse, delta, dq_acc)
    return dq_acc[...], dk, dv
