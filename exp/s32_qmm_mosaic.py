"""Thirty-second session: the Mosaic GPU weight-only `quantized_matmul` (swap AB: 64 features a wgmma's M, decoded
in registers or through shared memory) against the Triton kernel, 8-bit modes in both layouts at M 16 and 64,
K = N = 8192, beside a device copy (issue 45's 0.8 of copy): `python3 exp/s32_qmm_mosaic.py` on an H100/H200. One
flushed line a variant: ms a layer, TB/s over the packed weights, fraction of the copy's bandwidth.
`python3 exp/s32_qmm_mosaic.py int8 --tiles` also times the Mosaic GPU autotuning candidates."""

import functools
import sys

import jax
import jax.numpy as jnp

from ejkernel.benchmarks._harness import time_variants
from ejkernel.benchmarks.quantized_matmul import LAYERS, MODES, SIZE, _layers, _packed
from ejkernel.modules import quantized_matmul
from ejkernel.modules.operations.quantized_matmul import (
    MOSAIC_CANDIDATES,
    QuantizedMatmulConfig,
    QuantizedMatmulMosaicTiling,
)

TILES = "--tiles" in sys.argv
NAMES = [a for a in sys.argv[1:] if not a.startswith("--")] or ["int8", "mxfp8", "nvfp8"]
key = jax.random.PRNGKey(0)
dense = jax.random.normal(key, (SIZE, SIZE), jnp.bfloat16)
copy = time_variants({"copy": lambda: functools.partial(jax.jit(lambda a: a + 1), dense)}, repeats=10, where="copy")
copy_bw = 2 * dense.nbytes / copy["copy"]
print(f"copy {copy_bw / 1e12:.2f} TB/s", flush=True)
variants = {"triton": dict(platform="triton", use_best_config=True), "mosaic": dict(platform="pallas")}
if TILES:
    for block_k, stages in MOSAIC_CANDIDATES:
        tiling = QuantizedMatmulMosaicTiling(block_k=block_k, num_stages=stages)
        variants[f"mosaic bk{block_k} s{stages}"] = dict(
            cfg=QuantizedMatmulConfig(platform="pallas", mosaic_tiling=tiling)
        )
for name in NAMES:
    mode, bits = MODES[name]
    for transpose in (False, True):
        weights = _packed(mode, bits, transpose, SIZE, LAYERS, key)
        for m in (16, 64):
            x = jax.random.normal(key, (m, SIZE), jnp.bfloat16)

            def build(options, weights=weights, mode=mode, bits=bits, transpose=transpose, x=x):
                call = functools.partial(quantized_matmul, bits=bits, mode=mode, transpose=transpose, **options)
                return _layers(call, x, weights)

            where = f"{name} {'col' if transpose else 'row'} M={m}"
            builders = {v: functools.partial(build, options) for v, options in variants.items()}
            for variant, seconds in time_variants(builders, repeats=10, where=where).items():
                seconds /= LAYERS
                bw = weights[0][0].nbytes / seconds
                print(
                    f"{where:16s} {variant:20s} {1e3 * seconds:.4f} ms {bw / 1e12:.2f} TB/s {bw / copy_bw:.2f} of copy",
                    flush=True,
                )
