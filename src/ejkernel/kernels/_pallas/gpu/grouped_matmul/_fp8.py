"""The FP8 block-scaled grouped matmul forward in Pallas Mosaic GPU (Hopper): e4m3 x e4m3 on FP8 wgmma.

lhs comes as e4m3 codes with a float32 scale per row and K step (`round_lhs_blocks`, a pre-pass at copy speed
giving `_common`'s `fp8_row_blocks` bit for bit, or that function in XLA),
the weights as e4m3 codes `[L, N, K]` with a float32 scale per K step and output column (v3's `rhs_scale`:
DeepSeek-V3's 128 x 128 blocks broadcast along N). Each 128-wide K step is one FP8 wgmma into a fresh
float32 tile, which the compute warpgroup then promotes into its accumulator in registers,
`acc += part · sa[row] · sb[col]`, so the tensor cores never see the scales (DeepGEMM's promotion). Where the
weights' scales are constant over each 128 columns (DeepSeek-V3's blocks; checked on the device per call, the
kernel holding both promotions), `acc += part · (sa[row] · sb[block])`: one FMA an element, not two operations.

8-bit wgmma operands must both be K-major: jax 0.11.2's Mosaic GPU refuses an 8-bit B that is not ("Only
f16 WGMMA supports transposes", PTX's rule: only 16-bit wgmma transposes) and TMA copies tiles as they lie,
so the weights come as `[L, N, K]` (`transpose_rhs=True`), laid out once like prepacked weights.

The schedule is `_kernel.gmm`'s (`_kernel.ForwardWalk`): persistent CTAs walking the output tiles of
`tile_items`, a memory warpgroup streaming every step with TMA into a ring of `stages` slots (lhs and weight codes
and both scale vectors), two compute warpgroups sharing each output tile (`block_m // 2` rows each), and tiles
that straddle groups merged in shared memory (`store_group_rows`); or with `spans` the spans of `row_spans`
(each follows one group from its first row rounded down to 8: one K loop, one weight scale per column and step,
only its own rows stored, `store_span_rows`), reading the row scales of whichever rows it reads (they are per
row, so a span may start at any multiple of 8). With `overlap`, each product's wgmma runs while the previous
product is promoted (the accumulator and two product tiles live); without, each wgmma is waited for before its
promotion, and the other warpgroup's wgmma keeps the tensor cores busy meanwhile. Output tiles wider than the
registers hold beside the accumulator split each step into `chunks` wgmmas over column chunks (`in_registers`:
128 x 256 tiles in two 128-column wgmmas, four 64-column ones when overlapped).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from ejkernel.kernels._common.scaled_codes import code_max
from ejkernel.kernels._pallas.gpu.grouped_matmul._kernel import (
    COMPUTE_WGS,
    SMEM_BUDGET,
    SPAN_STORE_COLS,
    ForwardWalk,
    Ring,
    forward_schedule,
    launch,
    on_compute_warpgroups,
    pad_rows,
    swizzled,
)

STEP = 128  # K per step: one scale block, rows of 128 bytes (the 128-byte swizzle)
CODES = jnp.dtype(jnp.float8_e4m3fn)
CODE_MAX = code_max(CODES)  # 448
WARPGROUP_THREADS = 128
TILE_REGISTERS = 192  # float32 tile registers a compute thread may hold (of 232: scales, addresses, the rest)
COLUMN_BLOCK = 128  # DeepSeek-V3's weight blocks: 128 x 128, their scales constant over 128 output columns
CHUNKS = (1, 2, 4)  # wgmmas per step that a tiling may split its columns into
OUT_PIECES = (1, 2, 4)  # column pieces a spans tiling may store its output tile in (each a multiple of 32 columns)
ROWS_LAYOUT = plgpu.Layout.WGMMA.reduce(1)  # a value per row of a wgmma tile
COLS_LAYOUT = plgpu.Layout.WGMMA.reduce(0)  # a value per column


@dataclasses.dataclass(frozen=True)
class MosaicGpuFp8GroupedMatmulTiling:
    """The FP8 forward's tiles (hashable: it keys the custom VJP).

    `block_m` output rows (128 or 256: two compute warpgroups of `block_m // 2` rows), `block_n` output
    columns (a multiple of 64), `stages` ring slots, `num_ctas` persistent CTAs; `overlap`: promote each
    product while the next one's wgmma runs; `chunks`: wgmmas per step, each over `block_n / chunks`
    columns (a fresh product tile no wider than the registers allow). The contraction step is `STEP`.
    `round_in_kernel`: lhs is rounded by `round_lhs_blocks` (else by XLA, `fp8_row_blocks`); `column_blocks`:
    where the weights' scales are constant over each `COLUMN_BLOCK` columns (checked per call), a product is
    promoted with one scale per row (`sa[row] · sb[block]`, one FMA an element) rather than per element.
    `spans`: the output tiles follow each group from its first row (`_kernel.gmm`'s spans: one K loop a tile, only
    its own rows stored), their untiled output tile stored in `out_pieces` column pieces through one piece of
    shared memory (room for more ring slots: 4 stages at 128 x 256 in 4 pieces).
    """

    block_m: int
    block_n: int
    stages: int
    num_ctas: int
    overlap: bool = True
    chunks: int = 1
    round_in_kernel: bool = True
    column_blocks: bool = True
    spans: bool = False
    out_pieces: int = 1

    @property
    def promotes_by_column_block(self) -> bool:
        """Whether `column_blocks` can apply: each wgmma chunk lies within one `COLUMN_BLOCK` of columns."""
        return self.column_blocks and COLUMN_BLOCK % self.chunk_cols == 0

    @property
    def pingpong(self) -> bool:
        """Never: both compute warpgroups share each output tile (what `Ring.barriers` asks)."""
        return False

    @property
    def wg_rows(self) -> int:
        return self.block_m // COMPUTE_WGS

    @property
    def chunk_cols(self) -> int:
        return self.block_n // self.chunks

    @property
    def tile_registers(self) -> int:
        """Registers per compute thread of its live float32 tiles: the accumulator, and one product tile
        (two with `overlap`: the one promoted and the one being multiplied)."""
        acc = self.wg_rows * self.block_n // WARPGROUP_THREADS
        return acc + acc // self.chunks * (2 if self.overlap else 1)

    def smem_bytes(self, out_dtype) -> int:
        """Per slot the step's codes and scale vectors; one output tile per CTA (one `out_pieces`-th of it)."""
        step = (self.block_m + self.block_n) * (STEP * CODES.itemsize + 4)
        return self.stages * step + self.block_m * self.block_n // self.out_pieces * jnp.dtype(out_dtype).itemsize

    def fits(self, out_dtype) -> bool:
        return self.smem_bytes(out_dtype) <= SMEM_BUDGET and self.tile_registers <= TILE_REGISTERS


def in_registers(t: MosaicGpuFp8GroupedMatmulTiling) -> MosaicGpuFp8GroupedMatmulTiling | None:
    """`t` in the fewest chunks (1, 2 or 4, of a multiple of 16 columns) whose tiles fit the registers; None if
    none do."""
    for chunks in CHUNKS:
        fitted = dataclasses.replace(t, chunks=chunks)
        if t.block_n % (16 * chunks) == 0 and fitted.tile_registers <= TILE_REGISTERS:
            return fitted
    return None


def fit_smem(t: MosaicGpuFp8GroupedMatmulTiling, n: int, out_dtype) -> MosaicGpuFp8GroupedMatmulTiling:
    """`t` fitted to shared memory beside an output tile of `out_dtype`: with `spans` the whole tile or, where that
    keeps more stages, column pieces of it (`OUT_PIECES`, none wider than `SPAN_STORE_COLS`); then fewer stages down
    to 2, else narrower output tiles (128 or 64 columns dividing N `n`; planning saw to it that one does)."""
    widths = [t.block_n] + [w for w in (128, 64) if w < t.block_n and n % w == 0]
    for width in widths:
        narrowed = in_registers(dataclasses.replace(t, block_n=width, out_pieces=1))
        pieces = [p for p in OUT_PIECES if width % (32 * p) == 0 and width // p <= SPAN_STORE_COLS] if t.spans else [1]
        for stages in range(t.stages, 1, -1):
            for p in pieces:
                fitted = None if narrowed is None else dataclasses.replace(narrowed, stages=stages, out_pieces=p)
                if fitted is not None and fitted.fits(out_dtype):
                    return fitted
    raise NotImplementedError(f"mosaic gpu grouped_matmul: FP8 tiles {t} do not fit ({jnp.dtype(out_dtype)} output)")


def step_scales(lhs_scales, rhs_scale, block: int, row_tiles: int):
    """The kernel's scale operands: `lhs_scales [M, K / block]` as `[K / STEP, row_tiles]` (a step's rows
    contiguous, zeros past M) and `rhs_scale [L, K / block, 1, N]` as `[L, K / STEP, N]`, float32."""
    rows = jnp.repeat(lhs_scales.astype(jnp.float32), block // STEP, axis=1).T
    rows = jnp.pad(rows, ((0, 0), (0, row_tiles - rows.shape[1])))
    return rows, step_col_scales(rhs_scale, block)


def step_col_scales(rhs_scale, block: int):
    """`rhs_scale [L, K / block, 1, N]` as the kernel's `[L, K / STEP, N]` float32 (each block's row per step)."""
    return jnp.repeat(rhs_scale[:, :, 0, :].astype(jnp.float32), block // STEP, axis=1)


def promoted_k_loop(ring: Ring, step0, steps: int, t: MosaicGpuFp8GroupedMatmulTiling, multiply, promote):
    """Compute warpgroup: the float32 `[wg_rows, block_n]` tile `Σ_s Σ_c promote(·, product_sc, slot_s, c)` over
    `steps` (static, >= 1) ring steps from `step0` and each step's `t.chunks` column chunks, each product a fresh
    wgmma tile `multiply(acc_ref, slot, c)`. With `t.overlap` each product is promoted while the next one's
    wgmma runs; a slot is handed back once its last product is promoted (its scales read)."""
    shape, chunks = (t.wg_rows, t.chunk_cols), t.chunks

    def zeros():
        return plgpu.layout_cast(jnp.zeros(shape, jnp.float32), plgpu.Layout.WGMMA)

    def product(slot, c):
        """Chunk c's product of step `slot` (whose operands have landed), waited for."""

        def scope(acc_ref):
            multiply(acc_ref, slot, c)
            return acc_ref[...]

        return pl.run_scoped(scope, plgpu.ACC(shape, jnp.float32))

    def release(slot):
        plgpu.barrier_arrive(ring.consumed.at[slot])

    def replaced(accs, c, acc):
        return (*accs[:c], acc, *accs[c + 1 :])

    if not t.overlap:

        def step(s, accs):
            slot = ring.slot(step0 + s)
            plgpu.barrier_wait(ring.ready_at(slot))
            accs = tuple(promote(accs[c], product(slot, c), slot, c) for c in range(chunks))
            release(slot)
            return accs

        accs = lax.fori_loop(0, steps, step, (zeros(),) * chunks)
    else:

        def issue(slot, c, accs, prev, prev_slot, prev_c):
            """Chunk c's wgmma of step `slot` issued, product `prev` (chunk `prev_c` of `prev_slot`) promoted
            meanwhile -> (the new product, the accumulators)."""

            def issue_then_promote(refs):
                part_ref, acc_ref = refs
                multiply(part_ref, slot, c)
                acc_ref[...] = promote(accs[prev_c], prev, prev_slot, prev_c)

            part, acc = pl.run_state(issue_then_promote)((plgpu.ACC.init(zeros()), accs[prev_c]))
            return part, replaced(accs, prev_c, acc)

        def chunks_after_first(slot, accs, prev):
            for c in range(1, chunks):
                prev, accs = issue(slot, c, accs, prev, slot, c - 1)
            return accs, prev

        def overlapped_step(s, carry):
            accs, prev = carry
            slot, prev_slot = ring.slot(step0 + s), ring.slot(step0 + s - 1)
            plgpu.barrier_wait(ring.ready_at(slot))
            prev, accs = issue(slot, 0, accs, prev, prev_slot, chunks - 1)
            release(prev_slot)
            return chunks_after_first(slot, accs, prev)

        first = ring.slot(step0)
        plgpu.barrier_wait(ring.ready_at(first))
        carry = chunks_after_first(first, (zeros(),) * chunks, product(first, 0))
        accs, last = lax.fori_loop(1, steps, overlapped_step, carry)
        last_slot = ring.slot(step0 + steps - 1)
        accs = replaced(accs, chunks - 1, promote(accs[-1], last, last_slot, chunks - 1))
        release(last_slot)
    return accs[0] if chunks == 1 else jnp.concatenate(accs, axis=1)


def column_blocks_uniform(col_scales) -> jax.Array:
    """int32 `[1]`: 1 where `col_scales [L, S, N]` is constant over each `COLUMN_BLOCK` columns (N a multiple of it).

    Behind an optimization barrier: scales closed over by a jitted function are constants, and XLA constant-folded
    this reduction for 11 s of compilation at the MoE shape on an H200 (on a CPU at that shape: 3.8 s without the
    barrier, 0.13 s with it)."""
    col_scales = lax.optimization_barrier(col_scales)
    num_local, steps, n = col_scales.shape
    blocks = col_scales.reshape(num_local, steps, n // COLUMN_BLOCK, COLUMN_BLOCK)
    return jnp.all(blocks == blocks[..., :1]).astype(jnp.int32).reshape(1)


def fp8_gmm(codes, row_scales, weights, col_scales, group_sizes, group_offset, *, m: int, out_dtype, tiling):
    """`out [m, N]`: each owned row of the e4m3 `codes [≥ m, K]` (rows past m: padding, zeros) times its group's
    e4m3 `weights [L, N, K]`ᵀ, every K step's product scaled by `row_scales [K / STEP, ≥ m]` (per row) and
    `col_scales [L, K / STEP, N]` (per column) (`step_scales`); zeros on every other row. K must be a multiple of
    `STEP`, N of `block_n`. (A span may read codes and row scales past both arrays' rows, up to its first row plus
    `block_m`: TMA reads those as zeros, and the span stores none of them.)

    With `tiling.promotes_by_column_block` (and N a multiple of `COLUMN_BLOCK`) the kernel holds both
    promotions and takes the one-scale-per-row one where `column_blocks_uniform(col_scales)` says it is exact
    (a branch on the device, no host round trip)."""
    k = codes.shape[1]
    num_local, n = weights.shape[:2]
    t = fit_smem(tiling, n, out_dtype)
    by_block = t.promotes_by_column_block and n % COLUMN_BLOCK == 0
    uniform = column_blocks_uniform(col_scales) if by_block else jnp.zeros((1,), jnp.int32)
    bm, bn, stages, rows = t.block_m, t.block_n, t.stages, t.wg_rows
    if k % STEP or n % bn or rows % 64:
        raise ValueError(f"fp8 gmm: K={k} and N={n} must be multiples of {STEP} and block_n={bn}; block_m={bm}")
    schedule, row_units = forward_schedule(group_sizes, group_offset, num_local, m, bm, t.spans)
    x = pad_rows(codes, bm)
    col_tiles, k_steps = n // bn, k // STEP
    num_units = row_units * col_tiles
    num_ctas = min(t.num_ctas, num_units)

    def body(*refs):
        schedule_refs, (uniform_ref, a_ref, sa_ref, b_ref, sb_ref, out_ref, smem, barriers) = (
            refs[: len(schedule)],
            refs[len(schedule) :],
        )
        a_smem, b_smem, sa_smem, sb_smem, o_smem = smem
        walk = ForwardWalk.start(
            t, schedule_refs, barriers, num_units=num_units, num_ctas=num_ctas, col_tiles=col_tiles, k_steps=k_steps
        )

        def copies(row0, col, g, kk):
            """Step kk's copies: the codes and row scales of the lhs rows from `row0` (a multiple of 8; the scales of
            any row are at its own index), group g's codes and column scales of column tile `col`."""
            ks, cols = pl.ds(kk * STEP, STEP), pl.ds(col * bn, bn)
            out = []
            for p in range(COMPUTE_WGS):  # each warpgroup's rows and their scales
                wg_rows = pl.ds(row0 + p * rows, rows)
                out.append((a_ref.at[wg_rows, ks], lambda slot, p=p: a_smem.at[slot * COMPUTE_WGS + p]))
                out.append((sa_ref.at[kk, wg_rows], lambda slot, p=p: sa_smem.at[slot * COMPUTE_WGS + p]))
            out.append((b_ref.at[g, cols, ks], lambda slot: b_smem.at[slot]))
            out.append((sb_ref.at[g, kk, cols], lambda slot: sb_smem.at[slot]))
            return out

        walk.feed(copies)

        @on_compute_warpgroups
        def _():
            wg = lax.axis_index("wg")
            width = t.chunk_cols

            def multiply(acc_ref, slot, c):
                b = b_smem.at[slot] if t.chunks == 1 else b_smem.at[slot, pl.ds(c * width, width)]
                plgpu.wgmma(acc_ref, a_smem.at[slot * COMPUTE_WGS + wg], b.transpose((1, 0)))

            def promote(acc, part, slot, c):
                sa = plgpu.load(sa_smem.at[slot * COMPUTE_WGS + wg], layout=ROWS_LAYOUT)
                sb = plgpu.load(sb_smem.at[slot, pl.ds(c * width, width)], layout=COLS_LAYOUT)
                return acc + part * lax.broadcast_in_dim(sa, part.shape, [0]) * lax.broadcast_in_dim(
                    sb, part.shape, [1]
                )

            def promote_by_block(acc, part, slot, c):
                """`promote` where the chunk's column scales are one value: a scale per row, one FMA an element."""
                sa = plgpu.load(sa_smem.at[slot * COMPUTE_WGS + wg], layout=ROWS_LAYOUT)
                sb = sb_smem[slot, c * width]
                return acc + part * lax.broadcast_in_dim(sa * sb, part.shape, [0])

            def output_tiles(promote):
                product = lambda ring, step: promoted_k_loop(ring, step, k_steps, t, multiply, promote)
                walk.compute(product, o_smem.at[wg], out_ref)

            if by_block:
                pl.when(uniform_ref[0] != 0)(lambda: output_tiles(promote_by_block))
                pl.when(uniform_ref[0] == 0)(lambda: output_tiles(promote))
            else:
                output_tiles(promote)

    # Spans store their rows from an untiled output tile (a store may start at any of its rows), in column pieces.
    o_shape = (COMPUTE_WGS, rows, bn // t.out_pieces)
    scratch = (
        (
            swizzled((stages * COMPUTE_WGS, rows, STEP), CODES),
            swizzled((stages, bn, STEP), CODES),
            plgpu.SMEM((stages * COMPUTE_WGS, rows), jnp.float32),
            plgpu.SMEM((stages, bn), jnp.float32),
            plgpu.SMEM(o_shape, out_dtype) if t.spans else swizzled(o_shape, out_dtype),
        ),
        Ring.barriers(
            t, 2 * COMPUTE_WGS + 2
        ),  # per step: each warpgroup's rows (codes, scales), the weights' (codes, scales)
    )
    out_type = jax.ShapeDtypeStruct((m if t.spans else x.shape[0], n), out_dtype)  # (spans write rows [0, M) only)
    out = launch(body, out_type, scratch, num_ctas, *schedule, uniform, x, row_scales, weights, col_scales)
    return out if out.shape[0] == m else out[:m]


# ---- lhs's rounding pre-pass ----

ROUND_ROWS = 64  # rows per CTA of the rounding pre-pass: one warpgroup's WGMMA-layout tile
ROUND_BLOCKS_PER_CTA = 4  # scale blocks a CTA rounds in turn (each block's load overlaps the previous one's work)
ROUND_MAX_BLOCK = 512  # widest scale block whose two slots of lhs and codes fit shared memory


def rounding_served(k: int, block: int) -> bool:
    """Whether `round_lhs_blocks` takes scale blocks of `block` K values (a multiple of `STEP` up to
    `ROUND_MAX_BLOCK` dividing `k`); wider ones go through XLA."""
    return block % STEP == 0 and block <= ROUND_MAX_BLOCK and k % block == 0


def round_lhs_blocks(lhs, block: int, code_rows: int, scale_rows: int):
    """`(codes [code_rows, K] e4m3, row_scales [K / STEP, scale_rows] float32)`: lhs's rows, each block of `block`
    K values quantised as `fp8_row_blocks` does (bit for bit: `max|x| / 448`, 1 for a zero block, `x / scale`
    saturated and rounded to nearest even), in the layout `fp8_gmm` reads (each block's scale repeated per step,
    rows past M: zero codes, scale 1). One pass at copy speed: each CTA rounds `ROUND_ROWS` rows of up to
    `ROUND_BLOCKS_PER_CTA` blocks, loading the next block (TMA) while it rounds one and stores the last."""
    m, k = lhs.shape
    if m % 8:  # TMA reads HBM in 8-row tiles
        lhs = jnp.pad(lhs, ((0, -m % 8), (0, 0)))
    steps, blocks = block // STEP, k // block
    per_cta = next(b for b in range(min(ROUND_BLOCKS_PER_CTA, blocks), 0, -1) if blocks % b == 0)
    pieces = block // STEP  # 128-column pieces: the registers hold one at a time

    def body(x_ref, codes_ref, scales_ref, x_smem, c_smem, s_smem, loaded):
        rows = pl.ds(lax.axis_index("rows") * ROUND_ROWS, ROUND_ROWS)
        first = lax.axis_index("blocks") * per_cta

        def load(j):
            cols = pl.ds((first + j) * block, block)
            plgpu.copy_gmem_to_smem(x_ref.at[rows, cols], x_smem.at[j % 2], loaded.at[j % 2])

        def piece(slot, p):
            x = x_smem.at[slot, :, pl.ds(p * STEP, STEP)]
            return plgpu.load(x, layout=plgpu.Layout.WGMMA).astype(jnp.float32)

        for j in range(min(2, per_cta)):
            load(j)
        for j in range(per_cta):  # (static: a handful of blocks)
            slot = j % 2
            plgpu.barrier_wait(loaded.at[slot])
            xs = [piece(slot, 0)] if pieces == 1 else None
            amax = None
            for p in range(pieces):
                part = jnp.max(jnp.abs(xs[0] if xs else piece(slot, p)), axis=1)
                amax = part if amax is None else jnp.maximum(amax, part)
            scale = jnp.where(amax > 0, amax / CODE_MAX, 1.0)
            plgpu.wait_smem_to_gmem(1 + steps, wait_read_only=True)  # this slot's previous stores have read it
            for p in range(pieces):
                x = xs[0] if xs else piece(slot, p)
                codes = jnp.clip(x / lax.broadcast_in_dim(scale, x.shape, [0]), -CODE_MAX, CODE_MAX)
                c_smem[slot, :, pl.ds(p * STEP, STEP)] = codes.astype(CODES)
            s_smem[slot] = scale
            plgpu.commit_smem()  # (and every thread is done reading x_smem's slot: it may be refilled)
            kk = first + j
            plgpu.copy_smem_to_gmem(c_smem.at[slot], codes_ref.at[rows, pl.ds(kk * block, block)])
            for s in range(steps):
                plgpu.copy_smem_to_gmem(s_smem.at[slot], scales_ref.at[kk * steps + s, rows])
            if j + 2 < per_cta:
                load(j + 2)
        plgpu.wait_smem_to_gmem(0)

    out_type = (
        jax.ShapeDtypeStruct((code_rows, k), CODES),
        jax.ShapeDtypeStruct((k // STEP, scale_rows), jnp.float32),
    )
    scratch = (
        swizzled((2, ROUND_ROWS, block), lhs.dtype),
        swizzled((2, ROUND_ROWS, block), CODES),
        plgpu.SMEM((2, ROUND_ROWS), jnp.float32),
        plgpu.Barrier(num_arrivals=1, num_barriers=2),
    )
    grid = (-(-max(code_rows, scale_rows) // ROUND_ROWS), blocks // per_cta)
    return plgpu.kernel(body, out_type=out_type, scratch_types=scratch, grid=grid, grid_names=("rows", "blocks"))(lhs)
