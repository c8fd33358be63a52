"""Twenty-eighth session: tilings of the Triton weight-only `quantized_matmul` (int4, int8; M 16; K = N = 8192; the
bench's four distinct layers), on the GPU: `python3 exp/s28_qmm_sweep.py`. Prints ms per layer and the packed
weights' bandwidth."""

import functools

import jax
import jax.numpy as jnp

from ejkernel.benchmarks._harness import time_variants
from ejkernel.benchmarks.quantized_matmul import LAYERS, MODES, SIZE, _layers, _packed
from ejkernel.modules import quantized_matmul
from ejkernel.modules.operations.quantized_matmul import QuantizedMatmulConfig

TILINGS = [None] + [
    dict(block_n=n, block_k=k, split_k=s, num_warps=w)
    for n, k, s, w in (
        (128, 128, 4, 4), (128, 256, 4, 4), (256, 128, 4, 4), (256, 128, 8, 4), (256, 256, 4, 8),
        (128, 128, 2, 4), (256, 64, 8, 4), (64, 256, 4, 4), (128, 64, 8, 4), (512, 64, 8, 8),
    )
]  # fmt: skip
key = jax.random.PRNGKey(0)
x = jax.random.normal(key, (16, SIZE), jnp.bfloat16)
for name in ("int4", "int8"):
    mode, bits = MODES[name]
    weights = _packed(mode, bits, False, SIZE, LAYERS, key)

    def build(tiling, weights=weights, mode=mode, bits=bits):
        options = dict(bits=bits, mode=mode, platform="triton")
        if tiling is None:
            options["use_best_config"] = True
        else:
            options["cfg"] = QuantizedMatmulConfig(platform="triton", num_stages=3, **tiling)
        return _layers(functools.partial(quantized_matmul, **options), x, weights)

    timings = time_variants({str(t): functools.partial(build, t) for t in TILINGS}, repeats=10, where=name)
    for tiling, seconds in timings.items():
        seconds /= LAYERS
        print(f"{name} M=16 {tiling:70s} {1e3 * seconds:.4f} ms {weights[0][0].nbytes / seconds / 1e12:.2f} TB/s")
