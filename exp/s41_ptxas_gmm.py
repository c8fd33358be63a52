"""Session 41: what ptxas says of the grouped-matmul forwards at the MoE shape (M 32768, K 4096, N 1536, 64 groups).

The MXFP4 kernel decodes step s + 1 into registers while step s's wgmma (its A operand in registers) runs; a decode
instruction cost 2.5% of the kernel's time in session 40, as if the decoding never overlapped the products. ptxas
serialises wgmma where non-wgmma instructions define a wgmma's input registers inside its pipeline stage (its info
C7513; it cost block-sparse attention 1.4x a step in session 23, BENCHMARKS.md), and register spills would cost the
same way. Compiled here, each in turn with Mosaic GPU's dumps on: the MXFP4 forward, the FP8 x FP8 forward
(`fp8_lhs`, DeepSeek's 128 x 128 blocks) and the bf16 forward (`auto`); since the 4-bit kernel took affine int4 too
(`_four_bit.py`), its int4 forward (groups of 128) after the MXFP4 one. Prints, per kernel, C7513 and the spill and
register lines; copies the MXFP4 kernel's dumps (PTX, SASS, ptxas log) to `--out` gzipped. Run in a fresh process
without a warm compilation cache (it compiles once per kernel):

    MOSAIC_GPU_DUMP_TO=/tmp/mgpu MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_PTX=1 MOSAIC_GPU_DUMP_SASS=1 \
        python3 exp/s41_ptxas_gmm.py --out $OUT
"""

import argparse
import gzip
import os
import pathlib
import shutil
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from s39_mxfp4 import kernel_call, moe_case

from ejkernel.kernels._common.code_bits import as_bytes
from ejkernel.kernels._common.device import num_sms
from ejkernel.kernels._pallas.gpu.grouped_matmul._four_bit import MosaicGpuFourBitGroupedMatmulTiling
from ejkernel.modules import grouped_matmul

DUMP = pathlib.Path(os.environ["MOSAIC_GPU_DUMP_TO"])


def compiled(label: str, call, out: pathlib.Path | None = None):
    """Runs `call` once (compiling it) and reports what ptxas said of the kernels it compiled; with `out`, their dumps
    are copied there gzipped."""
    before = set(DUMP.iterdir())
    try:
        jax.block_until_ready(call())
    except Exception as err:  # (the others still run)
        print(f"== {label}: failed: {str(err).splitlines()[0][:300]}", flush=True)
        return
    new = sorted(set(DUMP.iterdir()) - before)
    print(f"== {label}: {len(new)} dump files", flush=True)
    for path in new:
        if path.suffix == ".ptxas" or "ptxas" in path.name:
            text = path.read_text(errors="replace")
            lines = [ln.strip() for ln in text.splitlines() if "C7513" in ln or "spill" in ln or "registers" in ln]
            print(f"  {path.name}: serialised {'C7513' in text}", *lines[:12], sep="\n    ", flush=True)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            with path.open("rb") as src, gzip.open(out / f"{path.name}.gz", "wb") as dst:
                shutil.copyfileobj(src, dst)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="out")
    args = p.parse_args()
    DUMP.mkdir(parents=True, exist_ok=True)  # (Mosaic GPU prints to stdout where the folder is missing)
    lhs, w, sizes, q = moe_case("32768,4096,1536,64")
    tiling = MosaicGpuFourBitGroupedMatmulTiling(256, 4, num_sms())
    mx = kernel_call(q, as_bytes(q.data), sizes, tiling)
    compiled("mxfp4", lambda: mx(lhs), pathlib.Path(args.out) / "mxfp4_dump")
    int4 = moe_case("32768,4096,1536,64", "affine")[3]
    affine = kernel_call(int4, as_bytes(int4.data), sizes, tiling)
    compiled("affine int4 g128", lambda: affine(lhs))

    groups, k, n = w.shape
    w8 = jnp.swapaxes(w, 1, 2).astype(jnp.float8_e4m3fn)  # [G, N, K]
    scale = jnp.ones((groups, k // 128, 1, n), jnp.float32)
    fp8 = jax.jit(
        lambda a, b, s: grouped_matmul(
            a,
            b,
            sizes,
            rhs_scale=s,
            use_v3=True,
            fp8_lhs=True,
            transpose_rhs=True,
            platform="pallas",
            preferred_element_type=jnp.bfloat16,
        )
    )
    compiled("fp8 x fp8", lambda: fp8(lhs, w8, scale))
    bf16 = jax.jit(lambda a, b: grouped_matmul(a, b, sizes, preferred_element_type=jnp.bfloat16))
    compiled("bf16 auto", lambda: bf16(lhs, w))


if __name__ == "__main__":
    main()
