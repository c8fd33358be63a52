"""The Mosaic GPU flash attention backward (see `_parts` for the warp-specialised design): dQ over query
CTAs, dK/dV over key CTAs, or both in one fused kernel."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from ._parts import (
    COMPUTE_REGISTERS,
    KeyTiles,
    QueryTiles,
    Stream,
    along_cols,
    along_rows,
    bshd,
    feed,
    launch_kernel,
    logits2,
    memory_warpgroup,
    rows_at,
    run_segments,
    score_grad,
    skip_step,
    stream_key_tiles,
    swizzled_smem,
    two_products,
    zero_acc,
)
from ._tiling import COMPUTE_WGS, CTA_ROWS, ROWS, MosaicGpuFlashStatic


def backward_dq(st: MosaicGpuFlashStatic, q, k, v, do, lse, delta, walk: KeyTiles | None = None):
    """dQ: per CTA 128 query rows (two warpgroups); key/value tiles streamed as in the forward.

    `lse` (base 2, +inf for rows with no allowed key) and `delta = rowsum(dO · O)` are `[B, H, Sq]`.
    `walk`: which key tiles each query tile streams (default: `KeyTiles`).
    """
    batch, q_pad_len, heads, head_dim = bshd(st, q.shape)
    bk, stages, dtype = st.block_k_dq, st.stages_bwd, q.dtype
    num_q_tiles = q_pad_len // CTA_ROWS
    walk = KeyTiles(st, bk, bshd(st, k.shape)[1] // bk, num_q_tiles) if walk is None else walk

    def body(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *refs):
        walk_refs, (dq_ref, smem, barriers) = refs[: len(walk.arrays)], refs[len(walk.arrays) :]
        q_smem, do_smem, lse_smem, delta_smem, k_smem, v_smem = smem
        row_ready, k_ready, k_consumed, v_ready, v_consumed = barriers
        cta = stream_key_tiles(st, walk, walk_refs, k_ref, v_ref, (k_smem, v_smem), barriers[1:], bk, stages)
        b, h, wg, lo, hi, streams = cta.batch, cta.head, cta.wg, cta.lo, cta.hi, list(cta.streams)

        @pl.when(wg < COMPUTE_WGS)
        def _():
            plgpu.set_max_registers(COMPUTE_REGISTERS, action="increase")
            row0 = cta.row + wg * ROWS
            qs, dos = q_smem.at[wg], do_smem.at[wg]
            rows, vec_at = pl.ds(row0, ROWS), (b, h, pl.ds(row0, ROWS))
            for src, dst in (
                (rows_at(st, q_ref, b, rows, h), qs),
                (rows_at(st, do_ref, b, rows, h), dos),
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

                s, dp = two_products(qs, k_smem.at[slot], dos, v_smem.at[slot])
                plgpu.barrier_arrive(v_consumed.at[slot])
                s, tanh = logits2(st, s)
                p = jnp.exp2(s - along_rows(lse_w, s.shape))
                if mode == "masked":
                    p = cta.walk.mask(p, row0, t, fill=0.0)
                ds = score_grad(st, p * (dp - along_rows(delta_w, dp.shape)), tanh).astype(dtype)

                def dq_mma(acc_ref):
                    plgpu.wgmma(acc_ref, ds, k_smem.at[slot])

                dq = pl.run_state(dq_mma)(plgpu.ACC.init(dq))
                plgpu.barrier_arrive(k_consumed.at[slot])
                return dq

            own = cta.walk.own(row0)
            dq = run_segments(step, zero_acc((ROWS, head_dim)), lo, *own, hi, masked=cta.walk.masked)
            qs[...] = (dq * st.softmax_scale).astype(dtype)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(qs, rows_at(st, dq_ref, b, rows, h))
            plgpu.wait_smem_to_gmem(0)

    scratch = (
        (
            swizzled_smem((COMPUTE_WGS, ROWS, head_dim), dtype),
            swizzled_smem((COMPUTE_WGS, ROWS, head_dim), dtype),
            plgpu.SMEM((COMPUTE_WGS, ROWS), jnp.float32),
            plgpu.SMEM((COMPUTE_WGS, ROWS), jnp.float32),
            swizzled_smem((stages, bk, head_dim), dtype),
            swizzled_smem((stages, bk, head_dim), dtype),
        ),
        (
            plgpu.Barrier(num_arrivals=4, num_barriers=COMPUTE_WGS),
            *Stream.barriers(1, stages),
            *Stream.barriers(1, stages),
        ),
    )
    grid, names = (heads, num_q_tiles, batch), ("heads", "q_tiles", "batch")
    return launch_kernel(body, q, scratch, grid, names, q, k, v, do, lse, delta, *walk.arrays)


@dataclasses.dataclass(frozen=True)
class KeyCta:
    """A CTA of the dK/dV and fused backward kernels: 128 key rows of one key/value head (64 per
    compute warpgroup); the query tiles [lo, hi) of every query head of the group are streamed."""

    batch: Any
    kv_head: Any
    col0: Any  # first key row of this warpgroup
    keys: Any  # this warpgroup's (ROWS, D) key and value tiles in shared memory
    values: Any
    walk: QueryTiles
    span: Any  # what `walk.span` computed for the CTA
    streams: tuple[Stream, Stream]  # query; output gradient with log-sum-exp and delta


def _key_cta_scratch(st: MosaicGpuFlashStatic, bq: int, head_dim: int, dtype, *extra_smem):
    """Shared memory and barriers of a `KeyCta` kernel; `extra_smem` follows the common buffers."""
    stages = st.stages_bwd
    smem = (
        swizzled_smem((COMPUTE_WGS, ROWS, head_dim), dtype),
        swizzled_smem((COMPUTE_WGS, ROWS, head_dim), dtype),
        swizzled_smem((stages, bq, head_dim), dtype),
        swizzled_smem((stages, bq, head_dim), dtype),
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


def stream_query_tiles(
    st: MosaicGpuFlashStatic, walk: QueryTiles, walk_refs, q_ref, do_ref, lse_ref, delta_ref, smem, barriers
):
    """Places the CTA and starts its memory warpgroup feeding the group's query-side tiles -> `KeyCta`.

    `smem` and `barriers` are laid out by `_key_cta_scratch`. Grouped-query heads are streamed one
    after another, so their gradients are summed in registers, never through a per-head copy.
    """
    k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem = smem[:6]
    _, q_ready, q_consumed, do_ready, do_consumed = barriers
    bq = st.block_q_dkv
    b, kv_h, wg = lax.axis_index("batch"), lax.axis_index("kv_heads"), lax.axis_index("wg")
    walk = walk.bind(walk_refs, b, kv_h)
    cta_col = walk.key_tile(lax.axis_index("kv_tiles")) * CTA_ROWS
    span = walk.span(cta_col)

    def rows_of(ref):
        def source(i):
            head, row = walk.position(span, kv_h, i)
            return rows_at(st, ref, b, pl.ds(row, bq), head)

        return source

    def vec_of(ref):
        def source(i):
            head, row = walk.position(span, kv_h, i)
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
    memory_warpgroup(lambda: feed(list(streams), walk.total(span), st.stages_bwd, prefetch=st.prefetch))
    return KeyCta(b, kv_h, cta_col + wg * ROWS, k_smem.at[wg], v_smem.at[wg], walk, span, streams)


def key_gradients(st: MosaicGpuFlashStatic, cta: KeyCta, k_ref, v_ref, dk_ref, dv_ref, kv_ready, step):
    """The compute warpgroups of a `KeyCta`: dK and dV of their 64 keys, summed over the group's heads.

    `step(g, mode, t, slot, (dk, dv))` handles query tile `t` of query head `g` of the group, whose
    tiles wait in `slot`; it hands the slot back (`consumed`) and returns the new `(dk, dv)`.
    """
    plgpu.set_max_registers(COMPUTE_REGISTERS, action="increase")
    wg = lax.axis_index("wg")
    rows = pl.ds(cta.col0, ROWS)
    plgpu.copy_gmem_to_smem(rows_at(st, k_ref, cta.batch, rows, cta.kv_head), cta.keys, kv_ready.at[wg])
    plgpu.copy_gmem_to_smem(rows_at(st, v_ref, cta.batch, rows, cta.kv_head), cta.values, kv_ready.at[wg])
    plgpu.barrier_wait(kv_ready.at[wg])
    own = cta.walk.prepare(cta.span, cta.col0)

    def head(g, carry):
        lo, own_g, hi, slot_of = cta.walk.head(cta.span, own, g)

        def one(mode, t, carry):
            slot = slot_of(t)
            if mode == "skip":
                skip_step(list(cta.streams), slot)
                return carry
            for s in cta.streams:
                plgpu.barrier_wait(s.ready.at[slot])
            return step(g, mode, t, slot, carry)

        return run_segments(one, carry, lo, *own_g, hi, masked=cta.walk.masked)

    zeros = zero_acc((ROWS, k_ref.shape[-1]))
    dk, dv = lax.fori_loop(0, st.group, head, (zeros, zeros))
    cta.keys[...] = (dk * st.softmax_scale).astype(k_ref.dtype)
    cta.values[...] = dv.astype(v_ref.dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(cta.keys, rows_at(st, dk_ref, cta.batch, rows, cta.kv_head))
    plgpu.copy_smem_to_gmem(cta.values, rows_at(st, dv_ref, cta.batch, rows, cta.kv_head))
    plgpu.wait_smem_to_gmem(0)


def _launch_key_ctas(st: MosaicGpuFlashStatic, body, scratch, q, k, v, do, lse, delta, *refs):
    """Launches `body` on one `KeyCta` per 128 key rows of each key/value head; outputs dK and dV."""
    batch, kv_pad_len, kv_heads = bshd(st, k.shape)[:3]
    grid, names = (kv_heads, kv_pad_len // CTA_ROWS, batch), ("kv_heads", "kv_tiles", "batch")
    return launch_kernel(body, (k, v), scratch, grid, names, q, k, v, do, lse, delta, *refs)


def _query_tile_inputs(cta: KeyCta, slot):
    """This step's log-sum-exp and delta, laid out along the columns of a [key, query] tile."""
    stream = cta.streams[1]
    lse_smem, delta_smem = stream.copies[1][1], stream.copies[2][1]
    layout = plgpu.Layout.WGMMA.reduce(0)
    return plgpu.load(lse_smem.at[slot], layout=layout), plgpu.load(delta_smem.at[slot], layout=layout)


def _default_query_tiles(st: MosaicGpuFlashStatic, q, walk: QueryTiles | None) -> QueryTiles:
    return QueryTiles(st, st.block_q_dkv, bshd(st, q.shape)[1] // st.block_q_dkv) if walk is None else walk


def backward_dkv(st: MosaicGpuFlashStatic, q, k, v, do, lse, delta, walk: QueryTiles | None = None):
    """dK, dV: per CTA 128 key rows (two warpgroups) of one key/value head; `walk`: which query tiles
    each key CTA streams (default: `QueryTiles`)."""
    bq, dtype = st.block_q_dkv, q.dtype
    walk = _default_query_tiles(st, q, walk)

    def body(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *refs):
        walk_refs, (dk_ref, dv_ref, smem, barriers) = refs[: len(walk.arrays)], refs[len(walk.arrays) :]
        cta = stream_query_tiles(st, walk, walk_refs, q_ref, do_ref, lse_ref, delta_ref, smem, barriers)
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
            p_t = jnp.exp2(s_t - along_cols(lse_t, s_t.shape))
            if mode == "masked":
                p_t = cta.walk.mask(p_t, cta.col0, cta.span, t)

            def dv_and_dp(refs):
                dv_ref, dp_ref = refs
                plgpu.wgmma(dv_ref, p_t.astype(dtype), do_smem.at[slot])
                plgpu.wgmma(dp_ref, vs, do_smem.at[slot].transpose((1, 0)))

            dv, dp_t = pl.run_state(dv_and_dp)((plgpu.ACC.init(dv), plgpu.ACC.init(zero_acc((ROWS, bq)))))
            plgpu.barrier_arrive(do_stream.consumed.at[slot])
            ds_t = score_grad(st, p_t * (dp_t - along_cols(delta_t, dp_t.shape)), tanh_t).astype(dtype)

            def dk_mma(acc_ref):
                plgpu.wgmma(acc_ref, ds_t, q_smem.at[slot])

            dk = pl.run_state(dk_mma)(plgpu.ACC.init(dk))
            plgpu.barrier_arrive(q_stream.consumed.at[slot])
            return dk, dv

        pl.when(lax.axis_index("wg") < COMPUTE_WGS)(
            lambda: key_gradients(st, cta, k_ref, v_ref, dk_ref, dv_ref, barriers[0], step)
        )

    scratch = _key_cta_scratch(st, bq, q.shape[-1], dtype)
    return _launch_key_ctas(st, body, scratch, q, k, v, do, lse, delta, *walk.arrays)


def _smem_f32(shape):
    """Shared memory for float32 tiles of 32-element (128-byte) rows, swizzled like `swizzled_smem`'s 16-bit tiles."""
    return plgpu.SMEM(shape, jnp.float32, transforms=(plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(128)))


def backward_fused(st: MosaicGpuFlashStatic, q, k, v, do, lse, delta, walk: QueryTiles | None = None):
    """dQ, dK and dV in one pass over the (query tile, key tile) pairs; returns float32 dQ (unscaled), dK, dV.

    CTAs as in `backward_dkv`. Each step also multiplies its warpgroup's dS tile, written to shared
    memory, by the warpgroup's keys and adds that share of dQ into a float32 dQ in HBM with a TMA
    reduction: five matmuls per tile pair instead of the seven of the two-kernel backward.
    """
    bq, head_dim, dtype = st.block_q_dkv, q.shape[-1], q.dtype
    walk = _default_query_tiles(st, q, walk)
    dq_acc = jax.new_ref(jnp.zeros(q.shape, jnp.float32))

    def body(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *refs):
        walk_refs = refs[: len(walk.arrays)]
        dq_ref, dk_ref, dv_ref, smem, barriers = refs[len(walk.arrays) :]
        cta = stream_query_tiles(st, walk, walk_refs, q_ref, do_ref, lse_ref, delta_ref, smem, barriers)
        q_smem, do_smem, ds_smem, dq_smem = smem[2], smem[3], smem[6], smem[7]
        (q_stream, do_stream), ks, vs = cta.streams, cta.keys, cta.values
        wg = lax.axis_index("wg")
        dss, dqs = ds_smem.at[wg], dq_smem.at[wg]

        def step(g, mode, t, slot, carry):
            dk, dv = carry

            s_t, dp_t = two_products(ks, q_smem.at[slot], vs, do_smem.at[slot])
            lse_t, delta_t = _query_tile_inputs(cta, slot)
            s_t, tanh_t = logits2(st, s_t)
            p_t = jnp.exp2(s_t - along_cols(lse_t, s_t.shape))
            if mode == "masked":
                p_t = cta.walk.mask(p_t, cta.col0, cta.span, t)
            ds_t = score_grad(st, p_t * (dp_t - along_cols(delta_t, dp_t.shape)), tanh_t).astype(dtype)
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

            dq = pl.run_state(dq_share)(plgpu.ACC.init(zero_acc((bq, head_dim))))
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the last share has left `dqs`
            dqs[...] = dq
            plgpu.commit_smem()
            dst = rows_at(st, dq_ref, cta.batch, pl.ds(cta.walk.query_row(cta.span, t), bq), cta.kv_head * st.group + g)
            plgpu.copy_smem_to_gmem(dqs, dst, reduction_op="add")
            return dk, dv

        pl.when(wg < COMPUTE_WGS)(lambda: key_gradients(st, cta, k_ref, v_ref, dk_ref, dv_ref, barriers[0], step))

    scratch = _key_cta_scratch(
        st, bq, head_dim, dtype, swizzled_smem((COMPUTE_WGS, ROWS, bq), dtype), _smem_f32((COMPUTE_WGS, bq, head_dim))
    )
    dk, dv = _launch_key_ctas(st, body, scratch, q, k, v, do, lse, delta, *walk.arrays, dq_acc)
    return dq_acc[...], dk, dv
