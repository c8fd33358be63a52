"""Session 42: what the 4-bit kernel's decode costs, part by part (MXFP4, timing only: the outputs are wrong).

Call 2's profile put about 780 cycles of a 1350-cycle step in the decode when the tensor cores ran beside it (about
530 when they did not), though its PTX holds some 130 instructions: one `ldmatrix`, four `ld.shared.b16` (the
factors), then the relayout's 8 `shfl.bfly` and 8 `prmt` (two dependent rounds through the shared-memory crossbar)
and four 23-instruction decodes. Variants of `_four_bit._register_operand`, each timed beside the kernel as it is:

- `no relayout`: the four loaded code registers go to the PTX as loaded (no shuffles);
- `no relayout, no factors`: also a constant factor in place of the four `ld.shared.b16` and their broadcast;
- `no decode`: the A operand is the loaded registers themselves, repeated (no PTX, no relayout, no factors).

    python exp/s42_decode_cost.py --out $OUT
"""

import pathlib
import sys

import jax.numpy as jnp
import numpy as np
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.pallas import mosaic_gpu as plgpu
from jaxlib.mlir import ir

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from s39_mxfp4 import patched_variants

from ejkernel.kernels._pallas.gpu.grouped_matmul import _four_bit as fb


def operand(variant: str):
    def register_operand(fmt, codes_smem, factors_smem):
        codes = plgpu.load(codes_smem, layout=plgpu.Layout.WGMMA_8BIT)
        rows = codes.shape[0]
        factors = fb._factors(fmt, factors_smem, rows) if variant == "no relayout" else ()

        @plgpu.inline_mgpu(
            arg_types=(plgpu.Layout.WGMMA_8BIT, *(plgpu.Layout.WGMMA for _ in factors)),
            return_type=plgpu.ShapeDtypeStruct((rows, fb.STEP), jnp.bfloat16, layout=plgpu.Layout.WGMMA),
        )
        def assemble(_, codes, *factors):
            i32 = ir.IntegerType.get_signless(32)
            raw = [mgpu.utils.bitcast(r, i32) for r in codes.registers.flat]
            shape = mgpu.FragmentedArray.splat(
                mgpu.utils.c(0, ir.BF16Type.get()), (rows, fb.STEP), mgpu.WGMMA_LAYOUT
            ).registers.shape
            bf16_pair = ir.VectorType.get((2,), ir.BF16Type.get())
            registers = np.empty(shape, dtype=object)
            targets = list(np.ndindex(shape))
            for n, index in enumerate(targets):
                if variant == "no decode":
                    registers[index] = mgpu.utils.bitcast(raw[n % len(raw)], bf16_pair)
                    continue
                if n % 4:
                    continue
                four = targets[n : n + 4]
                packed = raw[(n // 4) % len(raw)]
                if factors:
                    scale = mgpu.utils.bitcast(factors[0].registers[index], i32)
                else:
                    scale = mgpu.utils.c(0x3F803F80, i32)  # (1.0, 1.0)
                words = fb._asm_words(fb._WORDS_PTX, packed, scale, constraints="=r,=r,=r,=r,r,r")
                for word, i in zip(words, four, strict=True):
                    registers[i] = mgpu.utils.bitcast(word, bf16_pair)
            return mgpu.FragmentedArray(_registers=registers, _layout=mgpu.WGMMA_LAYOUT, _is_signed=None)

        return assemble(codes, *factors)

    return register_operand


if __name__ == "__main__":
    variants = {"as is": fb._register_operand}
    variants |= {v: operand(v) for v in ("no relayout", "no relayout, no factors", "no decode")}
    patched_variants("_register_operand", variants, "gmm_decode_cost_s42")
