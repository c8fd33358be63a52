"""Registers the Pallas Mosaic TPU kernel for `page_attention` and `ragged_page_attention_v3`.

Validated only in Pallas' TPU interpret mode so far, so it ranks below the XLA path: on a TPU,
`platform="auto"` keeps XLA and `platform="pallas"` asks for the kernel. Raise the priority once the
suite has passed on a real TPU.
"""

from ejkernel.kernels._common.paged_attention.implementations import implementation
from ejkernel.kernels._pallas.tpu.paged_attention._interface import paged_attention_tpu_core
from ejkernel.registry import Backend, Platform, kernel_registry

for _algorithm in ("page_attention", "ragged_page_attention_v3"):
    kernel_registry.register(_algorithm, Platform.PALLAS, Backend.TPU, priority=-10)(
        implementation(_algorithm, paged_attention_tpu_core, f"{_algorithm}_tpu")
    )
