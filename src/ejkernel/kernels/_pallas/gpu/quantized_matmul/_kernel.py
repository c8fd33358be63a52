"""The weight-only quantized matmul for decoding as one Mosaic GPU kernel (Hopper): the weights are wgmma's M side.

With few rows of x (decode: M up to 64), `y = x W` is computed transposed, `yᵀ [N, M] = Wᵀ [N, K] · xᵀ [K, M]`
("swap AB"): 64 output features fill a wgmma's M and the tokens are its N (a multiple of 16, x padded), so no
tensor-core row is wasted on padding and each accumulator is a few registers. A CTA owns `COMPUTE_WGS` x 64
features and walks its split of the contraction in steps of `block_k`. A memory warpgroup streams each step's
packed codes (one `[64, block_k]` or `[block_k, 64]` byte tile per compute warpgroup) and x's `[M, block_k]` tile
by TMA into a ring of `stages` shared-memory slots, so the HBM stream never waits on the arithmetic.

A compute warpgroup decodes its byte tile in registers: loaded in `WGMMA_UPCAST_2X` (32-bit shared-memory reads,
one shuffle to reach wgmma's layout), widened to 16 bits by the hardware's paths (int8 codes flipped to signed,
`codes ^ 0x80 = q - 128`, then the prmt/sub conversion to bf16; E4M3 codes by `cvt` to f16), then scaled in float32
(`q·s + o` with the group's scale and offset: affine `o = (128 - z)·s`, the 128 the flip took off) and rounded to
x's dtype, as the reference rounds its dequantized tile. The scales (and zeros) come straight from global memory
into row vectors (`WGMMA.reduce(1)`) before the step's wait, and are spread over their groups by broadcasts and a
concatenation of register tiles (no arithmetic).
- `transpose=True` (codes `[N, K]`, K contiguous): the decoded tile `[64 features, block_k]` is wgmma's A operand
  in registers;
- `transpose=False` (codes `[K, N]`, N contiguous): the decoded tile `[block_k, 64 features]` is stored to one of
  the warpgroup's two shared-memory tiles (step parity) and read by wgmma transposed (jax 0.11.2 loads 8-bit tiles
  in no transposed register layout). Decoding into `[64, block_k]` untransposed instead (or the unswapped product,
  x padded to 64 rows as A and the decoded `[block_k, 128..256]` tile as B) takes the same loads, conversions and
  stores per byte: the orientation of the stored tile is the one TMA gives either way.
The steps overlap inside a warpgroup: step i's wgmmas are issued asynchronously, step i + 1 is decoded while they
run, then the warpgroup waits for them and frees step i's ring slot. Step i's register operand is kept live through
that wait (an optimization barrier), so that the decode never reuses the registers wgmma still reads (ptxas would
serialise every wgmma).

Affine codes with transpose and groups of a multiple of 64, at few tokens (`scale_after`), skip the per-value
arithmetic: a group's value is `q'·s + o` (q' the flipped code, exact in 16 bits), so its part of the product is
`s·(q'·x) + o·Σx`. The codes are only converted (int8 to x's dtype) and multiplied group by group into their own
accumulators; after the wait each is scaled and offset in float32 (`Σx` per group comes precomputed, `x_sums`).
That costs 2 FMAs per `64 x tokens` product instead of the scaling of `64 x group` codes, and rounds nothing to x's
dtype but x (the reference rounds each dequantized value). Without transpose the groups run along the features, so
a code's scale changes along the contraction and cannot leave the product; folding it into x instead (x scaled per
step and group as wgmma's B) would scale a `[tokens, block_k]` tile per warpgroup, which at 16 tokens has no wgmma
register layout (and at 64 tokens is as many values as the codes).
Each split writes its float32 partial `yᵀ` tile; the caller adds the splits and transposes (M x N floats).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from ejkernel.kernels._common.code_bits import e4m3, pow2
from ejkernel.quantization.modes import QuantParams

ROWS = 64  # output features per compute warpgroup: the M of one wgmma
COMPUTE_WGS = 2
CTA_FEATURES = COMPUTE_WGS * ROWS
TOKEN_ALIGN = 16  # x's rows are padded to a multiple of this: wgmma's N
COMPUTE_REGISTERS = 232  # 2 x 128 x 232 + 128 x 40 registers fill the 64K register file
MEMORY_REGISTERS = 40
SMEM_ALIGNMENT = 1024  # of each shared-memory allocation (Mosaic GPU's)
MOSAIC_RESERVED_SMEM = 2048  # what Mosaic GPU adds to a kernel's own shared memory
DECODED_BUFFERS = 2  # decoded tiles a warpgroup keeps without transpose: one being read by wgmma, one written
FLIP = 128  # int8 codes are flipped to signed (q ^ 0x80 = q - 128) for the fast int8 -> bf16 conversion


@dataclasses.dataclass(frozen=True)
class MosaicGpuQuantizedMatmulStatic:
    """What the kernel fixes at trace time: the format, the layout, the sizes (x's rows padded to `tokens`), and
    whether the group scales apply after the product (`scale_after`: affine codes with transpose, see the module)."""

    params: QuantParams
    transpose: bool
    k: int
    n: int
    tokens: int
    x_dtype: jnp.dtype
    scale_after: bool = False


@dataclasses.dataclass(frozen=True)
class MosaicGpuQuantizedMatmulTiling:
    """Contraction per step, shared-memory slots of the ring, and contraction splits (float32 partials)."""

    block_k: int
    stages: int
    splits: int


def _swizzled(shape, dtype, row_bytes: int):
    """Shared memory in the swizzled layout TMA and wgmma use, for rows of `row_bytes` bytes (32 to 128)."""
    swizzle = min(row_bytes, 128)
    elems = swizzle // jnp.dtype(dtype).itemsize
    return plgpu.SMEM(shape, dtype, transforms=(plgpu.TilingTransform((8, elems)), plgpu.SwizzleTransform(swizzle)))


def code_tile_shape(st: MosaicGpuQuantizedMatmulStatic, block_k: int) -> tuple[int, int]:
    """A compute warpgroup's byte tile of one step: `[64, block_k]` with transpose, else `[block_k, 64]`."""
    return (ROWS, block_k) if st.transpose else (block_k, ROWS)


def smem_bytes(st: MosaicGpuQuantizedMatmulStatic, t: MosaicGpuQuantizedMatmulTiling) -> int:
    """Shared memory of a CTA as Mosaic GPU lays it out: the ring (x and code tiles), the output tiles, the decoded
    tiles (without transpose), each allocation aligned to `SMEM_ALIGNMENT`, then the barriers and Mosaic's reserve."""
    itemsize = jnp.dtype(st.x_dtype).itemsize
    sizes = [t.stages * st.tokens * t.block_k * itemsize, t.stages * COMPUTE_WGS * ROWS * t.block_k]
    sizes += [COMPUTE_WGS * ROWS * st.tokens * 4] + (
        [] if st.transpose else [DECODED_BUFFERS * COMPUTE_WGS * t.block_k * ROWS * itemsize]
    )
    aligned = sum(-(-size // SMEM_ALIGNMENT) * SMEM_ALIGNMENT for size in sizes)
    return aligned + 16 * t.stages + MOSAIC_RESERVED_SMEM


def _row_vector(ref, rows, col):
    """`ref[rows, col]` as a vector along the rows of a wgmma-layout tile (straight from global memory)."""
    return plgpu.load(ref.at[rows, col], layout=plgpu.Layout.WGMMA.reduce(1), optimized=False)


def _group_meta(params: QuantParams, s_ref, z_ref, rows, group):
    """`(scale, offset)` row vectors (float32) of one group: a value is `code · scale + offset`, codes as the
    kernel widens them (int8 flipped by `FLIP`); offset None where the mode has none."""
    raw = _row_vector(s_ref, rows, group)
    if params.mode == "affine":
        scale = raw.astype(jnp.float32)
        return scale, (FLIP - _row_vector(z_ref, rows, group).astype(jnp.float32)) * scale
    if params.mode.startswith("mx"):
        return pow2(raw.astype(jnp.int32)), None
    if params.mode.startswith("nv"):
        return e4m3(raw.astype(jnp.int32)), None
    return raw.astype(jnp.float32), None


def _column_vector(ref, row):
    """`ref[row, :]` as a vector along the columns of a wgmma-layout tile (straight from global memory)."""
    return plgpu.load(ref.at[row], layout=plgpu.Layout.WGMMA.reduce(0), optimized=False)


def _zeros(shape):
    """float32 zeros in the WGMMA layout (an accumulator's start)."""
    return plgpu.layout_cast(jnp.zeros(shape, jnp.float32), plgpu.Layout.WGMMA)


def _spread(vectors, shape):
    """Group row vectors `[(R,), ...]` spread over a `[R, C]` tile whose columns hold `len(vectors)` groups."""
    if len(vectors) == 1:
        return lax.broadcast_in_dim(vectors[0], shape, [0])
    cols = shape[1] // len(vectors)
    return jnp.concatenate([lax.broadcast_in_dim(v, (shape[0], cols), [0]) for v in vectors], axis=1)


def part_width(st: MosaicGpuQuantizedMatmulStatic, t: MosaicGpuQuantizedMatmulTiling) -> int:
    """Contraction of one group's product within a step where the scales apply after it: a group, or the step."""
    return min(st.params.group_size, t.block_k)


def _signed_codes(st: MosaicGpuQuantizedMatmulStatic, codes_ref):
    """The step's int8 codes flipped to signed (`q - FLIP`, exact in 16 bits) in x's dtype, in the WGMMA layout."""
    codes = plgpu.load(codes_ref, layout=plgpu.Layout.WGMMA_UPCAST_2X)
    wide = lax.bitcast_convert_type(codes ^ jnp.uint8(0x80), jnp.int8).astype(st.x_dtype)
    return plgpu.layout_cast(wide, plgpu.Layout.WGMMA)


def _decode(st: MosaicGpuQuantizedMatmulStatic, codes_ref, metas):
    """The step's byte tile decoded to x's dtype in the WGMMA layout; `metas`: `(scale, offset)` per group."""
    params = st.params
    if params.mode == "affine":
        codes = plgpu.load(codes_ref, layout=plgpu.Layout.WGMMA_UPCAST_2X)
        wide = lax.bitcast_convert_type(codes ^ jnp.uint8(0x80), jnp.int8).astype(jnp.bfloat16)
    else:  # E4M3 codes, viewed as float8_e4m3fn
        wide = plgpu.load(codes_ref, layout=plgpu.Layout.WGMMA_UPCAST_2X).astype(jnp.float16)
    values = plgpu.layout_cast(wide, plgpu.Layout.WGMMA).astype(jnp.float32)
    shape = values.shape
    values = values * _spread([m[0] for m in metas], shape)
    if metas[0][1] is not None:
        values = values + _spread([m[1] for m in metas], shape)
    return values.astype(st.x_dtype)


def partial_products(
    st: MosaicGpuQuantizedMatmulStatic, t: MosaicGpuQuantizedMatmulTiling, x, codes, scales, zeros, x_sums=None
):
    """float32 `[splits, N, tokens]`: each contraction split's part of `yᵀ`.

    `x [tokens, K]` (padded rows zero), `codes` the weights' bytes (`[N, K]` with transpose, else `[K, N]`; uint8,
    or float8_e4m3fn for E4M3 codes), `scales` (and affine `zeros`) as the public layout has them; with
    `st.scale_after`, `x_sums [K / part_width, tokens]` float32: x summed over each part of the contraction.
    """
    params, bk, stages, splits = st.params, t.block_k, t.stages, t.splits
    g = params.group_size
    total = st.k // bk
    per_split = -(-total // splits)
    tile_cols = code_tile_shape(st, bk)[1]  # the code tile's columns, along which groups run
    groups = max(1, tile_cols // g)  # groups in a tile's columns (or 1: the tile lies inside one)
    width = part_width(st, t)
    affine = params.mode == "affine"

    def body(*refs):
        x_ref, w_ref, s_ref = refs[:3]
        z_ref = refs[3] if affine else None
        sums_ref = refs[-4] if st.scale_after else None
        out_ref, (x_smem, w_smem, out_smem, *decoded), (ready, consumed) = refs[-3:]
        col_block, split, wg = lax.axis_index("cols"), lax.axis_index("splits"), lax.axis_index("wg")
        start = split * per_split
        steps = jnp.clip(total - start, 0, per_split)

        def code_source(step, w):
            f0, k0 = col_block * CTA_FEATURES + w * ROWS, (start + step) * bk
            if st.transpose:
                return w_ref.at[pl.ds(f0, ROWS), pl.ds(k0, bk)]
            return w_ref.at[pl.ds(k0, bk), pl.ds(f0, ROWS)]

        @pl.when(wg == COMPUTE_WGS)
        def _():
            plgpu.set_max_registers(MEMORY_REGISTERS, action="decrease")

            @pl.loop(0, steps)
            def _(i):
                slot = lax.rem(i, jnp.int32(stages))
                pl.when(i >= stages)(lambda: plgpu.barrier_wait(consumed.at[slot]))
                plgpu.copy_gmem_to_smem(x_ref.at[:, pl.ds((start + i) * bk, bk)], x_smem.at[slot], ready.at[slot])
                for w in range(COMPUTE_WGS):
                    plgpu.copy_gmem_to_smem(code_source(i, w), w_smem.at[slot, w], ready.at[slot])

        @pl.when(wg < COMPUTE_WGS)
        def _():
            plgpu.set_max_registers(COMPUTE_REGISTERS, action="increase")
            f0 = col_block * CTA_FEATURES + wg * ROWS

            def metas(step):
                """The step's `(scale, offset)` row vectors, one per group of the code tile's columns."""
                k0 = (start + step) * bk
                if st.transpose:  # rows: the warpgroup's features; groups along K
                    rows, first = pl.ds(f0, ROWS), lax.div(k0, jnp.int32(g))
                else:  # rows: the step's K; groups along the features
                    rows, first = pl.ds(k0, bk), lax.div(f0, jnp.int32(g))
                return [_group_meta(params, s_ref, z_ref, rows, first + j) for j in range(groups)]

            def slot_of(i):
                return lax.rem(i, jnp.int32(stages))

            def own_buffer(i):
                """Step i's decoded tile without transpose: the warpgroup's buffer i % 2 (one traced index)."""
                return decoded[0].at[DECODED_BUFFERS * wg + lax.rem(i, jnp.int32(DECODED_BUFFERS))]

            def decode_step(i):
                """Step i's weight tile decoded: in registers with transpose (returned), else stored to its buffer."""
                meta = () if st.scale_after else metas(i)  # (global loads issued before the wait: latency hidden)
                plgpu.barrier_wait(ready.at[slot_of(i)])
                codes = w_smem.at[slot_of(i), wg]
                if st.scale_after:
                    return _signed_codes(st, codes)
                values = _decode(st, codes, meta)
                if st.transpose:
                    return values
                own_buffer(i)[...] = values
                plgpu.commit_smem()  # the stores before wgmma reads the tile
                return None

            def step(i, acc, operand, decode_next: bool):
                """acc plus step i's product, whose wgmmas run asynchronously while step i + 1 is decoded (where
                `decode_next`); then step i's ring slot is freed. Returns (acc, step i + 1's operand)."""
                slot, shape = slot_of(i), (ROWS, st.tokens)
                after, parts = (), []  # with scale_after: each group's (scale, offset, x sum) and product
                if st.scale_after:  # (loaded now, used after the wait: the decode hides their latency)
                    first = lax.div((start + i) * bk, jnp.int32(width))
                    sums = [_column_vector(sums_ref, first + j) for j in range(groups)]
                    after = [(*m, x_sum) for m, x_sum in zip(metas(i), sums, strict=True)]
                    parts = [plgpu.ACC.init(_zeros(shape)) for _ in range(groups)]

                def matmuls(refs):
                    acc_ref, part_refs, following = refs
                    if not st.scale_after:
                        a = operand if st.transpose else own_buffer(i).transpose((1, 0))
                        plgpu.wgmma(acc_ref, a, x_smem.at[slot].transpose((1, 0)))
                    for j, part_ref in enumerate(part_refs):  # a group's codes times its slice of x
                        x_t = x_smem.at[slot, :, pl.ds(j * width, width)].transpose((1, 0))
                        plgpu.wgmma(part_ref, operand[:, j * width : (j + 1) * width], x_t)
                    if decode_next and operand is not None:
                        following[...] = decode_step(i + 1)
                    elif decode_next:
                        decode_step(i + 1)

                acc_in = None if st.scale_after else plgpu.ACC.init(acc)  # (scale_after adds to acc after the wait)
                acc_out, parts, following = pl.run_state(matmuls)((acc_in, parts, operand))
                acc = acc if st.scale_after else acc_out
                if decode_next and operand is not None:  # step i's registers stay live (unreused by the decode)
                    _, following = lax.optimization_barrier((operand, following))  # until its wgmmas are done
                plgpu.barrier_arrive(consumed.at[slot])
                for (scale, offset, x_sum), part in zip(after, parts, strict=True):
                    scale, offset = (lax.broadcast_in_dim(v, shape, [0]) for v in (scale, offset))
                    acc = acc + scale * part + offset * lax.broadcast_in_dim(x_sum, shape, [1])  # s·(q'·x) + o·Σx
                return acc, following

            def loop_step(i, carry):
                return step(i, *carry, decode_next=True)

            acc, last = lax.fori_loop(0, steps - 1, loop_step, (_zeros((ROWS, st.tokens)), decode_step(0)))
            out_smem.at[wg][...] = step(steps - 1, acc, last, decode_next=False)[0]
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(out_smem.at[wg], out_ref.at[split, pl.ds(f0, ROWS)])
            plgpu.wait_smem_to_gmem(0)

    itemsize = jnp.dtype(st.x_dtype).itemsize
    code_shape = code_tile_shape(st, bk)
    buffers = (DECODED_BUFFERS * COMPUTE_WGS, bk, ROWS)
    decoded = () if st.transpose else (_swizzled(buffers, st.x_dtype, ROWS * itemsize),)
    scratch = (
        (
            _swizzled((stages, st.tokens, bk), st.x_dtype, bk * itemsize),
            _swizzled((stages, COMPUTE_WGS, *code_shape), codes.dtype, code_shape[1]),
            plgpu.SMEM((COMPUTE_WGS, ROWS, st.tokens), jnp.float32),
            *decoded,
        ),
        (
            plgpu.Barrier(num_arrivals=1 + COMPUTE_WGS, num_barriers=stages),
            plgpu.Barrier(num_arrivals=COMPUTE_WGS, num_barriers=stages),
        ),
    )
    operands = [x, codes, scales] + ([zeros] if affine else []) + ([x_sums] if st.scale_after else [])
    return plgpu.kernel(
        body,
        out_type=jax.ShapeDtypeStruct((splits, st.n, st.tokens), jnp.float32),
        scratch_types=scratch,
        grid=(st.n // CTA_FEATURES, splits),
        grid_names=("cols", "splits"),
        num_threads=COMPUTE_WGS + 1,
        thread_name="wg",
    )(*operands)
