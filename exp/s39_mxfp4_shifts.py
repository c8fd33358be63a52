"""Session 39's first PTX decoding of MXFP4 codes (calls 3-6), kept as a trial for A/B runs against `_mxfp4`'s
table lookup: each word's bf16 bits placed by shifts and masks as `value · 2^-126`, then multiplied by 2^127 and
by the group's `2^(e - 1)`. `decoded_words` stands in for `_mxfp4._decoded_words` (`exp/_kit.patched`)."""

from jax.experimental.mosaic import gpu as mgpu
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import llvm

from ejkernel.kernels._pallas.gpu.grouped_matmul import _mxfp4

# One decoded word from byte `j` of a code register, in PTX: the bf16 bits of both codes as `value · 2^-126` (sign to
# bit 15 / 31, exponent and mantissa bits to the bf16's lowest exponent bits and highest mantissa bit, the code 0.5 a
# subnormal), times 2^127, then times the group's `2^(e - 1)` (both exact products, rounded once as the reference
# rounds its float32 value): four shifts, four masks and three ors (ptxas fuses them into `lop3`s) and two bf16x2
# multiplies for two values.
_WORD_PTX = """{{
.reg .b32 c, t, w, f;
shr.b32 c, $1, {shift};
shl.b32 w, c, 6;
and.b32 w, w, 0x1C0;
shl.b32 t, c, 12;
and.b32 t, t, 0x8000;
or.b32 w, w, t;
shl.b32 t, c, 18;
and.b32 t, t, 0x1C00000;
or.b32 w, w, t;
shl.b32 t, c, 24;
and.b32 t, t, 0x80000000;
or.b32 w, w, t;
mov.b32 t, 0x7F007F00;
mul.rn.bf16x2 w, w, t;
cvt.rn.bf16x2.f32 f, $2, $2;
mul.rn.bf16x2 $0, w, f;
}}"""


def _shifted_words(both, half_factor):
    """The register's two decoded words (`_WORD_PTX` once per byte), as `_mxfp4._assembled_words` takes them."""
    i32 = ir.IntegerType.get_signless(32)
    halves = [llvm.inline_asm(i32, [both, half_factor], _WORD_PTX.format(shift=8 * j), "=r,r,f") for j in range(2)]
    return mgpu.utils.vector_concat([mgpu.utils.bitcast(h, ir.VectorType.get((1,), i32)) for h in halves])


def decoded_words(codes_smem, scales_smem):
    """Stands in for `_mxfp4._decoded_words`: the same words, the bits placed by shifts (the factor halved for the
    2^127 the word's first product takes)."""
    codes, factor = _mxfp4._codes_and_factors(codes_smem, scales_smem)
    return _mxfp4._assembled_words(codes, factor * 0.5, _shifted_words)
