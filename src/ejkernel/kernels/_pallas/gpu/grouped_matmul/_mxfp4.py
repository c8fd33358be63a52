"""The MXFP4-weights grouped matmul forward in Pallas Mosaic GPU (Hopper): E2M1 codes decoded into wgmma's B tile.

The weights come as gpt-oss ships them, `[L, N, K]` E2M1 codes two a byte (`quantize_array(w, mode="mxfp4",
axis="row")`: each row of N holds its K codes, low nibble first) with a power-of-two scale per 32 codes along K
(`2^e`, e the byte as two's complement). Hopper has no conversion from E2M1, and its wgmma reads a 16-bit B only
from shared memory, so each compute warpgroup decodes its step's `[block_n, STEP]` weight tile into shared memory,
while its previous step's wgmma runs, and multiplies from there:

- a code byte holds the weights of two adjacent columns k, k + 1, and a little-endian 32-bit word holds two bf16
  values of adjacent columns the same way, so a byte becomes one word of the decoded tile: the tile is written
  through a 32-bit view of its shared memory (`plgpu.RefUnion`: `[block_n, STEP / 2]` words and `[block_n, STEP]`
  bf16 values, the same bytes under the same 128-byte swizzle);
- words are assembled in PTX (`_WORDS_PTX`), two from each register of code bytes: the codes' bf16 magnitudes looked
  up in two byte tables by `prmt`, interleaved, signed, and multiplied by the group's `2^e`, an exact product
  rounded once: the reference's float32 value rounded to bf16, as the reference rounds its dequantized weights.

Interpret mode runs no PTX and keeps a `RefUnion`'s views apart: there the codes are decoded in jnp ops and stored
through the bf16 view (`_decoded_values`), so that CPU tests check the schedule, the barriers and the arithmetic.

The schedule is `_kernel.gmm`'s spans (`_kernel.ForwardWalk`): persistent CTAs, a memory warpgroup streaming each
step's lhs tiles, code tile and scale bytes (transposed to `[L, K / 32, N]` beforehand, so that a step's scales are
one TMA box) into a ring of `stages` slots, and two compute warpgroups sharing each output tile, `block_m / 2` rows
each. They share the decoding too: each decodes half of the weight tile's rows into one of `DECODED` tiles (step
s into tile s mod 3), arrives on that tile's barrier, and waits for both halves before its wgmma. Step s + 1 is
decoded while step s's wgmma runs. A warpgroup overwrites tile s + 1 mod 3 (step s - 2's) only after the other
warpgroup decoded step s, which that one does after waiting for its own wgmma of step s - 2: with three tiles no
other barrier is needed. A warpgroup holding none of a span's rows still decodes its half (and multiplies rows it
does not store).

Measured on an H200 at the MoE shape (M 32768, K 4096, N 1536, 64 groups; bf16 grouped matmul 0.69-0.74 ms): 1.28-1.44
ms. Without its wgmmas the kernel takes 0.92 ms, without its decoding 0.74, without either 0.56 (the operand
stream): the decoding is about as costly as the products and overlaps them only in part. Ping-pong tiles (each
warpgroup decoding whole tiles) took the same time (1.32 ms at 128 x 128), and so did decoding 64 rows at a time
(`DECODE_ROWS`) and the bits placed by shifts instead of the table lookup (1.30 ms).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.pallas import mosaic_gpu as plgpu
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith, llvm, vector

from ejkernel.kernels._common.code_bits import e2m1, pow2
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

STEP = 64  # K per step: two scale groups; a decoded row of 128 bytes (the 128-byte swizzle)
DECODED = 3  # decoded weight tiles (see the module's docstring)
DECODE_ROWS = 64  # weight rows a compute warpgroup decodes at a time
GROUP = 32  # codes per scale (MX formats)
ROWS_LAYOUT = plgpu.Layout.WGMMA.reduce(1)  # a value per row of a wgmma tile


@dataclasses.dataclass(frozen=True)
class MosaicGpuMxfp4GroupedMatmulTiling:
    """The MXFP4 forward's tiles (hashable). `block_m` output rows (two compute warpgroups of `block_m / 2`), `block_n`
    output columns, `stages` ring slots, `num_ctas` persistent CTAs. The contraction step is `STEP`."""

    block_m: int
    block_n: int
    stages: int
    num_ctas: int

    pingpong = False
    spans = True

    @property
    def wg_rows(self) -> int:
        return self.block_m // COMPUTE_WGS

    def smem_bytes(self, x_dtype, out_dtype) -> int:
        """Per slot the lhs tiles, the code tile and the scale bytes; `DECODED` weight tiles; per warpgroup an output
        tile of at most `SPAN_STORE_COLS` columns."""
        itemsize = jnp.dtype(x_dtype).itemsize
        slot = self.block_m * STEP * itemsize + self.block_n * STEP // 2 + STEP // GROUP * self.block_n
        decoded = DECODED * self.block_n * STEP * itemsize
        out_tile = self.block_m * math.gcd(self.block_n, SPAN_STORE_COLS) * jnp.dtype(out_dtype).itemsize
        return self.stages * slot + decoded + out_tile


def fit_smem(t: MosaicGpuMxfp4GroupedMatmulTiling, x_dtype, out_dtype) -> MosaicGpuMxfp4GroupedMatmulTiling:
    """`t` with as many of its stages (down to 2) as shared memory holds."""
    for stages in range(t.stages, 1, -1):
        fitted = dataclasses.replace(t, stages=stages)
        if fitted.smem_bytes(x_dtype, out_dtype) <= SMEM_BUDGET:
            return fitted
    raise NotImplementedError(f"mosaic gpu grouped_matmul: MXFP4 tiles {t} do not fit shared memory")


def step_scales(scales):
    """The weights' scale bytes `[L, N, K / 32]` as the kernel streams them: `[L, K / 32, N]` (a step's scales of a
    column tile are one TMA box)."""
    return jnp.swapaxes(scales, 1, 2)


# Two decoded words from the two code bytes of a register (`$2`, codes n0..n3 in its nibbles, low first), in PTX:
# each code's bf16 magnitude from two 8-entry byte tables (`prmt` on the codes' three low bits: the high bytes
# 00 3F 3F 3F 40 40 40 40, the low bytes 00 00 80 C0 00 40 80 C0 of 0, 0.5, 1, 1.5, 2, 3, 4, 6), the bytes interleaved
# into words (n0, n1) and (n2, n3), each code's sign bit moved to its value's, then both words times the group's `2^e`
# (`$3`, as a bf16 pair: an exact product, rounded once as the reference rounds its float32 value to bf16).
_WORDS_PTX = """{
.reg .b32 sel, lo, hi, lb, hb, w0, w1, t, f;
and.b32 sel, $2, 0x7777;
mov.b32 lo, 0xC0800000;
mov.b32 hi, 0xC0804000;
prmt.b32 lb, lo, hi, sel;
mov.b32 lo, 0x3F3F3F00;
mov.b32 hi, 0x40404040;
prmt.b32 hb, lo, hi, sel;
prmt.b32 w0, lb, hb, 0x5140;
prmt.b32 w1, lb, hb, 0x7362;
shl.b32 t, $2, 12;
lop3.b32 w0, w0, t, 0x8000, 0xf8;
shl.b32 t, $2, 24;
lop3.b32 w0, w0, t, 0x80000000, 0xf8;
shl.b32 t, $2, 4;
lop3.b32 w1, w1, t, 0x8000, 0xf8;
shl.b32 t, $2, 16;
lop3.b32 w1, w1, t, 0x80000000, 0xf8;
cvt.rn.bf16x2.f32 f, $3, $3;
mul.rn.bf16x2 $0, w0, f;
mul.rn.bf16x2 $1, w1, f;
}"""


def _table_words(both, scale):
    """`vector<2 x i32>`: the two decoded words of one register's two code bytes (`both`, i32) and their group's
    `2^e` (`scale`, f32), by `_WORDS_PTX`."""
    i32 = ir.IntegerType.get_signless(32)
    words = llvm.inline_asm(ir.Type.parse("!llvm.struct<(i32, i32)>"), [both, scale], _WORDS_PTX, "=r,=r,r,f")
    one = ir.VectorType.get((1,), i32)
    return mgpu.utils.vector_concat([mgpu.utils.bitcast(llvm.extractvalue(i32, words, [i]), one) for i in range(2)])


def _assembled_words(codes, factor, register_words=_table_words):
    """uint32 words (WGMMA layout) of `codes` (uint8, WGMMA layout: two bytes a register) as two bf16 values each,
    `factor` (float32, the same layout) each word's group's `2^e`: `register_words(both, scale)` per register (the
    register's two code bytes as an i32, the group's factor as an f32), in PTX on a GPU."""
    rows, words = codes.shape

    @plgpu.inline_mgpu(
        arg_types=(plgpu.Layout.WGMMA, plgpu.Layout.WGMMA),
        return_type=plgpu.ShapeDtypeStruct((rows, words), jnp.uint32, layout=plgpu.Layout.WGMMA),
    )
    def assemble(_, codes, factor):
        i16, i32 = ir.IntegerType.get_signless(16), ir.IntegerType.get_signless(32)
        registers = np.empty(codes.registers.shape, dtype=object)
        for index, register in np.ndenumerate(codes.registers):
            both = arith.extui(i32, mgpu.utils.bitcast(register, i16))  # this register's two code bytes
            scale = vector.extract(  # (both words of a register share a group)
                factor.registers[index], dynamic_position=[], static_position=ir.DenseI64ArrayAttr.get([0])
            )
            registers[index] = register_words(both, scale)
        return mgpu.FragmentedArray(_registers=registers, _layout=mgpu.WGMMA_LAYOUT, _is_signed=False)

    return assemble(codes, factor)


def _codes_and_factors(codes_smem, scales_smem):
    """The code bytes `[rows, STEP / 2]` (uint8, WGMMA layout) and each one's group factor `2^e` (float32, the same
    shape and layout) of one step's weights: `codes_smem [rows, STEP / 2]`, `scales_smem [STEP / GROUP, rows]`."""
    codes = plgpu.layout_cast(plgpu.load(codes_smem, layout=plgpu.Layout.WGMMA_UPCAST_2X), plgpu.Layout.WGMMA)
    rows, words = codes.shape
    per_group = words // (STEP // GROUP)
    factors = [pow2(plgpu.load(scales_smem.at[j], layout=ROWS_LAYOUT).astype(jnp.int32)) for j in range(STEP // GROUP)]
    return codes, jnp.concatenate([lax.broadcast_in_dim(f, (rows, per_group), [0]) for f in factors], axis=1)


def _decoded_words(codes_smem, scales_smem):
    """uint32 `[rows, STEP / 2]`: each code byte as the two bf16 values of its codes (low code in the low half),
    times their group's `2^e`, in the WGMMA layout (`_assembled_words`)."""
    codes, factor = _codes_and_factors(codes_smem, scales_smem)
    return _assembled_words(codes, factor)


def _decoded_values(codes_smem, scales_smem, dtype):
    """`_decoded_words` as `dtype` values `[rows, STEP]` in jnp ops (`code_bits.e2m1`), for interpret mode (which runs
    no PTX and keeps a `RefUnion`'s views apart)."""
    codes, factor = _codes_and_factors(codes_smem, scales_smem)
    b = codes.astype(jnp.int32)
    low, high = e2m1(b & 0xF) * factor, e2m1(b >> 4) * factor
    return jnp.stack([low, high], axis=-1).reshape(b.shape[0], STEP).astype(dtype)


def decoded_k_loop(ring: Ring, step0, steps: int, shape, multiply, decode, decoded):
    """Compute warpgroup: the float32 `shape` tile `Σ_s multiply(acc_ref, slot_s, tile_s)` over `steps` ring steps
    from `step0`, where `decode(slot, tile)` writes this warpgroup's half of the weights of the step in ring slot
    `slot` into decoded tile `tile` (the global step mod `DECODED`), and barrier `decoded[tile]` (both warpgroups'
    arrivals) says both halves are written. Step s + 1 is decoded while step s's wgmma runs; a slot is handed back
    once its wgmma is done (its codes were read before)."""

    def decode_step(step):
        slot, tile = ring.slot(step), lax.rem(step, jnp.int32(DECODED))
        plgpu.barrier_wait(ring.ready_at(slot))
        decode(slot, tile)
        plgpu.barrier_arrive(decoded.at[tile])

    def scope(acc_ref):
        decode_step(step0)

        def step(s, carry):
            slot, tile = ring.slot(step0 + s), lax.rem(step0 + s, jnp.int32(DECODED))
            plgpu.barrier_wait(decoded.at[tile])
            multiply(acc_ref, slot, tile)
            pl.when(s + 1 < steps)(lambda: decode_step(step0 + s + 1))
            plgpu.wgmma_wait(0)
            plgpu.barrier_arrive(ring.consumed.at[slot])
            return carry

        lax.fori_loop(0, steps, step, None)
        return acc_ref[...]

    return pl.run_scoped(scope, plgpu.ACC(shape, jnp.float32))


def mxfp4_gmm(
    lhs,
    codes,
    scales,
    group_sizes,
    group_offset,
    *,
    out_dtype,
    tiling: MosaicGpuMxfp4GroupedMatmulTiling,
    in_ptx: bool = True,
):
    """`out [M, N]`: each owned row of `lhs [M, K]` (16-bit) times its group's MXFP4 weights (`codes [L, N, K / 2]`
    uint8, two codes a byte, low first; `scales [L, N, K / 32]` uint8 exponents), transposed; zeros on every other
    row. K must be a multiple of `STEP`, N of `block_n`. `in_ptx`: the codes are decoded in PTX (bf16 lhs); False
    for interpret mode (`_decoded_values`)."""
    m, k = lhs.shape
    num_local, n = codes.shape[:2]
    t = fit_smem(tiling, lhs.dtype, out_dtype)
    bm, bn, stages, rows = t.block_m, t.block_n, t.stages, t.wg_rows
    shapes_ok = codes.shape[2] * 2 == k and scales.shape == (num_local, n, k // GROUP)
    if k % STEP or n % bn or rows % 64 or bn % (COMPUTE_WGS * DECODE_ROWS) or not shapes_ok:
        raise ValueError(
            f"mxfp4 gmm: K={k} and N={n} must be multiples of {STEP} and block_n={bn} (block_m={bm}, block_n "
            f"multiples of 128), codes "
            f"[L, N, K/2] and scales [L, N, K/32], got {codes.shape} and {scales.shape}"
        )
    x = pad_rows(lhs, bm)
    col_tiles, k_steps = n // bn, k // STEP
    schedule, row_units = forward_schedule(group_sizes, group_offset, num_local, m, bm, spans=True)
    num_units = row_units * col_tiles
    num_ctas = min(t.num_ctas, num_units)

    def body(*refs):
        schedule_refs, (lhs_ref, codes_ref, scales_ref, out_ref, smem, barriers) = (
            refs[: len(schedule)],
            refs[len(schedule) :],
        )
        a_smem, c_smem, s_smem, (words_smem, values_smem), o_smem = smem
        *ring_barriers, decoded = barriers
        walk = ForwardWalk.start(
            t,
            schedule_refs,
            ring_barriers,
            num_units=num_units,
            num_ctas=num_ctas,
            col_tiles=col_tiles,
            k_steps=k_steps,
        )

        def copies(row0, col, g, kk):
            """Step kk's copies: each warpgroup's lhs rows from `row0` (a multiple of 8); group g's codes and scales of
            column tile col."""
            cols, ks = pl.ds(col * bn, bn), pl.ds(kk * STEP, STEP)
            a_copies = [
                (lhs_ref.at[pl.ds(row0 + p * rows, rows), ks], lambda slot, p=p: a_smem.at[slot * COMPUTE_WGS + p])
                for p in range(COMPUTE_WGS)
            ]
            return [
                *a_copies,
                (codes_ref.at[g, cols, pl.ds(kk * (STEP // 2), STEP // 2)], lambda slot: c_smem.at[slot]),
                (scales_ref.at[g, pl.ds(kk * (STEP // GROUP), STEP // GROUP), cols], lambda slot: s_smem.at[slot]),
            ]

        walk.feed(copies)

        @on_compute_warpgroups
        def _():
            wg = lax.axis_index("wg")

            def decode(slot, tile):
                """This warpgroup's rows of the step's weights, 64 rows at a time (fewer live registers)."""
                for r in range(0, bn // COMPUTE_WGS, DECODE_ROWS):
                    rows = pl.ds(wg * (bn // COMPUTE_WGS) + r, DECODE_ROWS)
                    codes, scales = c_smem.at[slot, rows], s_smem.at[slot, :, rows]
                    if in_ptx:
                        words_smem.at[tile, rows][...] = _decoded_words(codes, scales)
                    else:
                        values_smem.at[tile, rows][...] = _decoded_values(codes, scales, lhs.dtype)
                plgpu.commit_smem()  # the stores before either warpgroup's wgmma reads the tile

            def multiply(acc_ref, slot, tile):
                a = a_smem.at[slot * COMPUTE_WGS + wg]
                plgpu.wgmma(acc_ref, a, values_smem.at[tile].transpose((1, 0)))

            product = lambda ring, step: decoded_k_loop(ring, step, k_steps, (rows, bn), multiply, decode, decoded)

            def idle(ring, step, k_steps):
                product(ring, step)  # (its half of the decoding is still needed)

            walk.compute(product, o_smem.at[wg], out_ref, idle)

    scratch = (
        (
            swizzled((stages * COMPUTE_WGS, rows, STEP), lhs.dtype),
            swizzled((stages, bn, STEP // 2), jnp.uint8),
            plgpu.SMEM((stages, STEP // GROUP, bn), jnp.uint8),
            plgpu.RefUnion(swizzled((DECODED, bn, STEP // 2), jnp.uint32), swizzled((DECODED, bn, STEP), lhs.dtype)),
            plgpu.SMEM((COMPUTE_WGS, rows, math.gcd(bn, SPAN_STORE_COLS)), out_dtype),
        ),
        (
            *Ring.barriers(t, COMPUTE_WGS + 2),  # per step: each warpgroup's lhs rows, the codes, the scales
            plgpu.Barrier(num_arrivals=COMPUTE_WGS, num_barriers=DECODED),
        ),
    )
    out_type = jax.ShapeDtypeStruct((m, n), out_dtype)  # (spans write rows [0, M) only)
    return launch(body, out_type, scratch, num_ctas, *schedule, x, codes, step_scales(scales))
