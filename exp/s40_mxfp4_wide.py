"""Issue 45, prepared in session 40 for the next device call: the MXFP4 grouped matmul's decoding eight codes at a time.

`_mxfp4._register_operand` hands `_WORDS_PTX` two code bytes at a time, assembled from two one-byte registers of the
relaid-out codes (zero-extended, shifted, or-ed), and converts the group's scale to bf16 once per two bytes. Here
each 32-bit register of the relayout (four bytes: the codes of four consecutive 8-column blocks, one scale group)
goes to the PTX whole, and four words come back: no byte assembly, one conversion per four bytes. The PTX is
`_WORDS_PTX` twice (codes 0-3 of the register, then 4-7) with the tables loaded once; a Python emulation of both
programs gave the same words for 3000 random registers, and it lowers for CUDA under JAX 0.11.2 and 0.12 (session 40;
the checks were not kept). Not yet run on a GPU.

    python exp/s40_mxfp4_wide.py --out $OUT       (beside the kernel as it is, and bf16; checked against XLA)
"""

import jax.numpy as jnp
import numpy as np
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.pallas import mosaic_gpu as plgpu
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import llvm, vector
from s39_mxfp4 import patched_variants

from ejkernel.kernels._pallas.gpu.grouped_matmul import _mxfp4

_HALF = """and.b32 sel, {codes}, 0x7777;
prmt.b32 lb, l0, l4, sel;
prmt.b32 hb, h0, h4, sel;
prmt.b32 x, $4, $4, {spread};
shl.b32 t, x, 4;
lop3.b32 t, t, x, 0x00800080, 0xe4;
lop3.b32 hb, hb, t, 0x80808080, 0xf8;
prmt.b32 t, lb, hb, 0x5140;
mul.rn.bf16x2 ${out0}, t, f;
prmt.b32 t, lb, hb, 0x7362;
mul.rn.bf16x2 ${out1}, t, f;
"""
WIDE_PTX = (
    "{{\n.reg .b32 sel, l0, l4, h0, h4, lb, hb, x, t, f, c;\n"
    "mov.b32 l0, {low0};\nmov.b32 l4, {low4};\nmov.b32 h0, {high0};\nmov.b32 h4, {high4};\n"
    "cvt.rn.bf16x2.f32 f, $5, $5;\n".format(**_mxfp4._magnitude_tables())
    + _HALF.format(codes="$4", spread="0x1100", out0=0, out1=1)
    + "shr.b32 c, $4, 16;\n"
    + _HALF.format(codes="c", spread="0x3322", out0=2, out1=3)
    + "}"
)


def register_operand_wide(codes_smem, scales_smem):
    """`_mxfp4._register_operand` with each relaid-out 32-bit register of codes decoded whole by `WIDE_PTX`."""
    codes = plgpu.load(codes_smem, layout=plgpu.Layout.WGMMA_8BIT)
    rows = codes.shape[0]

    @plgpu.inline_mgpu(
        arg_types=(plgpu.Layout.WGMMA_8BIT, plgpu.Layout.WGMMA),
        return_type=plgpu.ShapeDtypeStruct((rows, _mxfp4.STEP), jnp.bfloat16, layout=plgpu.Layout.WGMMA),
    )
    def assemble(_, codes, factor):
        i32 = ir.IntegerType.get_signless(32)
        pairs = _mxfp4.code_pairs(codes)
        first = lambda v: vector.extract(v, dynamic_position=[], static_position=ir.DenseI64ArrayAttr.get([0]))
        bf16_pair = ir.VectorType.get((2,), ir.BF16Type.get())
        out_type = ir.Type.parse("!llvm.struct<(i32, i32, i32, i32)>")
        registers = np.empty(pairs.shape, dtype=object)
        for index in np.ndindex(pairs.shape):
            if index[1] % 4:  # (axis 1: the 8-column blocks; blocks 4t .. 4t + 3 share a scale group and a register)
                continue
            four = [(index[0], index[1] + i, *index[2:]) for i in range(4)]
            word = mgpu.utils.bitcast(mgpu.utils.vector_concat([pairs[i] for i in four]), i32)
            words = llvm.inline_asm(out_type, [word, first(factor.registers[index])], WIDE_PTX, "=r,=r,=r,=r,r,f")
            for w, i in enumerate(four):
                registers[i] = mgpu.utils.bitcast(llvm.extractvalue(i32, words, [w]), bf16_pair)
        return mgpu.FragmentedArray(_registers=registers, _layout=mgpu.WGMMA_LAYOUT, _is_signed=None)

    return assemble(codes, _mxfp4._factors(scales_smem, rows))


def main():
    patched_variants(
        "_register_operand",
        {"two bytes a PTX call": _mxfp4._register_operand, "four bytes": register_operand_wide},
        "s40_mxfp4_wide",
    )


if __name__ == "__main__":
    main()
