"""MLA decode over a paged latent cache as one Mosaic GPU kernel (Hopper): wgmma on TMA-fed cache pages.

A CTA takes `ROWS` = 64 query rows of one tile of `_common.paged_attention.tiles`: 64 heads of one query token,
or, for fewer heads (a tensor-parallel shard of DeepSeek-V3's 128 heads holds 16 or 32), the heads of `64 / heads`
consecutive queries of one sequence (rows query-major), each row then masked by its own query's position. It walks
its share of the tile's key span in blocks of `BLOCK` = 64 cache rows, each inside one page (the page size is a
multiple of 64), so a block is a few TMA copies whose page the memory warpgroup reads from the page table. A cache
row is `[c (L), 0..., r (R), 0...]`; a block arrives as three shared-memory tiles: the two halves of `c` and `r`
(the zero padding is never read).
The query rows arrive the same way, once.

Two compute warpgroups share the block, each accumulating its own half of the output, `O_w += P·c_w` (64 x L/2
float32 in registers; the keys' latent rows are the values), in one of two schedules
(`MosaicGpuLatentPagedTiling.shared_scores`): both compute the whole score tile `S = q_c·cᵀ + q_r·rᵀ` (64 x 64)
and its online softmax (the same numbers in both: nothing is exchanged, but S's matmul is done twice); or
warpgroup 0 alone computes S and the softmax and publishes P (bf16) and the rows' rescale through shared memory,
P in the block's `r` tile when it has P's shape (R = 64: S, its only reader, is done with it), and warpgroup 1
waits for them. A slot's P and rescale are read before the slot is handed back, so they need no barrier of their
own to be overwritten. The softmax is in base 2 with a finite mask value, as the flash attention kernels'
(`flash_attention._parts`).

The span is cut in `num_splits` near-equal runs of blocks (flash-decoding); each CTA writes its rows
normalised (in the cache's dtype, through the query's shared-memory tiles) and their log-sum-exp (natural
units, -inf where no key was allowed), which the caller merges with the shared `finalize`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from ejkernel.kernels._common.attention import LOG2E
from ejkernel.kernels._common.paged_attention.tiles import CONTEXT, FIRST, HI, LO, SEQ
from ejkernel.kernels._pallas.gpu.flash_attention._parts import (
    COMPUTE_REGISTERS,
    MASKED,
    along_rows,
    launch_kernel,
    memory_warpgroup,
    swizzled_smem,
    wgmma_iota,
    zero_acc,
)
from ejkernel.kernels._pallas.gpu.flash_attention._tiling import COMPUTE_WGS, ROWS

BLOCK = 64  # cache rows per step: a page, or a 64-row part of one
SMEM_ALIGNMENT = 1024  # of each shared-memory allocation (Mosaic GPU's)
MOSAIC_RESERVED_SMEM = 2048  # what Mosaic GPU adds to a kernel's own shared memory (as its budget errors count it)


@dataclasses.dataclass(frozen=True)
class MosaicGpuLatentPagedStatic:
    """The call's widths, heads, cache pages and softmax options (hashable: fixed at trace time)."""

    latent: int  # L: the latent row c, columns [0, L) of a cache row; a multiple of 128
    rope: int  # R: the RoPE key r, columns [rope_col, rope_col + R); a multiple of 64, or 0
    rope_col: int
    num_heads: int  # a multiple of ROWS, or a divisor
    page_size: int  # a multiple of BLOCK
    num_pages: int
    softmax_scale: float
    soft_cap: float | None
    queries: int = 1  # queries of a tile (ROWS // num_heads where fewer heads than ROWS)
    causal: bool = True  # the rows' own masks, where a tile holds several queries
    window: tuple[int, int] | None = None

    @property
    def half(self) -> int:
        """The output columns of one compute warpgroup."""
        return self.latent // 2

    @property
    def tile_rows(self) -> int:
        """A tile's query rows: its queries' heads."""
        return self.queries * self.num_heads


@dataclasses.dataclass(frozen=True)
class MosaicGpuLatentPagedTiling:
    """The kernel's key splits, pipeline depth and schedule (none changes a result beyond float32 summation order)."""

    num_splits: int  # runs each tile's key span is cut in, merged by log-sum-exp
    stages: int  # shared-memory slots of cache blocks (one loads while another computes)
    shared_scores: bool = False  # warpgroup 0 alone computes S and the softmax and hands P to warpgroup 1


def smem_bytes(st: MosaicGpuLatentPagedStatic, t: MosaicGpuLatentPagedTiling, itemsize: int) -> int:
    """Shared memory of a CTA as Mosaic GPU lays it out: the query tiles, `stages` cache blocks, float32 rows (and P
    tiles of its own), each allocation aligned to `SMEM_ALIGNMENT`, then the barriers and Mosaic's reserve."""
    tile = lambda rows, cols, count=1: count * rows * cols * itemsize
    sizes = [tile(ROWS, st.half, 2), tile(BLOCK, st.half, 2 * t.stages), (t.stages + 2) * ROWS * 4]
    if st.rope:
        sizes += [tile(ROWS, st.rope), tile(BLOCK, st.rope, t.stages)]
    if t.shared_scores and st.rope != BLOCK:  # (else P goes into the block's r tile)
        sizes.append(tile(ROWS, BLOCK, t.stages))
    barriers = 2 + 2 * t.stages + t.shared_scores * t.stages
    return sum(-(-size // SMEM_ALIGNMENT) * SMEM_ALIGNMENT for size in sizes) + 8 * barriers + MOSAIC_RESERVED_SMEM


def partial_sums(st: MosaicGpuLatentPagedStatic, t: MosaicGpuLatentPagedTiling, meta, tables, q_rows, cache_rows):
    """`(out [S, R * Hq, L], lse [S, R * Hq])` of each split: the rows normalised (cache dtype) and their
    log-sum-exp (float32, natural units, -inf where no key was allowed).

    `meta [R, 5]` are the tiles of one query each (`prepare_tiles`), `tables [N, W]` the page tables,
    `q_rows [R * Hq, width]` the tiles' query rows in the cache row's layout, `cache_rows [pages * page_size,
    width]` the updated cache.
    """
    dtype = cache_rows.dtype
    splits, stages, half, rope = t.num_splits, t.stages, st.half, st.rope
    num_tiles = meta.shape[0]
    copies = 2 + bool(rope)  # TMA copies of a block (and of the query rows): two halves of c, and r

    def body(meta_ref, tables_ref, q_ref, cache_ref, out_ref, lse_ref, smem, barriers):
        q_lat, k_lat, rows_smem, *rest = smem  # rows_smem: alpha of each slot, then log-sum-exp, 1 / denominator
        rope_smem = rest[:2] if rope else ()
        q_ready, k_ready, k_consumed, done, *p_ready = barriers
        p_ready = p_ready[0] if p_ready else None
        lse_row, inv_row = stages, stages + 1

        def p_tile(slot):
            """Where warpgroup 0 publishes step's P (`shared_scores`): the block's r tile when it has P's shape
            (S, its one reader, is done with it), else a tile of P's own."""
            return rope_smem[1].at[slot] if rope == BLOCK else rest[-1].at[slot]

        head_block, tile, split = (lax.axis_index(a) for a in ("heads", "tiles", "splits"))
        wg = lax.axis_index("wg")
        seq, lo, hi = meta_ref[tile, SEQ], meta_ref[tile, LO], meta_ref[tile, HI]
        if st.queries > 1:  # the position of the tile's first query, for the rows' own masks
            first_pos = meta_ref[tile, CONTEXT] + meta_ref[tile, FIRST]
        q_row = tile * st.tile_rows + head_block * ROWS

        # This split's blocks: the span's blocks cut in `splits` near-equal runs.
        block = jnp.int32(BLOCK)
        first = lax.div(jnp.maximum(lo, 0), block)
        last = jnp.where(hi > lo, lax.div(hi + (BLOCK - 1), block), first)
        per_split = lax.div(last - first + (splits - 1), jnp.int32(splits))
        start = first + split * per_split
        steps = jnp.clip(last - start, 0, per_split)

        def page_row(i):
            """The first cache row of step i's block, and whether its page is in the cache."""
            pos = (start + i) * block
            entry = tables_ref[seq, lax.div(pos, jnp.int32(st.page_size))]
            page = jnp.clip(entry, 0, st.num_pages - 1)
            in_cache = (entry >= 0) & (entry < st.num_pages)
            return page * st.page_size + lax.rem(pos, jnp.int32(st.page_size)), in_cache

        def parts(ref, rows):
            """The row block's (c first half, c second half[, r]) as TMA sources."""
            sources = [ref.at[rows, pl.ds(h * half, half)] for h in range(2)]
            return sources + ([ref.at[rows, pl.ds(st.rope_col, rope)]] if rope else [])

        def feed():
            """The memory warpgroup: the query rows once, then the blocks into slot `i % stages`."""
            q_dst = [q_lat.at[0], q_lat.at[1], *([rope_smem[0]] if rope else [])]
            for source, dst in zip(parts(q_ref, pl.ds(q_row, ROWS)), q_dst, strict=True):
                plgpu.copy_gmem_to_smem(source, dst, q_ready)

            @pl.loop(0, steps)
            def _(i):
                slot = lax.rem(i, jnp.int32(stages))
                row = page_row(i)[0]  # (the table read issued before the wait, which hides its latency)
                pl.when(i >= stages)(lambda: plgpu.barrier_wait(k_consumed.at[slot]))
                dst = [k_lat.at[2 * slot], k_lat.at[2 * slot + 1], *([rope_smem[1].at[slot]] if rope else [])]
                for source, buffer in zip(parts(cache_ref, pl.ds(row, BLOCK)), dst, strict=True):
                    plgpu.copy_gmem_to_smem(source, buffer, k_ready.at[slot])

        memory_warpgroup(feed)

        @pl.when(wg < COMPUTE_WGS)
        def _():
            plgpu.set_max_registers(COMPUTE_REGISTERS, action="increase")
            plgpu.barrier_wait(q_ready)

            def scores(slot):
                def qk(s_ref):
                    for h in range(2):
                        plgpu.wgmma(s_ref, q_lat.at[h], k_lat.at[2 * slot + h].transpose((1, 0)))
                    if rope:
                        plgpu.wgmma(s_ref, rope_smem[0], rope_smem[1].at[slot].transpose((1, 0)))
                    return s_ref[...]

                return pl.run_scoped(qk, plgpu.ACC((ROWS, BLOCK), jnp.float32))

            def softmax(i, slot, in_cache, m, denom):
                """Step i's scores (its block in `slot`; `in_cache`: its page is) -> (P, new row max, new
                denominator, rescale of the old)."""
                s = scores(slot)
                if st.soft_cap is None:
                    s = s * (st.softmax_scale * LOG2E)
                else:
                    s = jnp.tanh(s * (st.softmax_scale / st.soft_cap)) * (st.soft_cap * LOG2E)
                pos = (start + i) * block + wgmma_iota(s.shape, 1)
                allowed = (pos >= jnp.where(in_cache, lo, hi)) & (pos < hi)
                if st.queries > 1:  # [lo, hi) is the span of all the tile's queries; each row keeps its own
                    q_pos = first_pos + lax.div(wgmma_iota(s.shape, 0), jnp.int32(st.num_heads))
                    if st.causal:
                        allowed &= pos <= q_pos
                    if st.window is not None:
                        allowed &= (pos >= q_pos - st.window[0]) & (pos <= q_pos + st.window[1])
                s = jnp.where(allowed, s, MASKED)
                m_new = jnp.maximum(m, s.max(axis=1))
                p = jnp.exp2(s - along_rows(m_new, s.shape))
                alpha = jnp.exp2(m - m_new)
                return p.astype(dtype), m_new, denom * alpha + p.sum(axis=1), alpha

            def add_pv(acc, alpha, p, slot, w):
                """`acc * alpha + P·c_w` of the block in `slot` (P in registers or shared memory), waited for."""
                acc = acc * along_rows(alpha, acc.shape)
                (acc,) = pl.run_state(lambda refs: plgpu.wgmma(refs[0], p, k_lat.at[2 * slot + w]))(
                    (plgpu.ACC.init(acc),)
                )
                return acc

            def both_step(i, carry):
                """Both warpgroups: S and its softmax, then P·c of this warpgroup's half."""
                acc, m, denom = carry
                slot, in_cache = lax.rem(i, jnp.int32(stages)), page_row(i)[1]  # (the table read before the wait)
                plgpu.barrier_wait(k_ready.at[slot])
                p, m, denom, alpha = softmax(i, slot, in_cache, m, denom)
                acc = add_pv(acc, alpha, p, slot, wg)
                plgpu.barrier_arrive(k_consumed.at[slot])
                return acc, m, denom

            def scoring_step(i, carry):
                """Warpgroup 0 (`shared_scores`): S, its softmax, P and the rescale published, then P·c₀."""
                acc, m, denom = carry
                slot, in_cache = lax.rem(i, jnp.int32(stages)), page_row(i)[1]  # (the table read before the wait)
                plgpu.barrier_wait(k_ready.at[slot])
                p, m, denom, alpha = softmax(i, slot, in_cache, m, denom)
                # (the slot's last P and alpha were read before the slot was refilled, which k_ready said)
                p_tile(slot)[...] = p
                rows_smem.at[slot][...] = alpha
                plgpu.commit_smem()  # P's stores before warpgroup 1's wgmma reads them
                plgpu.barrier_arrive(p_ready.at[slot])
                acc = add_pv(acc, alpha, p, slot, 0)
                plgpu.barrier_arrive(k_consumed.at[slot])
                return acc, m, denom

            def weighing_step(i, acc):
                """Warpgroup 1 (`shared_scores`): the published P and rescale, then P·c₁."""
                slot = lax.rem(i, jnp.int32(stages))
                plgpu.barrier_wait(k_ready.at[slot])
                plgpu.barrier_wait(p_ready.at[slot])
                acc = add_pv(acc, plgpu.load(rows_smem.at[slot], layout=row_layout), p_tile(slot), slot, 1)
                plgpu.barrier_arrive(k_consumed.at[slot])
                return acc

            def row_stats(m, denom):
                """(1 / denominator, log-sum-exp in natural units): 0 and -inf for a row with no allowed key."""
                empty = m < MASKED / 2
                denom = jnp.where(empty, 1.0, denom)
                return jnp.where(empty, 0.0, 1.0 / denom), jnp.where(empty, -jnp.inf, m / LOG2E + jnp.log(denom))

            def write(acc, inv, w):
                """Warpgroup w's half of the output, normalised, through its query tile (once no one reads Q)."""
                q_lat.at[w][...] = (acc * along_rows(inv, acc.shape)).astype(dtype)
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(q_lat.at[w], out_ref.at[split, pl.ds(q_row, ROWS), pl.ds(w * half, half)])

            def write_lse(lse):
                rows_smem.at[lse_row][...] = lse
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(rows_smem.at[lse_row], lse_ref.at[split, pl.ds(q_row, ROWS)])

            def rendezvous():
                plgpu.barrier_arrive(done)
                plgpu.barrier_wait(done)

            row_layout = plgpu.Layout.WGMMA.reduce(1)
            m = plgpu.layout_cast(jnp.full((ROWS,), MASKED, jnp.float32), row_layout)
            denom = plgpu.layout_cast(jnp.zeros((ROWS,), jnp.float32), row_layout)
            acc = zero_acc((ROWS, half))
            if not t.shared_scores:
                acc, m, denom = lax.fori_loop(0, steps, both_step, (acc, m, denom))
                inv, lse = row_stats(m, denom)
                rendezvous()  # both warpgroups are past their last read of Q
                write(acc, inv, wg)
                pl.when(wg == 0)(lambda: write_lse(lse))
                plgpu.wait_smem_to_gmem(0)
                return

            @pl.when(wg == 0)
            def _():
                acc0, m0, denom0 = lax.fori_loop(0, steps, scoring_step, (acc, m, denom))
                inv, lse = row_stats(m0, denom0)
                rows_smem.at[inv_row][...] = inv
                rendezvous()  # warpgroup 0 is past its last read of Q; warpgroup 1 may read 1 / denominator
                write(acc0, inv, 0)
                write_lse(lse)
                plgpu.wait_smem_to_gmem(0)

            @pl.when(wg == 1)
            def _():
                acc1 = lax.fori_loop(0, steps, weighing_step, acc)
                rendezvous()
                write(acc1, plgpu.load(rows_smem.at[inv_row], layout=row_layout), 1)
                plgpu.wait_smem_to_gmem(0)

    rope_scratch = (swizzled_smem((ROWS, rope), dtype), swizzled_smem((stages, BLOCK, rope), dtype)) if rope else ()
    shared = t.shared_scores
    own_p = (swizzled_smem((stages, ROWS, BLOCK), dtype),) if shared and rope != BLOCK else ()
    scratch = (
        (
            swizzled_smem((2, ROWS, half), dtype),  # the query rows' halves of c; at the end, the output's
            swizzled_smem((2 * stages, BLOCK, half), dtype),  # block halves of c: slot s at 2s, 2s + 1
            plgpu.SMEM((stages + 2, ROWS), jnp.float32),
            *rope_scratch,  # the query rows' r, and the blocks' r
            *own_p,
        ),
        (
            plgpu.Barrier(num_arrivals=copies),
            plgpu.Barrier(num_arrivals=copies, num_barriers=stages),
            plgpu.Barrier(num_arrivals=COMPUTE_WGS, num_barriers=stages),
            plgpu.Barrier(num_arrivals=COMPUTE_WGS),
            *((plgpu.Barrier(num_barriers=stages),) if shared else ()),  # P (and alpha) of a slot published
        ),
    )
    rows = num_tiles * st.tile_rows
    out_type = (
        jax.ShapeDtypeStruct((splits, rows, st.latent), dtype),
        jax.ShapeDtypeStruct((splits, rows), jnp.float32),
    )
    grid = (st.tile_rows // ROWS, num_tiles, splits)
    return launch_kernel(body, out_type, scratch, grid, ("heads", "tiles", "splits"), meta, tables, q_rows, cache_rows)
