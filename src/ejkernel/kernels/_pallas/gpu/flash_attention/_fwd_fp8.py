"""The Mosaic GPU float8 (e4m3) flash attention forward: the ping-pong design of `_fwd` with 8-bit matmuls.

Q·Kᵀ is an e4m3 wgmma with float32 accumulation, the scores scaled per row by `softmax_scale · q_descale ·
k_descale` of the head; P is rounded to e4m3 for P·V (as FlashAttention-3 does; times `P_SHIFT`) and the output
multiplied by `v_descale / row sum`. 8-bit wgmma operands must be K-major, so V comes transposed (`[B, Hkv, D,
S]`, done by XLA outside) and streams as `[D, block_k]` tiles; and an 8-bit A operand in registers needs a layout
that the score tile's is not, so each warpgroup stages its P tile in shared memory, where P·V reads it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from ._parts import (
    COMPUTE_REGISTERS,
    MASKED,
    KeyTiles,
    Stream,
    along_rows,
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
P_SHIFT = 256.0
"""P enters e4m3 times 2**8 (the output divided back): weights in [0, 1] would fall under e4m3's smallest normal
(2**-6) from 0.016 down, and to zero under 0.001, a long context's tail; times 2**8 they stay normal down to 6e-5
and the largest, 256, is inside e4m3's range (448)."""


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
    bfloat16."""
    batch, q_pad_len, heads, head_dim = q.shape
    bk, stages = st.block_k, st.stages
    num_q_tiles, num_blocks = q_pad_len // CTA_ROWS, k.shape[1] // bk
    walk = KeyTiles(st, bk, num_blocks, num_q_tiles)
    row_bytes = min(128, head_dim)  # the swizzle: one row of a Q/K tile, or a fraction of a P/Vᵀ row

    def body(q_ref, k_ref, vt_ref, scale_ref, out_ref, smem, barriers):
        q_smem, k_smem, vt_smem, p_smem, o_smem, scale_smem = smem
        q_ready, k_ready, k_consumed, v_ready, v_consumed, schedule = barriers
        b, h, wg, cta = (lax.axis_index(a) for a in ("batch", "heads", "wg", "q_tiles"))
        kv_h = lax.div(h, jnp.int32(st.group))
        cta_row, lo, hi, key_row = walk.tile(cta, 0)
        streams = [
            Stream(((lambda i: k_ref.at[b, pl.ds(key_row(i), bk), kv_h], k_smem),), k_ready, k_consumed),
            Stream(((lambda i: vt_ref.at[b, kv_h, :, pl.ds(key_row(i), bk)], vt_smem),), v_ready, v_consumed),
        ]
        memory_warpgroup(lambda: feed(streams, hi - lo, stages))

        def schedule_sync():
            plgpu.barrier_arrive(schedule)
            plgpu.barrier_wait(schedule)

        @pl.when(wg < COMPUTE_WGS)
        def _():
            plgpu.set_max_registers(COMPUTE_REGISTERS, action="increase")
            row0 = cta_row + wg * ROWS
            qo, p_tile = q_smem.at[wg], p_smem.at[wg]
            plgpu.copy_gmem_to_smem(q_ref.at[b, pl.ds(row0, ROWS), h], qo, q_ready.at[wg])
            plgpu.copy_gmem_to_smem(scale_ref.at[h], scale_smem.at[wg], q_ready.at[wg])
            plgpu.barrier_wait(q_ready.at[wg])
            logit_scale = plgpu.load(scale_smem.at[wg, 0], layout=plgpu.Layout.WGMMA.reduce(1))
            v_scale = plgpu.load(scale_smem.at[wg, 1], layout=plgpu.Layout.WGMMA.reduce(1))

            def slot_of(t):
                return lax.rem(t - lo, jnp.int32(stages))

            def scores(slot):
                """S = Q·K_slotᵀ; while it runs, the other warpgroup's softmax does (ping-pong)."""

                def qk(acc_ref):
                    plgpu.wgmma(acc_ref, qo, k_smem.at[slot].transpose((1, 0)))
                    schedule_sync()
                    return acc_ref[...]

                return pl.run_scoped(qk, plgpu.ACC((ROWS, bk), jnp.float32))

            def step(mode, t, carry):
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
                s = s * along_rows(logit_scale, s.shape)  # base-2 logits (any sign of the descales)
                s = walk.mask(s, row0, t) if mode == "masked" else s
                m_new = jnp.maximum(m, s.max(axis=1))
                p = jnp.exp2(s - along_rows(m_new, s.shape))
                alpha = jnp.exp2(m - m_new)
                denom = denom * alpha + p.sum(axis=1)
                acc = acc * along_rows(alpha, acc.shape)
                p_tile[...] = (p * P_SHIFT).astype(jnp.float8_e4m3fn)
                plgpu.commit_smem()  # P's stores before the wgmma that reads them
                acc, denom, m_new = lax.optimization_barrier((acc, denom, m_new))
                plgpu.barrier_arrive(schedule)  # softmax done: the other warpgroup's Q·Kᵀ may start
                plgpu.barrier_wait(v_ready.at[slot])
                plgpu.barrier_wait(schedule)
                (acc,) = pl.run_state(lambda refs: plgpu.wgmma(refs[0], p_tile, vt_smem.at[slot].transpose((1, 0))))(
                    (plgpu.ACC.init(acc),)
                )
                plgpu.barrier_arrive(v_consumed.at[slot])
                return acc, m_new, denom

            m = plgpu.layout_cast(jnp.full((ROWS,), MASKED, jnp.float32), plgpu.Layout.WGMMA.reduce(1))
            denom = plgpu.layout_cast(jnp.zeros((ROWS,), jnp.float32), plgpu.Layout.WGMMA.reduce(1))
            acc = zero_acc((ROWS, head_dim))
            pl.when(wg == 1)(schedule_sync)
            acc, m, denom = run_segments(step, (acc, m, denom), lo, *walk.own(row0), hi)
            pl.when(wg == 0)(schedule_sync)
            empty = m < MASKED / 2  # no allowed key: output 0
            inv = jnp.where(empty, 0.0, v_scale / jnp.where(empty, 1.0, denom * P_SHIFT))
            o_smem.at[wg][...] = (acc * along_rows(inv, acc.shape)).astype(OUT_DTYPE)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(o_smem.at[wg], out_ref.at[b, pl.ds(row0, ROWS), h])
            plgpu.wait_smem_to_gmem(0)

    scratch = (
        (
            byte_smem((COMPUTE_WGS, ROWS, head_dim), row_bytes),
            byte_smem((stages, bk, head_dim), row_bytes),
            byte_smem((stages, head_dim, bk), row_bytes),
            byte_smem((COMPUTE_WGS, ROWS, bk), row_bytes),
            swizzled_smem((COMPUTE_WGS, ROWS, head_dim), OUT_DTYPE),
            plgpu.SMEM((COMPUTE_WGS, 2, ROWS), jnp.float32),
        ),
        (
            plgpu.Barrier(num_arrivals=2, num_barriers=COMPUTE_WGS),  # a warpgroup's q tile and scales
            *Stream.barriers(1, stages),
            *Stream.barriers(1, stages),
            plgpu.Barrier(num_arrivals=COMPUTE_WGS),  # ping-pong: a rendezvous of both warpgroups
        ),
    )
    out_type = jax.ShapeDtypeStruct(q.shape, OUT_DTYPE)
    grid = (heads, num_q_tiles, batch)
    return launch_kernel(body, out_type, scratch, grid, ("heads", "q_tiles", "batch"), q, k, vt, scales)
