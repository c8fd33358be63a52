"""The 4-bit-weights grouped matmul forward in Pallas Mosaic GPU (Hopper): the codes decoded into wgmma's A registers.

The weights come `[L, N, K]`, 4-bit codes two a byte (`quantize_array(w, mode=..., axis="row")`: each row of N holds
its K codes, low nibble first), in one of two formats (`CodeFormat`): MXFP4 as gpt-oss ships it (E2M1 codes, a
power-of-two scale per 32 codes along K, `2^e` with e the byte as two's complement), or affine int4 (`(q - z) s`, a
float32 scale and zero per group of 64, 128, ... codes). Hopper has no conversion from E2M1 or int4, but wgmma takes a
16-bit A operand from registers. So the product is computed transposed ("swap AB"), `outᵀ = W · lhsᵀ`: each compute
warpgroup owns 64 weight rows (output columns) of a 128-column tile, decodes its `[64, STEP]` codes of each step in
registers and multiplies them by the span's `block_m` lhs rows (wgmma's N, up to 256) read from the ring slot as they
landed.

- Codes reach wgmma's register layout without a table: a warpgroup's `[64, STEP / 2]` code bytes are loaded four
  bytes a thread (`WGMMA_8BIT`), which is, nibble for nibble, the 4-bit `WGMMA_UPCAST_4X` layout of `[64, STEP]`
  codes; Mosaic GPU's 4-bit relayout (two shuffles) then gives each thread the code byte of each of its bf16 pairs.
- Each register of four such bytes (eight codes of one group) becomes four 32-bit words (eight bf16 values) in PTX.
  MXFP4 (`_WORDS_PTX`): the codes' bf16 magnitudes looked up in two byte tables by `prmt`, interleaved, signed, and
  multiplied by the group's `2^e`, an exact product rounded once. Affine (`_AFFINE_PTX`): each code made a float32,
  less the zero, times the scale, rounded as float32 and then to bf16. Either way the reference's float32 value
  rounded to bf16, as the reference rounds its dequantized weights, so the kernel multiplies XLA's bf16 weights.
  (MXFP4's outputs came out bit for bit XLA's too, float32 sums of products with few bits; affine int4's within the
  output's rounding, 5.7e-3 of the largest at the MoE shape: float32 sums in another order.)
- Steps go in pairs, each step's wgmma queued behind the previous one's, so that the tensor cores never wait for a
  warpgroup to hand back a slot and issue again: step 2j + 1 is decoded while 2j - 1 and 2j run, and 2j + 2 while 2j
  and 2j + 1 do. No register an in-flight wgmma reads is written before that wgmma is waited for (see `product`).
- The warpgroups share nothing but the ring slot: no decoded tile in shared memory, no barrier between them. Per
  step a CTA's products read 64 KB of shared memory (both warpgroups read the same lhs tile).
- The `[64, block_m]` float32 tile is stored transposed into the warpgroup's untiled `[block_m, 64]` output tile,
  whose rows of the span go out by TMA (`store_rows`).

Interpret mode runs no PTX: there the codes are decoded in jnp ops (`_decoded_values`), so that CPU tests check the
schedule, the barriers and the arithmetic.

The schedule is `_kernel.gmm`'s spans (`_kernel.ForwardWalk`): persistent CTAs, a memory warpgroup streaming each
step's lhs tile, code tile and factors (`stream_factors`: laid out beforehand so that a step's factors of a column
tile are one TMA box) into a ring of `stages` slots.

MXFP4, measured on an H200 at the MoE shape (M 32768, K 4096, N 1536, 64 groups), in the same runs as our bf16
grouped matmul (0.71-0.76 ms), session 40 (BENCHMARKS.md): 0.94-1.04 ms in 256-row tiles (0.71-0.77x), bit for bit XLA's
dequantize-then-multiply; 128-row tiles 1.43. Decoding into shared memory as wgmma's B instead (both warpgroups sharing
each decoded tile, session 39's kernel) took 1.05-1.07 ms; issuing each step's wgmma behind the previous one's
(`wgmma_wait(1)`, a loop of single steps) 1.15. Setting the signs in the table's high bytes (12 instructions a
register, in place of 16 with the signs set in each word) took 0.977 ms against 1.079.
Session 41: decoding a whole register of four code bytes a PTX call, where two bytes were assembled into one before,
took 0.963 ms against 0.978; streaming the scales as bf16 `2^e` (`stream_factors`), where each exponent byte took about
a dozen instructions in the kernel, 0.915 ms against 0.978 (0.80x bf16), bit for bit the same.
Session 42 (BENCHMARKS.md): Mosaic GPU's on-device profile put a step at about 1350 cycles, the tensor cores' share
of it (both warpgroups' wgmmas) about 1024, the decode about 780 while they ran beside it; yet with no decoding at all
(the loaded code registers taken as the operand, wrong values) the kernel took 0.802 ms against 0.885, and without
the relayout's shuffles alone 0.822: the decode is a tenth of the time, the rest is this kernel's schedule. Step pairs
(each wgmma queued behind the previous one's) took MXFP4 0.866 ms against 0.877 and int4 1.003 against 1.053.
Session 43: narrow tails (`NARROW_ROWS`) took MXFP4 0.851 ms against 0.890 and int4 1.006 against 1.035 (bf16 0.735
and 0.720 in the same runs): a narrow span still decodes its whole weight tile each step.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.pallas import mosaic_gpu as plgpu
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import llvm, vector

from ejkernel.kernels._common.code_bits import e2m1, pow2
from ejkernel.kernels._pallas.gpu._stores import store_rows
from ejkernel.kernels._pallas.gpu.grouped_matmul._kernel import (
    COMPUTE_WGS,
    SMEM_BUDGET,
    ForwardWalk,
    Ring,
    compute_units,
    forward_schedule,
    launch,
    on_compute_warpgroups,
    pad_rows,
    swizzled,
)

STEP = 64  # K per step: a row of 128 bytes of lhs (the 128-byte swizzle)
MX_GROUP = 32  # codes per scale in MXFP4: two groups a step
WG_COLS = 64  # weight rows (output columns) a compute warpgroup owns: its wgmma's M
BLOCK_N = COMPUTE_WGS * WG_COLS  # output columns of a tile
ROWS_LAYOUT = plgpu.Layout.WGMMA.reduce(1)  # a value per row of a wgmma tile
# Output rows a tile may have: those run on an H200. 192 rows (wgmma takes any multiple of 8 up to 256) lowered, but
# the kernel read or wrote out of bounds on the GPU (an illegal address, session 41 call 8); not investigated.
BLOCK_MS = (128, 256)
OUT_PIECES = 2
"""A warpgroup's output of a whole tile goes out in this many row pieces through one staging tile (a narrow span's in
fewer), which leaves shared memory for a fifth ring stage in 256-row tiles (session 42: with pairs, 5 stages 0.866 /
1.003 ms, 4 stages 0.875 / 1.008, MXFP4 / int4)."""
NARROW_ROWS = 128
"""A span whose rows fit in this many of its tile's (a group's last rows) takes products this wide (wgmma's N) where
its tile is wider: at the MoE shape's random groups, 256-row tiles compute 1.27 rows a row, 1.13 with narrow tails."""


def unserved(mode: str, bits: int, group: int) -> str | None:
    """Why the kernel does not decode `bits`-bit codes of `mode` in groups of `group` (None: it does): it decodes
    MXFP4 (groups of 32) and affine int4 in groups of a multiple of `STEP`."""
    if (mode == "mxfp4" and group == MX_GROUP) or (mode == "affine" and bits == 4 and group % STEP == 0):
        return None
    return (
        f"it decodes MXFP4 and affine int4 in groups of a multiple of {STEP} only, got mode {mode!r}, {bits} bits, "
        f"groups of {group}"
    )


@dataclasses.dataclass(frozen=True)
class CodeFormat:
    """What the weights' 4-bit codes stand for (hashable): `"mxfp4"`, E2M1 times `2^e` a group of 32 (`group` 32), or
    `"affine"`, `(q - z) s` a group of `group` codes, a multiple of `STEP` (one group a step or more)."""

    mode: str
    group: int

    def __post_init__(self) -> None:
        reason = unserved(self.mode, 4, self.group)
        if reason:
            raise ValueError(f"4-bit gmm: {reason}")

    @property
    def factor_dtype(self):
        """The streamed factors' dtype: bf16 `2^e` (MXFP4), float32 scale and zero (affine)."""
        return jnp.bfloat16 if self.mode == "mxfp4" else jnp.float32

    @property
    def steps_a_box(self) -> int:
        """K steps that share one `[2, N]` box of streamed factors (`stream_factors`)."""
        return 1 if self.mode == "mxfp4" else self.group // STEP


@dataclasses.dataclass(frozen=True)
class MosaicGpuFourBitGroupedMatmulTiling:
    """The 4-bit forward's tiles (hashable): `block_m` output rows (wgmma's N: `BLOCK_MS`), `stages`
    ring slots, `num_ctas` persistent CTAs. A tile has `BLOCK_N` columns; the contraction step is `STEP`."""

    block_m: int
    stages: int
    num_ctas: int

    pingpong = False
    spans = True

    def smem_bytes(self, x_dtype, out_dtype) -> int:
        """Per slot the lhs tile, the code tile and the factors (at most 4 bytes each); per warpgroup its
        `[block_m / OUT_PIECES, WG_COLS]` output piece."""
        slot = self.block_m * STEP * jnp.dtype(x_dtype).itemsize + BLOCK_N * STEP // 2 + 2 * BLOCK_N * 4
        out = COMPUTE_WGS * self.block_m // OUT_PIECES * WG_COLS * jnp.dtype(out_dtype).itemsize
        return self.stages * slot + out


def fit_smem(t: MosaicGpuFourBitGroupedMatmulTiling, x_dtype, out_dtype) -> MosaicGpuFourBitGroupedMatmulTiling:
    """`t` with as many of its stages (down to 2) as shared memory holds."""
    for stages in range(t.stages, 1, -1):
        fitted = dataclasses.replace(t, stages=stages)
        if fitted.smem_bytes(x_dtype, out_dtype) <= SMEM_BUDGET:
            return fitted
    raise NotImplementedError(f"mosaic gpu grouped_matmul: 4-bit tiles {t} do not fit shared memory")


def stream_factors(fmt: CodeFormat, scales, zeros=None):
    """The weights' factors as the kernel streams them, `[L, K / STEP / steps_a_box, 2, N]` (a step's factors of a
    column tile are one `[2, BLOCK_N]` TMA box), from `scales [L, N, K / group]` (and affine `zeros`):

    - MXFP4: the two groups' `2^e` of each step as bfloat16 (exact: every power of two of an int8 exponent is a bf16
      value, 2^-127 and 2^-128 subnormal). In registers a bf16 pair of one row is then the PTX's factor as loaded,
      where an exponent byte took about a dozen instructions to become one (timed in the module docstring).
    - affine: each group's float32 scale and zero."""
    if fmt.mode == "mxfp4":
        powers = pow2(scales.astype(jnp.int32)).astype(jnp.bfloat16)  # [L, N, K / 32]
        return jnp.moveaxis(powers.reshape(*powers.shape[:2], -1, STEP // MX_GROUP), 1, 3)
    return jnp.moveaxis(jnp.stack([scales, zeros], axis=-1).astype(jnp.float32), 1, 3)


def _magnitude_tables() -> dict[str, str]:
    """`prmt`'s byte tables of the bf16 magnitudes of E2M1 codes 0-7 (0, 0.5, 1, 1.5, 2, 3, 4, 6, from JAX's
    `float4_e2m1fn`): their low bytes in `low0` (codes 0-3) and `low4` (4-7), their high bytes in `high0`, `high4`."""
    bits = np.arange(8, dtype=np.uint8).view(jnp.float4_e2m1fn).astype(jnp.bfloat16).view(np.uint16)
    word = lambda table: f"0x{int.from_bytes(table.astype(np.uint8).tobytes(), 'little'):08X}"
    low, high = bits & 0xFF, bits >> 8
    return {"low0": word(low[:4]), "low4": word(low[4:]), "high0": word(high[:4]), "high4": word(high[4:])}


# Four decoded words from one relaid-out register's four code bytes (`$4`: codes n0..n7 in its nibbles, low first;
# the bytes of four consecutive 8-column blocks, one scale group), in PTX, one half (two bytes, `{codes}`'s low half)
# at a time: each code's bf16 magnitude from the two byte tables (`prmt` on the codes' three low bits); each code's
# sign bit (bit 3 of its nibble) set in its high byte: the two bytes spread to (b0, b0, b1, b1) hold the signs of
# the odd codes at bits 15 and 31 already, those of the even codes four bits below bits 7 and 23; then the bytes
# interleaved into words of two codes, each times the group's `2^e` (`$5`, a bf16 pair: an exact product, rounded
# once as the reference rounds its float32 value to bf16). 23 instructions for eight codes, besides the tables' moves.
_HALF_PTX = """and.b32 sel, {codes}, 0x7777;
prmt.b32 lb, l0, l4, sel;
prmt.b32 hb, h0, h4, sel;
prmt.b32 x, $4, $4, {spread};
shl.b32 t, x, 4;
lop3.b32 t, t, x, 0x00800080, 0xe4;
lop3.b32 hb, hb, t, 0x80808080, 0xf8;
prmt.b32 t, lb, hb, 0x5140;
mul.rn.bf16x2 ${first}, t, $5;
prmt.b32 t, lb, hb, 0x7362;
mul.rn.bf16x2 ${second}, t, $5;
"""
_WORDS_PTX = (
    "{{\n.reg .b32 sel, l0, l4, h0, h4, lb, hb, x, t, c;\n"
    "mov.b32 l0, {low0};\nmov.b32 l4, {low4};\nmov.b32 h0, {high0};\nmov.b32 h4, {high4};\n".format(
        **_magnitude_tables()
    )
    + _HALF_PTX.format(codes="$4", spread="0x1100", first=0, second=1)
    + "shr.b32 c, $4, 16;\n"
    + _HALF_PTX.format(codes="c", spread="0x3322", first=2, second=3)
    + "}"
)


# Four decoded words from one relaid-out register's affine codes (`$4`: codes n0..n7 in its nibbles, low first), the
# group's scale `$5` and zero `$6`, in PTX: each code made a float32 `2^23 + q` (its nibble under the exponent bits of
# 2^23), less 2^23 (exact), less the zero, times the scale, each rounded as the reference rounds its float32 `(q - z)
# s` (`.rn`: never fused), then two values at a time rounded to a bf16 pair. 43 instructions for eight codes.
_AFFINE_PTX = (
    "{\n.reg .b32 x, q;\n.reg .f32 v<8>;\n"
    + "".join(
        (f"shr.u32 x, $4, {4 * i};\n" if i else "mov.b32 x, $4;\n")
        + "lop3.b32 q, x, 0xF, 0x4B000000, 0xEA;\n"  # (x & 0xF) | 0x4B000000
        + f"sub.rn.f32 v{i}, q, 0f4B000000;\nsub.rn.f32 v{i}, v{i}, $6;\nmul.rn.f32 v{i}, v{i}, $5;\n"
        for i in range(8)
    )
    + "".join(f"cvt.rn.bf16x2.f32 ${w}, v{2 * w + 1}, v{2 * w};\n" for w in range(4))
    + "}"
)


def _asm_words(ptx: str, *operands, constraints: str):
    """The four i32 words `ptx` computes from `operands` (inline PTX, outputs first in `constraints`)."""
    i32 = ir.IntegerType.get_signless(32)
    words = llvm.inline_asm(ir.Type.parse("!llvm.struct<(i32, i32, i32, i32)>"), list(operands), ptx, constraints)
    return [llvm.extractvalue(i32, words, [i]) for i in range(4)]


def _factors(fmt: CodeFormat, factors_smem, rows):
    """The step's factors in the WGMMA layout of a `[rows, STEP]` tile, each value's own, from `factors_smem [2,
    rows]`: MXFP4, one bf16 `2^e` array (its two rows the step's two groups); affine, float32 scale and zero."""
    row = lambda j: plgpu.load(factors_smem.at[j], layout=ROWS_LAYOUT)
    spread = lambda f, width: lax.broadcast_in_dim(f, (rows, width), [0])
    if fmt.mode == "mxfp4":
        return (jnp.concatenate([spread(row(j), MX_GROUP) for j in range(STEP // MX_GROUP)], axis=1),)
    return spread(row(0), STEP), spread(row(1), STEP)


def code_pairs(codes):
    """Inside `inline_mgpu`: `codes` (uint8 `[rows, STEP / 2]`, `WGMMA_8BIT` layout: four bytes a thread) relaid
    out as the registers of a bf16 `[rows, STEP]` WGMMA-layout tile, each holding the code byte (two 4-bit codes) of
    that register's bf16 pair. (Four bytes a thread are, nibble for nibble, the 4-bit `WGMMA_UPCAST_4X` layout, so
    Mosaic GPU's 4-bit relayout does it: two shuffles.)"""
    i4 = ir.IntegerType.get_signless(4)
    as_nibbles = lambda register: mgpu.utils.bitcast(register, ir.VectorType.get((8,), i4))
    nibbles = mgpu.FragmentedArray(
        _registers=np.vectorize(as_nibbles, otypes=[object])(codes.registers),
        _layout=fa.WGMMA_LAYOUT_UPCAST_4X,
        _is_signed=False,
    )
    return nibbles.to_layout(mgpu.WGMMA_LAYOUT).registers


def _register_operand(fmt: CodeFormat, codes_smem, factors_smem):
    """bf16 `[rows, STEP]` in the WGMMA layout (wgmma's A in registers): the step's codes `codes_smem [rows, STEP /
    2]` decoded in PTX (`_WORDS_PTX` or `_AFFINE_PTX`), a relaid-out register (four code bytes of four consecutive
    8-column blocks, within one group) at a time, from `code_pairs`."""
    codes = plgpu.load(codes_smem, layout=plgpu.Layout.WGMMA_8BIT)
    rows = codes.shape[0]
    factors = _factors(fmt, factors_smem, rows)

    @plgpu.inline_mgpu(
        arg_types=(plgpu.Layout.WGMMA_8BIT, *(plgpu.Layout.WGMMA for _ in factors)),
        return_type=plgpu.ShapeDtypeStruct((rows, STEP), jnp.bfloat16, layout=plgpu.Layout.WGMMA),
    )
    def assemble(_, codes, *factors):
        i32 = ir.IntegerType.get_signless(32)
        first = lambda v: vector.extract(v, dynamic_position=[], static_position=ir.DenseI64ArrayAttr.get([0]))
        pairs = code_pairs(codes)
        bf16_pair = ir.VectorType.get((2,), ir.BF16Type.get())
        registers = np.empty(pairs.shape, dtype=object)
        for index in np.ndindex(pairs.shape):
            if index[1] % 4:  # (axis 1: the 8-column blocks; blocks 4t .. 4t + 3 share a group)
                continue
            four = [(index[0], index[1] + i, *index[2:]) for i in range(4)]
            packed = mgpu.utils.bitcast(mgpu.utils.vector_concat([pairs[i] for i in four]), i32)
            if fmt.mode == "mxfp4":  # (a bf16 pair of one row: its group's 2^e twice)
                scale = mgpu.utils.bitcast(factors[0].registers[index], i32)
                words = _asm_words(_WORDS_PTX, packed, scale, constraints="=r,=r,=r,=r,r,r")
            else:
                scale, zero = (first(f.registers[index]) for f in factors)
                words = _asm_words(_AFFINE_PTX, packed, scale, zero, constraints="=r,=r,=r,=r,r,f,f")
            for word, i in zip(words, four, strict=True):
                registers[i] = mgpu.utils.bitcast(word, bf16_pair)
        return mgpu.FragmentedArray(_registers=registers, _layout=mgpu.WGMMA_LAYOUT, _is_signed=None)

    return assemble(codes, *factors)


def _store_transposed(value, ref, first: int):
    """`ref[...] = value[:, first : first + rows].T` for a WGMMA-layout `value` into the untiled `ref` (`rows` of
    them): relaid out so that each thread's vector of two runs down `value`'s columns (`WGMMA_TRANSPOSED`, one
    shuffle), which are `ref`'s rows. (Written in Mosaic GPU: JAX 0.12's layout inference finds no layout for the same
    store through `ref.transpose((1, 0))`.)"""

    rows = ref.shape[0]

    @plgpu.inline_mgpu(arg_types=(plgpu.Layout.WGMMA, plgpu.RefType()))
    def store(_, value, ref):
        piece = value[:, first : first + rows]
        piece.to_layout(fa.WGMMA_TRANSPOSED_LAYOUT).store_untiled(
            mgpu.utils.memref_transpose(ref, (1, 0)), optimized=False
        )

    store(value, ref)


def _decoded_values(fmt: CodeFormat, codes_smem, factors_smem, dtype):
    """`_register_operand` in jnp ops (float32, then `dtype`), for interpret mode (which runs no PTX)."""
    b = codes_smem[...].astype(jnp.int32)
    rows = b.shape[0]
    codes = jnp.stack([b & 0xF, b >> 4], axis=-1).reshape(rows, STEP)
    factors = [f.astype(jnp.float32) for f in _factors(fmt, factors_smem, rows)]
    if fmt.mode == "mxfp4":
        return (e2m1(codes) * factors[0]).astype(dtype)
    scale, zero = factors
    return ((codes.astype(jnp.float32) - zero) * scale).astype(dtype)


def four_bit_gmm(
    lhs,
    codes,
    scales,
    zeros,
    group_sizes,
    group_offset,
    *,
    fmt: CodeFormat,
    out_dtype,
    tiling: MosaicGpuFourBitGroupedMatmulTiling,
    in_ptx: bool = True,
):
    """`out [M, N]`: each owned row of `lhs [M, K]` (16-bit) times its group's 4-bit weights, transposed; zeros on
    every other row. The weights: `codes [L, N, K / 2]` uint8, two codes a byte, low first, in `fmt`, with `scales
    [L, N, K / fmt.group]` (uint8 exponents for MXFP4, float for affine) and affine's `zeros` (like `scales`; None for
    MXFP4). K must be a multiple of `STEP` and of the group, N of `BLOCK_N`. `in_ptx`: the codes are decoded in PTX
    (bf16 lhs); False for interpret mode (`_decoded_values`)."""
    m, k = lhs.shape
    num_local, n = codes.shape[:2]
    t = fit_smem(tiling, lhs.dtype, out_dtype)
    bm, stages = t.block_m, t.stages
    groups = (num_local, n, k // fmt.group)
    zeros_ok = zeros is None if fmt.mode == "mxfp4" else getattr(zeros, "shape", None) == groups
    shapes_ok = codes.shape[2] * 2 == k and scales.shape == groups and zeros_ok
    if k % STEP or k % fmt.group or n % BLOCK_N or bm not in BLOCK_MS or not shapes_ok:
        raise ValueError(
            f"4-bit gmm: K={k} must be a multiple of {STEP} and {fmt.group}, N={n} of {BLOCK_N}, block_m={bm} one of "
            f"{BLOCK_MS}, codes [L, N, K/2] and scales (and affine's zeros) {groups}, got {codes.shape} and "
            f"{scales.shape} ({None if zeros is None else zeros.shape})"
        )
    x = pad_rows(lhs, bm)
    col_tiles, k_steps = n // BLOCK_N, k // STEP
    schedule, row_units = forward_schedule(group_sizes, group_offset, num_local, m, bm, spans=True)
    num_units = row_units * col_tiles
    num_ctas = min(t.num_ctas, num_units)

    def body(*refs):
        schedule_refs, (lhs_ref, codes_ref, factors_ref, out_ref, smem, barriers) = (
            refs[: len(schedule)],
            refs[len(schedule) :],
        )
        a_smem, c_smem, f_smem, o_smem = smem
        walk = ForwardWalk.start(
            t, schedule_refs, barriers, num_units=num_units, num_ctas=num_ctas, col_tiles=col_tiles, k_steps=k_steps
        )

        def copies(row0, col, g, kk):
            """Step kk's copies: the lhs rows from `row0` (a multiple of 8); group g's codes and factors of tile col."""
            cols, ks = pl.ds(col * BLOCK_N, BLOCK_N), pl.ds(kk * STEP, STEP)
            return [
                (lhs_ref.at[pl.ds(row0, bm), ks], lambda slot: a_smem.at[slot]),
                (codes_ref.at[g, cols, pl.ds(kk * (STEP // 2), STEP // 2)], lambda slot: c_smem.at[slot]),
                (factors_ref.at[g, kk // fmt.steps_a_box, :, cols], lambda slot: f_smem.at[slot]),
            ]

        walk.feed(copies)

        @on_compute_warpgroups
        def _():
            wg = lax.axis_index("wg")
            ring, spans = walk.ring, walk.schedule
            mine = pl.ds(wg * WG_COLS, WG_COLS)

            def decode(step):
                """Step `step`'s weight rows of this warpgroup, decoded to wgmma's A operand once its slot landed."""
                slot = ring.slot(step)
                plgpu.barrier_wait(ring.ready_at(slot))
                codes, factors = c_smem.at[slot, mine], f_smem.at[slot, :, mine]
                if in_ptx:
                    return _register_operand(fmt, codes, factors)
                return _decoded_values(fmt, codes, factors, lhs.dtype)

            def product(step0, rows):
                """The float32 `[WG_COLS, rows]` tile `outᵀ` (the slot's first `rows` lhs rows) of the `k_steps` ring
                steps from `step0`, the steps in pairs (2j, 2j + 1), each step's wgmma queued behind the previous one's:
                queue 2j, retire 2j - 1, decode 2j + 1 (while 2j runs), queue it, retire 2j, decode 2j + 2 (while 2j + 1
                runs). Each operand is issued from registers that nothing writes before its wgmma is waited for: the
                even step's from the loop's carry (rewritten at the loop's end, after its wait), the odd step's from its
                decode's own registers (rewritten by the next pair's odd decode, after its wait). A loop of single steps
                cannot queue ahead so: its decode rewrites the registers of the wgmma still running (session 42, call 4:
                NaN outputs)."""

                def scope(acc_ref):
                    def issue(s, operand):
                        lhs_rows = a_smem.at[ring.slot(step0 + s), pl.ds(0, rows)]
                        plgpu.wgmma(acc_ref, operand, lhs_rows.transpose((1, 0)))

                    def retire(s):
                        plgpu.barrier_arrive(ring.consumed.at[ring.slot(step0 + s)])

                    def retire_previous(j):
                        """Retire step 2j - 1 unless pair j is the first (j traced in the loop, an int after it)."""
                        if not isinstance(j, int):
                            pl.when(j > 0)(lambda: retire(2 * j - 1))
                        elif j > 0:
                            retire(2 * j - 1)

                    def first_half(j, x):
                        issue(2 * j, x)
                        plgpu.wgmma_wait(1)  # step 2j - 1's wgmma is done
                        retire_previous(j)
                        y = decode(step0 + 2 * j + 1)
                        issue(2 * j + 1, y)
                        plgpu.wgmma_wait(1)  # step 2j's
                        retire(2 * j)
                        return y

                    def pair(j, x):
                        first_half(j, x)
                        following = decode(step0 + 2 * j + 2)
                        following, _ = lax.optimization_barrier((following, x))  # x kept until its wgmma was waited
                        return following

                    x = lax.fori_loop(0, (k_steps - 1) // 2, pair, decode(step0))
                    j = (k_steps - 1) // 2  # the last pair, or the last single step of an odd count
                    if k_steps % 2 == 0:
                        y = first_half(j, x)
                        plgpu.wgmma_wait(0)
                        lax.optimization_barrier((x, y))
                        retire(2 * j + 1)
                    else:
                        issue(2 * j, x)
                        plgpu.wgmma_wait(0)
                        lax.optimization_barrier(x)
                        retire_previous(j)
                        retire(2 * j)
                    return acc_ref[...]

                return pl.run_scoped(scope, plgpu.ACC((WG_COLS, rows), jnp.float32))

            def output_span(span, col, step):
                """The span's rows of this warpgroup's columns: its product (`NARROW_ROWS` wide where the span's rows
                fit), or zeros for a span without a group."""
                g, lo, hi, row0 = spans.group[span], spans.lo[span], spans.hi[span], spans.start[span]
                out_tile = o_smem.at[wg]
                dst = lambda row, rows: out_ref.at[pl.ds(row, rows), pl.ds(col * BLOCK_N + wg * WG_COLS, WG_COLS)]

                def put(value_t):
                    """`value_t`'s rows (its columns, from the span's first) in pieces of the staging tile's rows,
                    each written once the last has been read."""
                    piece = out_tile.shape[0]
                    for first in range(0, value_t.shape[1], piece):
                        plgpu.wait_smem_to_gmem(0, wait_read_only=True)
                        if in_ptx:
                            _store_transposed(value_t, out_tile, first)
                        else:
                            out_tile.transpose((1, 0))[...] = value_t[:, first : first + piece]
                        plgpu.commit_smem()
                        store_rows(out_tile, dst, row0 + first, lo, hi)

                narrow = min(bm, NARROW_ROWS)
                fits = hi - row0 <= narrow
                pl.when((g >= 0) & fits)(lambda: put(product(step, narrow).astype(out_dtype)))
                if narrow < bm:
                    pl.when((g >= 0) & ~fits)(lambda: put(product(step, bm).astype(out_dtype)))
                zeros = lambda: plgpu.layout_cast(jnp.zeros((WG_COLS, bm), out_dtype), plgpu.Layout.WGMMA)
                pl.when(g < 0)(lambda: put(zeros()))

            compute_units(walk.my_units, walk.unit_of, lambda span: spans.steps(span, k_steps), output_span, False)

    scratch = (
        (
            swizzled((stages, bm, STEP), lhs.dtype),
            swizzled((stages, BLOCK_N, STEP // 2), jnp.uint8),
            plgpu.SMEM((stages, 2, BLOCK_N), fmt.factor_dtype),
            plgpu.SMEM((COMPUTE_WGS, bm // OUT_PIECES, WG_COLS), out_dtype),
        ),
        Ring.barriers(t, 3),  # per step: the lhs rows, the codes, the factors
    )
    out_type = jax.ShapeDtypeStruct((m, n), out_dtype)  # (spans write rows [0, M) only)
    return launch(body, out_type, scratch, num_ctas, *schedule, x, codes, stream_factors(fmt, scales, zeros))
