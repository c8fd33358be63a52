"""Thirty-second session: the Mosaic GPU weight-only `quantized_matmul` (swap AB: 64 features a wgmma's M, decoded
in registers or through shared memory; round two: each step's wgmma runs while the next step decodes) against the
Triton kernel, 8-bit modes in both layouts at M 16 and 64, K = N = 8192, beside a device copy (issue 45's 0.8 of
copy): `python3 exp/s32_qmm_mosaic.py [int8 mxfp8 nvfp8] [--tiles]` on an H100/H200. One flushed line a variant:
ms a layer, TB/s over the packed weights, fraction of the copy's bandwidth; first a line with the tiles the
kernel's defaults plan for the call.

Variants: `triton` (its best config), `auto` (what a user gets: Triton where `SLOWER_THAN_TRITON` declines the
Mosaic GPU kernel), `mosaic` (the kernel's default tiles, asked by an empty `mosaic_tiling`, so never declined),
`mosaic bk128` and `mosaic bk256` (the step asked: 256 keeps 2 slots where the default plans 128), and where affine
codes with transpose take their scales after the product (M 16), `mosaic codes scaled` (the scales applied to the
codes instead, `SCALE_AFTER_MAX_TOKENS` 0 while it traces). `--tiles` adds the autotuning candidates and the default
tiles with 1 and 4 contraction splits."""

import functools
import sys

import jax
import jax.numpy as jnp

from ejkernel.benchmarks._harness import time_variants
from ejkernel.benchmarks.quantized_matmul import LAYERS, MODES, SIZE, _layers, _packed
from ejkernel.kernels._pallas.gpu.quantized_matmul import _interface
from ejkernel.modules import quantized_matmul
from ejkernel.modules.operations.quantized_matmul import (
    MOSAIC_CANDIDATES,
    QuantizedMatmulConfig,
    QuantizedMatmulMosaicTiling,
)
from ejkernel.quantization.modes import resolve_params

TILES = "--tiles" in sys.argv
NAMES = [a for a in sys.argv[1:] if not a.startswith("--")] or ["int8", "mxfp8", "nvfp8"]


def mosaic(**tiles):
    return dict(cfg=QuantizedMatmulConfig(platform="pallas", mosaic_tiling=QuantizedMatmulMosaicTiling(**tiles)))


def codes_scaled(build):
    """`build`'s call run with the Mosaic GPU kernel's scales applied to the codes (traced at its first call)."""
    call = build()

    def run():
        _interface.SCALE_AFTER_MAX_TOKENS = 0
        try:
            return call()
        finally:
            _interface.SCALE_AFTER_MAX_TOKENS = SCALE_AFTER_MAX_TOKENS

    return run


SCALE_AFTER_MAX_TOKENS = _interface.SCALE_AFTER_MAX_TOKENS


key = jax.random.PRNGKey(0)
dense = jax.random.normal(key, (SIZE, SIZE), jnp.bfloat16)
copy = time_variants({"copy": lambda: functools.partial(jax.jit(lambda a: a + 1), dense)}, repeats=10, where="copy")
copy_bw = 2 * dense.nbytes / copy["copy"]
print(f"copy {copy_bw / 1e12:.2f} TB/s", flush=True)
variants = {
    "triton": dict(platform="triton", use_best_config=True),
    "auto": {},
    "mosaic": mosaic(),
    "mosaic bk128": mosaic(block_k=128),
    "mosaic bk256": mosaic(block_k=256),
}
if TILES:
    for block_k, stages in MOSAIC_CANDIDATES:
        variants[f"mosaic bk{block_k} s{stages}"] = mosaic(block_k=block_k, num_stages=stages)
    for splits in (1, 4):
        variants[f"mosaic split{splits}"] = mosaic(split_k=splits)
for name in NAMES:
    mode, bits = MODES[name]
    params = resolve_params(mode, None, bits)
    for transpose in (False, True):
        weights = _packed(mode, bits, transpose, SIZE, LAYERS, key)
        for m in (16, 64):
            x = jax.random.normal(key, (m, SIZE), jnp.bfloat16)
            where = f"{name} {'col' if transpose else 'row'} M={m}"
            st, tiling = _interface.plan(mosaic()["cfg"], params, transpose, m, SIZE, SIZE, jnp.bfloat16)
            plan = f"bk{tiling.block_k} s{tiling.stages} split{tiling.splits} scale_after={st.scale_after}"
            print(f"{where:16s} default plan: {plan}", flush=True)

            def build(options, weights=weights, mode=mode, bits=bits, transpose=transpose, x=x):
                call = functools.partial(quantized_matmul, bits=bits, mode=mode, transpose=transpose, **options)
                return _layers(call, x, weights)

            builders = {v: functools.partial(build, options) for v, options in variants.items()}
            if st.scale_after:
                builders["mosaic codes scaled"] = functools.partial(codes_scaled, builders["mosaic"])
            for variant, seconds in time_variants(builders, repeats=10, where=where).items():
                seconds /= LAYERS
                bw = weights[0][0].nbytes / seconds
                print(
                    f"{where:16s} {variant:20s} {1e3 * seconds:.4f} ms {bw / 1e12:.2f} TB/s {bw / copy_bw:.2f} of copy",
                    flush=True,
                )
