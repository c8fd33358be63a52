"""Weight quantization: packed integer and minifloat codes with per-group scales.

`quantize` groups weights, encodes each group (affine, nf4, mxfp4/8, nvfp4/8: `modes`), and packs the
codes LSB-first into uint32 words (`packing`); `dequantize` inverts it; `prepack_quantized_weights` lays
weights out for `ejkernel.modules.quantized_matmul`. `turboquant` holds the codebook and random matrices
of TurboQuant KV-cache compression. Imports JAX and NumPy only, so it loads on any host.
"""

from ejkernel.quantization.array import QuantizedArray, prepack_quantized_array, quantize_array
from ejkernel.quantization.decode import dequantize
from ejkernel.quantization.encode import prepack_quantized_weights, quantize
from ejkernel.quantization.matmul import dense_quantized_matmul
from ejkernel.quantization.modes import QuantizationAxis, QuantizationMode
from ejkernel.quantization.runtime import (
    QuantRuntimeConfig,
    clear_runtime_autotune_cache,
    runtime_autotune_cache_sizes,
)

__all__ = [
    "QuantRuntimeConfig",
    "QuantizationAxis",
    "QuantizationMode",
    "QuantizedArray",
    "clear_runtime_autotune_cache",
    "dense_quantized_matmul",
    "dequantize",
    "prepack_quantized_array",
    "prepack_quantized_weights",
    "quantize",
    "quantize_array",
    "runtime_autotune_cache_sizes",
]
