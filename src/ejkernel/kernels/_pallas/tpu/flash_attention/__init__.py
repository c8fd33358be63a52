"""Registers the Pallas Mosaic TPU flash attention (forward and backward kernels).

Validated only in Pallas' TPU interpret mode so far, so it ranks below the XLA path: on a TPU,
`platform="auto"` keeps the XLA implementation and `platform="pallas"` asks for these kernels. Raise
the priority once the suite has passed on a real TPU.
"""

from ejkernel.kernels._common.attention import public_defaults
from ejkernel.kernels._pallas.tpu.flash_attention._interface import flash_attention_tpu
from ejkernel.registry import Backend, Platform, kernel_registry

kernel_registry.register("flash_attention", Platform.PALLAS, Backend.TPU, priority=-10)(
    public_defaults(flash_attention_tpu)
)
