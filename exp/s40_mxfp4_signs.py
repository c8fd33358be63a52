"""Issue 45, session 40: the MXFP4 grouped matmul's PTX decoding with each code's sign set in its high byte before the
bytes are interleaved (`_mxfp4._WORDS_PTX` since session 40: 12 instructions a register) against session 39's signs
set in each word after it (16), at the bench's MoE shape, beside bf16. Both give the same words for every pair of
code bytes (checked in Python); the run checks them against XLA.

    python exp/s40_mxfp4_signs.py --out $OUT
"""

from s39_mxfp4 import patched_variants

from ejkernel.kernels._pallas.gpu.grouped_matmul import _mxfp4

SESSION_39_WORDS_PTX = """{
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


def main():
    patched_variants(
        "_WORDS_PTX",
        {"signs in high bytes": _mxfp4._WORDS_PTX, "signs in words (s39)": SESSION_39_WORDS_PTX},
        "s40_mxfp4_signs",
    )


if __name__ == "__main__":
    main()
