"""The Mosaic GPU float8 (e4m3) flash attention forward: the ping-pong design of `_fwd` with 8-bit matmuls.

Q·Kᵀ is an e4m3 wgmma with float32 accumulation, the scores scaled per row by `softmax_scale · q_descale ·
k_descale` of the head; P is rounded to e4m3 for P·V (as FlashAttention-3 does; times 2^`P_SHIFT`) and the output
multiplied by `v_descale / row sum`. Unmasked tiles take the row max of the raw scores and scale inside the exponent
(`exp2(s·c - m)`, one FMA a score: 7-10% faster than scaling first, session 53), which needs c > 0: a head whose
logit scale is negative has its Q tile negated in shared memory instead. 8-bit wgmma operands must be K-major, so V
comes transposed (`[B, Hkv, D, S]`, done by XLA outside) and streams as `[D, block_k]` tiles. P is P·V's register
operand. An 8-bit register operand holds four consecutive columns a thread where the score tile's layout holds two
pairs eight columns apart; rather than move bytes between threads, each thread's four values are declared to be
those four columns (`register_operand`), which permutes the keys within each group of 16, and Vᵀ comes with its
keys permuted the same way (`P_KEY_ORDER`, applied by XLA with the transpose). (Staged through shared memory instead,
P cost 15-20% of the time without a mask: session 48, BENCHMARKS.md.)

Two schedules keep the tensor cores busy during the softmax (`MosaicGpuFlashStatic.overlap`, see `_parts`): the
ping-pong (causal calls' default: the two compute warpgroups take turns, one's softmax beside the other's matmuls,
each P·V waited for at once), or (the others' default) the overlapped schedule of `_fwd`: tile t's Q·Kᵀ issued
together with tile t-1's P·V and tile t's softmax run while that P·V does, optionally still taking turns at issuing
(`MosaicGpuFlashStatic.overlap_schedule`); tile t-1's P rides in the loop's carry.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.pallas import mosaic_gpu as plgpu

from ._parts import (
    COMPUTE_REGISTERS,
    MASKED,
    KeyTiles,
    Stream,
    Turns,
    along_rows,
    exp2_tile,
    feed,
    launch_kernel,
    memory_warpgroup,
    run_segments,
    skip_step,
    swizzled_smem,
    zero_acc,
)
from ._tiling import COMPUTE_WGS, CTA_ROWS, ROWS, MosaicGpuFlashStatic

OUT_DTYPE = jnp.bfloat16
P_SHIFT = 8.0
"""P enters e4m3 times 2**8, the shift taken inside the exponent (`exp2(s - (m - 8))`, no multiply a score) and the
row sums carrying it: weights in [0, 1] would fall under e4m3's smallest normal (2**-6) from 0.016 down, and to zero
under 0.001, a long context's tail; times 2**8 they stay normal down to 6e-5 and the largest, 256, is inside e4m3's
range (448)."""


P_KEY_ORDER = tuple(8 * (c % 4 // 2) + 2 * (c // 4) + c % 2 for c in range(16))
"""The key (within each 16) that column c of P's register operand holds. Column 4·l + i of the
8-bit operand is thread l's byte i; in the float32 score layout thread l holds keys 2·l, 2·l + 1, 8 + 2·l, 9 + 2·l."""


def register_operand(p8):
    """e4m3 `[ROWS, block_k]` in the WGMMA layout -> the same values as wgmma's 8-bit register operand (layout
    `WGMMA_8BIT`), each thread's two byte pairs of a 16-column group joined into one word: column `16·j + c` of the
    result is column `16·j + P_KEY_ORDER[c]` of `p8`. No data moves between threads."""

    @plgpu.inline_mgpu(
        arg_types=(plgpu.Layout.WGMMA,),
        return_type=plgpu.ShapeDtypeStruct(p8.shape, p8.dtype, layout=plgpu.Layout.WGMMA_8BIT),
    )
    def join(_, p):
        words = np.empty(mgpu.WGMMA_LAYOUT_8BIT.registers_shape(p.shape), dtype=object)
        for index in np.ndindex(words.shape):  # (axis 1: 16-column groups here, 8-column blocks in `p`)
            pairs = [p.registers[(index[0], 2 * index[1] + i, *index[2:])] for i in range(2)]
            words[index] = mgpu.utils.vector_concat(pairs)
        return mgpu.FragmentedArray(_registers=words, _layout=mgpu.WGMMA_LAYOUT_8BIT, _is_signed=None)

    return join(p8)


def v_transposed(v):
    """`v [B, Sk, Hkv, D]` as P·V's B operand: `[B, Hkv, D, Sk]` (K-major, as 8-bit wgmma operands must be; Hopper
    has no transposed 8-bit shared-memory loads), its keys in `P_KEY_ORDER` (`keys_in_register_order`)."""
    return keys_in_register_order(jnp.transpose(v, (0, 2, 3, 1)))


def keys_in_register_order(vt):
    """`vt [..., Sk]` with the keys of each group of 16 in `P_KEY_ORDER` (Sk a multiple of 16): key `16·j + 8·a +
    2·l + i` moves to `16·j + 4·l + 2·a + i`, one transpose."""
    *lead, keys = vt.shape
    return vt.reshape(*lead, keys // 16, 2, 4, 2).swapaxes(-3, -2).reshape(vt.shape)


def byte_smem(shape, row_bytes: int):
    """Shared memory of 8-bit tiles whose rows are `row_bytes` (64 or 128) long, in the swizzled layout that
    wgmma and TMA use."""
    return plgpu.SMEM(
        shape,
        jnp.float8_e4m3fn,
        transforms=(plgpu.TilingTransform((8, row_bytes)), plgpu.SwizzleTransform(row_bytes)),
    )


def forward_fp8(st: MosaicGpuFlashStatic, q, k, vt, scales):
    """`q [B, Sq, H, D]`, `k [B, Sk, Hkv, D]` e4m3, `vt [B, Hkv, D, Sk]` e4m3 (padded), `scales [H, 2, ROWS]`
    float32 (per head: the base-2 logit scale and v_descale, repeated over the rows) -> `out [B, Sq, H, D]`
    bfloat16. Shared memory: `_tiling.float8_smem_bytes`."""
    batch, q_pad_len, heads, head_dim = q.shape
    bk, stages = st.block_k, st.stages
    num_q_tiles, num_blocks = q_pad_len // CTA_ROWS, k.shape[1] // bk
    walk = KeyTiles(st, bk, num_blocks, num_q_tiles)
    row_bytes = min(128, head_dim)  # the swizzle of Q/K tiles: one row, or a fraction of one
    pv_bytes = min(row_bytes, bk)  # the swizzle of Vᵀ tiles (rows of block_k bytes), P·V's instruction swizzle

    def body(q_ref, k_ref, vt_ref, scale_ref, out_ref, smem, barriers):
        q_smem, k_smem, vt_smem, o_smem, scale_smem = smem
        q_ready, k_ready, k_consumed, v_ready, v_consumed, schedule = barriers
        b, h, wg, cta = (lax.axis_index(a) for a in ("batch", "heads", "wg", "q_tiles"))
        kv_h = lax.div(h, jnp.int32(st.group))
        cta_row, lo, hi, key_row = walk.tile(cta, 0)
        streams = [
            Stream(((lambda i: k_ref.at[b, pl.ds(key_row(i), bk), kv_h], k_smem),), k_ready, k_consumed),
            Stream(((lambda i: vt_ref.at[b, kv_h, :, pl.ds(key_row(i), bk)], vt_smem),), v_ready, v_consumed),
        ]
        memory_warpgroup(lambda: feed(streams, hi - lo, stages))

        turns = Turns(schedule, wg, st.overlap_schedule)

        @pl.when(wg < COMPUTE_WGS)
        def _():
            plgpu.set_max_registers(COMPUTE_REGISTERS, action="increase")
            row0 = cta_row + wg * ROWS
            qo = q_smem.at[wg]
            plgpu.copy_gmem_to_smem(q_ref.at[b, pl.ds(row0, ROWS), h], qo, q_ready.at[wg])
            plgpu.copy_gmem_to_smem(scale_ref.at[h], scale_smem.at[wg], q_ready.at[wg])
            plgpu.barrier_wait(q_ready.at[wg])

            @pl.when(scale_smem[wg, 0, 0] < 0)
            def _():
                # Q·Kᵀ·c = (-Q)·Kᵀ·|c|: with a positive scale the row max commutes with it (see `softmax`)
                qo[...] = (-qo[...].astype(jnp.float32)).astype(qo.dtype)
                plgpu.commit_smem()

            logit_scale = jnp.abs(plgpu.load(scale_smem.at[wg, 0], layout=plgpu.Layout.WGMMA.reduce(1)))
            v_scale = plgpu.load(scale_smem.at[wg, 1], layout=plgpu.Layout.WGMMA.reduce(1))

            def slot_of(t):
                return lax.rem(t - lo, jnp.int32(stages))

            def scores(slot, before=lambda: None, after=turns.sync):
                """S = Q·K_slotᵀ; ping-pong (the default `after`): the other warpgroup's softmax runs meanwhile."""

                def qk(acc_ref):
                    before()
                    plgpu.wgmma(acc_ref, qo, k_smem.at[slot].transpose((1, 0)))
                    after()
                    return acc_ref[...]

                return pl.run_scoped(qk, plgpu.ACC((ROWS, bk), jnp.float32))

            def softmax(mode, t, s, m, denom):
                """Raw scores of key tile t -> (P in [0, 2^P_SHIFT] as P·V's operand, new row max, new denominator,
                rescale of the old rows)."""
                if mode == "masked":
                    s = walk.mask(s * along_rows(logit_scale, s.shape), row0, t)  # base-2 logits
                    m_new = jnp.maximum(m, s.max(axis=1))
                    shifted = s - along_rows(m_new - P_SHIFT, s.shape)
                else:  # the max of the raw scores, the scale inside the exponent: one FMA a score, not two ops
                    m_new = jnp.maximum(m, s.max(axis=1) * logit_scale)
                    shifted = s * along_rows(logit_scale, s.shape) - along_rows(m_new - P_SHIFT, s.shape)
                p = exp2_tile(shifted, st.exp2_fma_cols)
                alpha = jnp.exp2(m - m_new)
                return register_operand(p.astype(jnp.float8_e4m3fn)), m_new, denom * alpha + p.sum(axis=1), alpha

            def pv(acc_ref, p8, slot):
                plgpu.wgmma(acc_ref, p8, vt_smem.at[slot].transpose((1, 0)))

            def add_pv(acc, p8, slot):
                """acc + P·V_slot, waited for (the caller has waited for V_slot); the slot handed back."""
                (acc,) = pl.run_state(lambda refs: pv(refs[0], p8, slot))((plgpu.ACC.init(acc),))
                plgpu.barrier_arrive(v_consumed.at[slot])
                return acc

            def step(mode, t, carry):
                """Ping-pong: tile t's S, softmax (while the other warpgroup's matmuls run), then P·V."""
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
                p8, m_new, denom, alpha = softmax(mode, t, s, m, denom)
                acc = acc * along_rows(alpha, acc.shape)
                acc, denom, m_new, p8 = lax.optimization_barrier((acc, denom, m_new, p8))
                plgpu.barrier_arrive(schedule)  # softmax done: the other warpgroup's Q·Kᵀ may start
                plgpu.barrier_wait(v_ready.at[slot])
                plgpu.barrier_wait(schedule)
                return add_pv(acc, p8, slot), m_new, denom

            def overlapped_step(mode, t, carry):
                """Tile t's S and tile t-1's P·V (its P carried) issued together; S's softmax runs while P·V does."""
                acc, m, denom, p_prev = carry
                slot, prev = slot_of(t), slot_of(t - 1)
                plgpu.barrier_wait(k_ready.at[slot])
                plgpu.barrier_wait(v_ready.at[prev])

                def matmuls(refs):
                    s_ref, acc_ref, p_ref, m_ref, denom_ref, alpha_ref = refs
                    turns.take()
                    plgpu.wgmma(s_ref, qo, k_smem.at[slot].transpose((1, 0)))
                    pv(acc_ref, p_prev, prev)
                    turns.give()
                    # S is done; P·V may still run, except beside a mask (whose index tiles need registers)
                    s = plgpu.wgmma_accumulator_load(s_ref, wait_n=0 if mode == "masked" else 1)
                    plgpu.barrier_arrive(k_consumed.at[slot])
                    p_ref[...], m_ref[...], denom_ref[...], alpha_ref[...] = softmax(mode, t, s, m, denom)

                # (the alpha slot starts as a copy of m, which has its shape and layout)
                state = (plgpu.ACC.init(zero_acc((ROWS, bk))), plgpu.ACC.init(acc), p_prev, m, denom, m)
                _, acc, p8, m_new, denom, alpha = pl.run_state(matmuls)(state)
                # The old P stays live until P·V has completed (after the wait for acc), as in `_fwd`: else its
                # registers may take the new P while P·V still reads them, and ptxas serialises the wgmmas.
                acc, _ = lax.optimization_barrier((acc, p_prev))
                plgpu.barrier_arrive(v_consumed.at[prev])
                return acc * along_rows(alpha, acc.shape), m_new, denom, p8

            def write(acc, m, denom):
                """Normalised rows into shared memory, for the TMA store."""
                empty = m < MASKED / 2  # no allowed key: output 0
                inv = jnp.where(empty, 0.0, v_scale / jnp.where(empty, 1.0, denom))
                o_smem.at[wg][...] = (acc * along_rows(inv, acc.shape)).astype(OUT_DTYPE)

            def run_overlapped(acc, m, denom):
                """This warpgroup's own tiles overlapped (the first S alone, the last P·V alone), the others
                skipped, taking its turns throughout."""
                own_lo, full_lo, full_hi, own_hi = walk.own(row0)

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
                    p8, m1, denom1, _ = softmax("masked", own_lo, s, m, denom)  # (acc is 0: no rescale)
                    t1 = own_lo + 1
                    full_lo1, full_hi1 = jnp.clip(full_lo, t1, own_hi), jnp.clip(full_hi, t1, own_hi)
                    carry = (acc, m1, denom1, p8)
                    for start, end, mode in (
                        (t1, full_lo1, "masked"),
                        (full_lo1, full_hi1, "full"),
                        (full_hi1, own_hi, "masked"),
                    ):
                        carry = lax.fori_loop(start, end, lambda t, c, mode=mode: overlapped_step(mode, t, c), carry)
                    acc1, m1, denom1, p_last = carry
                    last = slot_of(own_hi - 1)
                    plgpu.barrier_wait(v_ready.at[last])
                    write(add_pv(acc1, p_last, last), m1, denom1)

                pl.when(own_lo >= own_hi)(lambda: write(acc, m, denom))
                lax.fori_loop(own_hi, hi, skip, None)

            m = plgpu.layout_cast(jnp.full((ROWS,), MASKED, jnp.float32), plgpu.Layout.WGMMA.reduce(1))
            denom = plgpu.layout_cast(jnp.zeros((ROWS,), jnp.float32), plgpu.Layout.WGMMA.reduce(1))
            acc = zero_acc((ROWS, head_dim))
            if st.overlap:
                if st.overlap_schedule:  # warpgroup 0 issues first
                    pl.when(wg == 1)(lambda: plgpu.barrier_arrive(schedule.at[0]))
                run_overlapped(acc, m, denom)
            else:
                pl.when(wg == 1)(turns.sync)
                acc, m, denom = run_segments(step, (acc, m, denom), lo, *walk.own(row0), hi)
                pl.when(wg == 0)(turns.sync)
                write(acc, m, denom)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(o_smem.at[wg], out_ref.at[b, pl.ds(row0, ROWS), h])
            plgpu.wait_smem_to_gmem(0)

    scratch = (
        (
            byte_smem((COMPUTE_WGS, ROWS, head_dim), row_bytes),
            byte_smem((stages, bk, head_dim), row_bytes),
            byte_smem((stages, head_dim, bk), pv_bytes),
            swizzled_smem((COMPUTE_WGS, ROWS, head_dim), OUT_DTYPE),
            plgpu.SMEM((COMPUTE_WGS, 2, ROWS), jnp.float32),
        ),
        (
            plgpu.Barrier(num_arrivals=2, num_barriers=COMPUTE_WGS),  # a warpgroup's q tile and scales
            *Stream.barriers(1, stages),
            *Stream.barriers(1, stages),
            # ping-pong: a rendezvous of both warpgroups; overlapped: one "your turn" barrier per warpgroup
            plgpu.Barrier(num_barriers=COMPUTE_WGS) if st.overlap else plgpu.Barrier(num_arrivals=COMPUTE_WGS),
        ),
    )
    out_type = jax.ShapeDtypeStruct(q.shape, OUT_DTYPE)
    grid = (heads, num_q_tiles, batch)
    return launch_kernel(body, out_type, scratch, grid, ("heads", "q_tiles", "batch"), q, k, vt, scales)
