"""Thirtieth session: the Triton weight-only `quantized_matmul` with 8-bit codes loaded as bytes (`_decode.byte_codes`)
at a few tilings, int8 and mxfp8, both layouts, M 16, K = N = 8192, beside a device copy (issue 45's 0.8 of copy):
`python3 exp/s30_qmm_bytes.py` on the GPU. One line a variant: ms a layer, TB/s over the packed weights, fraction of
the copy's bandwidth. `python3 exp/s30_qmm_bytes.py mxfp8 nvfp8 --defaults`: those modes at the heuristic's tiles
only."""

import functools
import sys

import jax
import jax.numpy as jnp

from ejkernel.benchmarks._harness import time_variants
from ejkernel.benchmarks.quantized_matmul import LAYERS, MODES, SIZE, _layers, _packed
from ejkernel.modules import quantized_matmul
from ejkernel.modules.operations.quantized_matmul import QuantizedMatmulConfig

DEFAULTS_ONLY = "--defaults" in sys.argv
NAMES = [a for a in sys.argv[1:] if not a.startswith("--")] or ["int8", "mxfp8"]
TILINGS = [None] + [
    dict(block_n=n, block_k=k, split_k=s, num_warps=w, num_stages=st)
    for n, k, s, w, st in (
        (256, 64, 8, 4, 3), (128, 128, 8, 4, 3), (128, 64, 16, 4, 3), (256, 128, 16, 8, 3),
        (64, 128, 16, 4, 4), (128, 128, 16, 4, 2), (64, 256, 8, 4, 3),
    )
]  # fmt: skip
key = jax.random.PRNGKey(0)
x = jax.random.normal(key, (16, SIZE), jnp.bfloat16)
dense = jax.random.normal(key, (SIZE, SIZE), jnp.bfloat16)
copy = time_variants({"copy": lambda: functools.partial(jax.jit(lambda a: a + 1), dense)}, repeats=10, where="copy")
copy_bw = 2 * dense.nbytes / copy["copy"]
print(f"copy {copy_bw / 1e12:.2f} TB/s", flush=True)
TILINGS = TILINGS[:1] if DEFAULTS_ONLY else TILINGS
for name in NAMES:
    mode, bits = MODES[name]
    for transpose in (False, True):
        weights = _packed(mode, bits, transpose, SIZE, LAYERS, key)

        def build(tiling, weights=weights, mode=mode, bits=bits, transpose=transpose):
            options = dict(bits=bits, mode=mode, platform="triton", transpose=transpose)
            if tiling is None:
                options["use_best_config"] = True
            else:
                options["cfg"] = QuantizedMatmulConfig(platform="triton", **tiling)
            return _layers(functools.partial(quantized_matmul, **options), x, weights)

        where = f"{name} {'col' if transpose else 'row'}"
        timings = time_variants({str(t): functools.partial(build, t) for t in TILINGS}, repeats=10, where=where)
        for tiling, seconds in timings.items():
            seconds /= LAYERS
            bw = weights[0][0].nbytes / seconds
            print(f"{where} M=16 {tiling:86s} {1e3 * seconds:.4f} ms {bw / 1e12:.2f} TB/s {bw / copy_bw:.2f} of copy")
