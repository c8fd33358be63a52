"""The Mosaic GPU flash attention forward (see `_parts` for the warp-specialised design): one CTA per
one or two 128-row query tiles of a head, its output and base-2 log-sum-exp."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from ejkernel.kernels._common.attention import LOG2E, join_sink
from ejkernel.kernels._common.vma import out_struct
from ejkernel.kernels._pallas.gpu._stores import store_rows

from ._parts import (
    COMPUTE_REGISTERS,
    MASKED,
    SUM_COLS,
    KeyTiles,
    Stream,
    Turns,
    along_rows,
    bshd,
    exp2_tile,
    feed,
    launch_kernel,
    logits2,
    memory_warpgroup,
    rows_at,
    run_segments,
    skip_step,
    swizzled_smem,
    unit_col_smem,
    zero_acc,
)
from ._tiling import COMPUTE_WGS, CTA_ROWS, ROWS, MosaicGpuFlashStatic


def forward(
    st: MosaicGpuFlashStatic,
    q,
    k,
    v,
    sinks=None,
    walk: KeyTiles | None = None,
    out_rows: int | None = None,
    into=None,
    prior=None,
):
    """`q [B, Sq, H, D]`, `k, v [B, Sk, Hkv, D]` (padded) -> `out [B, Sq, H, D]`, `lse [B, H, Sq]` (base 2).

    (`[B, H, S, D]` arrays with `st.heads_major`.) `sinks`: optional `[H]` float32 sink logit per head
    (natural units), one more softmax column without a value: it joins each row's denominator and
    log-sum-exp when the row is written. `walk`: which key tiles each query tile streams (default:
    every tile holding an allowed pair, `KeyTiles`). `out_rows`: the output's rows (default q's), 128 a query
    tile (a walk that reads its queries in place, elsewhere than it writes them: `KeyTiles.tile`). `into`: with a
    walk `in_place`, the `[B, S, H, D]` array (S as q's) whose rows the tiles own are overwritten in place (no
    new output: the kernel aliases it); `out` is then `into` with those rows, `lse` still `out_rows` long.
    `prior`: `(out, lse)` shaped as this call's results (lse base 2, -inf for a row with no key), the softmax
    of other keys for the same queries: merged into each row as it is written (the union of both key sets),
    so that a caller adding key blocks one call at a time (ring attention) needs no merge of its own.
    """
    batch, q_pad_len, heads, head_dim = bshd(st, q.shape)
    bk, stages, dtype = st.block_k, st.stages, q.dtype
    out_len = q_pad_len if out_rows is None else out_rows
    num_q_tiles, num_blocks = out_len // CTA_ROWS, bshd(st, k.shape)[1] // bk
    tiles = st.q_tiles_per_cta
    walk = KeyTiles(st, bk, num_blocks, num_q_tiles, tiles) if walk is None else walk
    num_walk = len(walk.arrays)
    if num_q_tiles % tiles:
        raise ValueError(f"q_tiles_per_cta={tiles} needs a multiple of it in query tiles, got {num_q_tiles}")
    has_sinks = sinks is not None
    row_sums = st.row_sums_on_tc
    if row_sums and st.overlap:
        raise ValueError("row_sums_on_tc: the overlapped forward keeps its row sums as a vector")
    in_place = walk.in_place
    has_prior = prior is not None
    if has_prior and (has_sinks or in_place):
        raise ValueError("`prior` goes without sinks (join them once, after the last call) and without `into`")
    if in_place != (into is not None) or (in_place and (tiles != 1 or st.heads_major)):
        raise ValueError("`into` goes with a walk `in_place` of one query tile a CTA, [B, S, H, D] arrays")

    def body(q_ref, k_ref, v_ref, *refs):
        sink_ref = refs[0] if has_sinks else None
        unit_col_ref = refs[has_sinks] if row_sums else None
        walk_refs = refs[has_sinks + row_sums : has_sinks + row_sums + num_walk]
        prior_refs = refs[has_sinks + row_sums + num_walk : has_sinks + row_sums + num_walk + 2 * has_prior]
        out_ref, lse_ref, smem, barriers = refs[has_sinks + row_sums + num_walk + 2 * has_prior :]
        q_smem, k_smem, v_smem, lse_smem, *more = smem
        unit_col_smem = more[0] if row_sums else None
        q_ready, k_ready, k_consumed, v_ready, v_consumed, schedule, *more_barriers = barriers
        unit_col_ready = more_barriers[:row_sums]
        prior_ready = more_barriers[-1] if has_prior else None
        b, h, wg, cta = (lax.axis_index(a) for a in ("batch", "heads", "wg", "q_tiles"))
        stage_smem = more[-1].at[wg] if in_place else None  # (this warpgroup's untiled tile)
        tiles_of = walk.bind(walk_refs, b, h)

        def query_tile(j):
            """The CTA's j-th query tile: its first row, its key tiles [lo, hi) and their K/V streams."""
            row, lo, hi, key_row = tiles_of.tile(cta, j)
            streams = tiles_of.streams(k_ref, v_ref, (k_smem, v_smem), barriers[1:5], b, h, key_row)
            return row, lo, hi, list(streams)

        def over_tiles(fn):
            """`start = fn(j, start)` for each query tile j; `start` counts the key tiles streamed before."""
            return fn(0, 0) if tiles == 1 else lax.fori_loop(0, tiles, fn, jnp.int32(0))

        def feed_tile(j, start):
            _, lo, hi, streams = query_tile(j)
            feed(streams, hi - lo, stages, start, prefetch=st.prefetch)
            return start + hi - lo

        def feed_all():
            if row_sums:  # e₀ first: the compute warpgroups need it for their first P·V
                plgpu.copy_gmem_to_smem(unit_col_ref, unit_col_smem, unit_col_ready[0])
            over_tiles(feed_tile)

        memory_warpgroup(feed_all)

        turns = Turns(schedule, wg, st.overlap_schedule)

        live = tiles_of.live()  # (None: every CTA has rows to compute)

        @pl.when(wg < COMPUTE_WGS if live is None else (wg < COMPUTE_WGS) & live)
        def _():
            plgpu.set_max_registers(COMPUTE_REGISTERS, action="increase")
            for j in range(tiles):  # every query tile at once: the later ones load while the first runs
                if in_place:  # from any row of q (past its end: zeros), through the untiled tile
                    rows = pl.ds(tiles_of.tokens(tiles_of.tile(cta, j)[0] + wg * ROWS)[0], ROWS)
                    plgpu.copy_gmem_to_smem(rows_at(st, q_ref, b, rows, h), stage_smem, q_ready.at[wg])
                else:
                    rows = pl.ds(tiles_of.row(cta, j) + wg * ROWS, ROWS)
                    plgpu.copy_gmem_to_smem(
                        rows_at(st, q_ref, b, rows, h), q_smem.at[j * COMPUTE_WGS + wg], q_ready.at[wg]
                    )
            if has_sinks:  # this head's sink in every row, base 2, through the first lse buffer
                plgpu.copy_gmem_to_smem(sink_ref.at[h], lse_smem.at[wg], q_ready.at[wg])
            plgpu.barrier_wait(q_ready.at[wg])
            if in_place:  # (the untiled tile into the swizzled one wgmma reads)
                q_smem.at[wg][...] = plgpu.load(stage_smem, layout=plgpu.Layout.WGMMA)
                plgpu.commit_smem()
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
                        p = tiles_of.mask(p, row0, t, fill=0.0) if mode == "masked" else p
                        return p.astype(dtype), m, denom if row_sums else denom + p.sum(axis=1), None
                    if not st.fused_scale:
                        s = logits2(st, s)[0]
                        s = tiles_of.mask(s, row0, t) if mode == "masked" else s
                        m_new = jnp.maximum(m, s.max(axis=1))
                        p = exp2_tile(s - along_rows(m_new, s.shape), st.exp2_fma_cols)
                    else:  # scale inside the exponent (a max commutes with a positive scale): one FMA per score
                        s = tiles_of.mask(s, row0, t, fill=MASKED / st.scale2) if mode == "masked" else s
                        m_new = jnp.maximum(m, s.max(axis=1) * st.scale2)
                        p = exp2_tile(s * st.scale2 - along_rows(m_new, s.shape), st.exp2_fma_cols)
                    alpha = jnp.exp2(m - m_new)
                    if row_sums:  # the caller rescales the row sums tile with the accumulator
                        return p.astype(dtype), m_new, denom, alpha
                    return p.astype(dtype), m_new, denom * alpha + p.sum(axis=1), alpha

                def rescale(acc, alpha):
                    return acc if alpha is None else acc * along_rows(alpha, acc.shape)

                def slot_of(t):
                    """The shared-memory slot that holds key/value tile t."""
                    return lax.rem(start + t - lo, jnp.int32(stages))

                def scores(slot, before=lambda: None, after=turns.sync):
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
                        turns.sync()
                        turns.sync()
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
                        turns.take()
                        plgpu.wgmma(s_ref, qo, k_smem.at[slot].transpose((1, 0)))
                        plgpu.wgmma(acc_ref, p16, v_smem.at[prev])
                        turns.give()
                        # S is done; P·V may still run, except beside a mask (whose index tiles need its registers)
                        s = plgpu.wgmma_accumulator_load(s_ref, wait_n=0 if mode == "masked" else 1)
                        plgpu.barrier_arrive(k_consumed.at[slot])
                        p_ref[...], m_ref[...], denom_ref[...], alpha_ref[...] = softmax(mode, t, s, m, denom)

                    # (never `bounded`, which has no alpha: the overlapped forward runs without soft cap;
                    # the alpha slot starts as a copy of m, which has its shape and layout)
                    state = (plgpu.ACC.init(zero_acc((ROWS, bk))), plgpu.ACC.init(acc), p16, m, denom, m)
                    _, acc, new_p16, m_new, denom, alpha = pl.run_state(matmuls)(state)
                    # The old P stays live until P·V has completed (after the wait for acc): else LLVM may
                    # put the new P, computed while P·V runs, into the registers P·V still reads, and
                    # ptxas then serialises every wgmma of the kernel (C7513).
                    acc, _ = lax.optimization_barrier((acc, p16))
                    plgpu.barrier_arrive(v_consumed.at[prev])
                    return rescale(acc, alpha), m_new, denom, new_p16

                m0 = 0.0 if st.bounded else MASKED
                m = plgpu.layout_cast(jnp.full((ROWS,), m0, jnp.float32), plgpu.Layout.WGMMA.reduce(1))
                if row_sums:  # column 0 of the P·e₀ tile holds the row sums, the others 0
                    denom = zero_acc((ROWS, SUM_COLS))
                else:
                    denom = plgpu.layout_cast(jnp.zeros((ROWS,), jnp.float32), plgpu.Layout.WGMMA.reduce(1))
                acc = zero_acc((ROWS, head_dim))
                own = tiles_of.own(row0)

                def join_prior(acc, m, denom):
                    """The rows merged with the prior's, read through `qo` and `lse_out` (free once the last Q·Kᵀ
                    is done): the prior is one more softmax column, worth 2^lse and carrying its output."""
                    prior_out, prior_lse = prior_refs
                    plgpu.copy_gmem_to_smem(rows_at(st, prior_out, b, pl.ds(row0, ROWS), h), qo, prior_ready.at[wg])
                    plgpu.copy_gmem_to_smem(prior_lse.at[b, h, pl.ds(row0, ROWS)], lse_out, prior_ready.at[wg])
                    plgpu.barrier_wait(prior_ready.at[wg])
                    lse = plgpu.load(lse_out, layout=plgpu.Layout.WGMMA.reduce(1))
                    m, weight, denom = join_sink(m, denom, lse, jnp.exp2)
                    out = plgpu.load(qo, layout=plgpu.Layout.WGMMA).astype(jnp.float32)
                    acc = acc * along_rows(weight, acc.shape) + out * along_rows(jnp.exp2(lse - m), acc.shape)
                    return acc, m, denom

                def write(acc, m, denom):
                    """Normalised rows into `qo` (in place: the untiled tile), their log-sum-exp into shared memory
                    (for the TMA stores)."""
                    if row_sums:
                        denom = denom.sum(axis=1)  # (column 0 plus zeros: exact)
                    if has_prior:
                        acc, m, denom = join_prior(acc, m, denom)
                    weight = 1.0  # of the rows' 2^(logit - m) against the final denominator
                    if has_sinks:  # a row with no allowed key but a finite sink: output 0, lse = the sink
                        m, weight, denom = join_sink(m, denom, sink, jnp.exp2)
                    empty = (denom == 0.0) if st.bounded else (m < MASKED / 2)  # no allowed key: output 0, lse -inf
                    denom = jnp.where(empty, 1.0, denom)
                    inv = jnp.where(empty, 0.0, weight / denom)
                    (stage_smem if in_place else qo)[...] = (acc * along_rows(inv, acc.shape)).astype(dtype)
                    lse_out[...] = jnp.where(empty, -jnp.inf, m + jnp.log(denom) * LOG2E)

                if not st.overlap:
                    pl.when(wg == 1)(turns.sync)
                    write(*run_segments(step, (acc, m, denom), lo, *own, hi, masked=walk.masked))
                    pl.when(wg == 0)(turns.sync)
                else:
                    own_lo, full_lo, full_hi, own_hi = own

                    def skip(t, _):
                        # Turn first: the other warpgroup's matching turn may hold the slot this waits for.
                        turns.take()
                        turns.give()
                        skip_step(streams, slot_of(t))

                    lax.fori_loop(lo, own_lo, skip, None)

                    @pl.when(own_lo < own_hi)
                    def _():
                        first = slot_of(own_lo)
                        plgpu.barrier_wait(k_ready.at[first])
                        s = scores(first, turns.take, turns.give)
                        plgpu.barrier_arrive(k_consumed.at[first])
                        p16, m1, denom1, _ = softmax("masked", own_lo, s, m, denom)  # (acc is 0: no rescale)
                        t1 = own_lo + 1

                        def clip(t):  # (t1 itself where t <= own_lo at trace time: no leading masked loop)
                            static = isinstance(t, int) and isinstance(own_lo, int) and t <= own_lo
                            return t1 if static else jnp.clip(t, t1, own_hi)

                        carry = (acc, m1, denom1, p16)
                        acc1, m1, denom1, p16 = run_segments(
                            overlapped_step,
                            carry,
                            t1,
                            t1,
                            clip(full_lo),
                            clip(full_hi),
                            own_hi,
                            own_hi,
                            masked=walk.masked,
                        )
                        last = slot_of(own_hi - 1)
                        plgpu.barrier_wait(v_ready.at[last])
                        acc1, denom1 = add_pv(acc1, p16, last, denom1)
                        write(acc1, m1, denom1)

                    pl.when(own_lo >= own_hi)(lambda: write(acc, m, denom))
                    lax.fori_loop(own_hi, hi, skip, None)

                plgpu.commit_smem()
                if in_place:  # only the rows before `end`: those after are another sequence's or past the array
                    first, end = tiles_of.tokens(row0)
                    dst = lambda row, count: rows_at(st, out_ref, b, pl.ds(row, count), h)
                    store_rows(stage_smem, dst, first, first, end)
                else:
                    plgpu.copy_smem_to_gmem(qo, rows_at(st, out_ref, b, pl.ds(row0, ROWS), h))
                plgpu.copy_smem_to_gmem(lse_out, lse_ref.at[b, h, pl.ds(row0, ROWS)])
                return start + hi - lo

            over_tiles(run_tile)
            plgpu.wait_smem_to_gmem(0)

    scratch = (
        (
            swizzled_smem((tiles * COMPUTE_WGS, ROWS, head_dim), dtype),
            swizzled_smem((stages, bk, head_dim), dtype),
            swizzled_smem((stages, bk, head_dim), dtype),
            plgpu.SMEM((tiles * COMPUTE_WGS, ROWS), jnp.float32),
            *((unit_col_smem(bk, dtype),) if row_sums else ()),
            *((plgpu.SMEM((COMPUTE_WGS, ROWS, head_dim), dtype),) if in_place else ()),
        ),
        (
            # a warpgroup's q tiles (and sink)
            plgpu.Barrier(num_arrivals=tiles + has_sinks, num_barriers=COMPUTE_WGS),
            *Stream.barriers(walk.copies, stages),
            *Stream.barriers(walk.copies, stages),
            # ping-pong: a rendezvous of both warpgroups; overlapped: one "your turn" barrier per warpgroup
            plgpu.Barrier(num_barriers=COMPUTE_WGS) if st.overlap else plgpu.Barrier(num_arrivals=COMPUTE_WGS),
            *((plgpu.Barrier(),) if row_sums else ()),  # e₀, fed once by the memory warpgroup
            *((plgpu.Barrier(num_arrivals=2, num_barriers=COMPUTE_WGS),) if has_prior else ()),  # a tile's prior
        ),
    )
    out = q
    if out_rows is not None:
        out = out_struct(
            (batch, heads, out_len, head_dim) if st.heads_major else (batch, out_len, heads, head_dim), q.dtype, q
        )
    lse_type = out_struct((batch, heads, out_len), jnp.float32, q)
    args = (q, k, v) + ((jnp.broadcast_to((sinks * LOG2E)[:, None], (heads, ROWS)),) if has_sinks else ())
    args += (jnp.zeros((bk, SUM_COLS), dtype).at[:, 0].set(1),) if row_sums else ()
    args += tuple(walk.arrays) + (tuple(prior) if has_prior else ())
    grid = (heads, num_q_tiles // tiles, batch)
    if in_place:  # a ref among the inputs, right before the lse: the body finds it where the output would be
        into_ref = jax.new_ref(into)
        lse = launch_kernel(body, (lse_type,), scratch, grid, ("heads", "q_tiles", "batch"), *args, into_ref)[0]
        return jax.freeze(into_ref), lse
    return launch_kernel(body, (out, lse_type), scratch, grid, ("heads", "q_tiles", "batch"), *args)
