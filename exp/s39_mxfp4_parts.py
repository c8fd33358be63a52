"""Issue 45, session 39: where the MXFP4 grouped matmul's time goes (`_mxfp4.mxfp4_gmm`, 128 x 256 spans shared by
both compute warpgroups, the MoE shape). Each variant removes a part (wrong values, times only), traced with the
kernel module patched (`exp/_kit.patched`), all timed in one run beside our bf16 grouped matmul:

- `full`: as in src;
- `shifts`: the codes' bits placed by shifts (`exp/s39_mxfp4_shifts.py`, calls 3-6) in place of the table lookup;
- `zeros`: no decoding (each warpgroup stores zero words): the wgmmas, the ring and the barriers;
- `raw`: the codes loaded and stored as words, no arithmetic and no scales (calls 5 and 6; call 7 ran without it);
- `no-mma`: the decoding without the wgmmas;
- `bare`: neither (the ring, the barriers and the stores).

    python exp/s39_mxfp4_parts.py --out $OUT
"""

import argparse
import functools
import pathlib
import sys

import jax
import jax.numpy as jnp
from jax.experimental.pallas import mosaic_gpu as plgpu

from ejkernel.kernels._common.code_bits import as_bytes
from ejkernel.kernels._common.device import num_sms
from ejkernel.kernels._pallas.gpu.grouped_matmul import _mxfp4
from ejkernel.modules import grouped_matmul

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _kit import patched
from s39_mxfp4 import moe_case, report
from s39_mxfp4_shifts import decoded_words as shifted_words


def zeros(codes_smem, scales_smem):
    rows, words = codes_smem.shape
    return plgpu.layout_cast(jnp.zeros((rows, words), jnp.uint32), plgpu.Layout.WGMMA)


def raw(codes_smem, scales_smem):
    codes = plgpu.load(codes_smem, layout=plgpu.Layout.WGMMA_UPCAST_2X)
    return plgpu.layout_cast(codes, plgpu.Layout.WGMMA).astype(jnp.uint32)


def no_mma(ring, step0, steps, shape, multiply, decode, decoded):
    return LOOP(ring, step0, steps, shape, lambda *args: None, decode, decoded)


LOOP = _mxfp4.decoded_k_loop
VARIANTS = {
    "bare": {"_decoded_words": zeros, "decoded_k_loop": no_mma},
    "full": {},
    "shifts": {"_decoded_words": shifted_words},
    "zeros": {"_decoded_words": zeros},
    "raw": {"_decoded_words": raw},
    "no-mma": {"decoded_k_loop": no_mma},
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tiles", default="128x256x3")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", default="out")
    args = p.parse_args()
    lhs, w, sizes, q = moe_case("32768,4096,1536,64")
    codes = as_bytes(q.data)
    bf16 = jax.jit(lambda a: grouped_matmul(a, w, sizes, preferred_element_type=jnp.bfloat16))
    calls = {"bf16 auto": functools.partial(bf16, lhs)}
    bm, bn, stages = map(int, args.tiles.split("x"))
    tiling = _mxfp4.MosaicGpuMxfp4GroupedMatmulTiling(bm, bn, stages, num_sms())
    run = functools.partial(_mxfp4.mxfp4_gmm, out_dtype=jnp.bfloat16, tiling=tiling)
    for name, patch in VARIANTS.items():
        with patched(_mxfp4, **patch):
            compiled = jax.jit(lambda a: run(a, codes, q.scales, sizes, None)).lower(lhs).compile()
        calls[name] = functools.partial(compiled, lhs)
        jax.block_until_ready(calls[name]())
    report(calls, args.repeats, args.out, "s39_mxfp4_parts")


if __name__ == "__main__":
    main()
