"""Implementations of every op, per platform. Importing this package registers them all.

`kernel_registry` is re-exported here because upstream code imports it from `ejkernel.kernels`.
"""

from ejkernel.kernels._cuda import flash_attention as _cuda_flash_attention  # noqa: F401
from ejkernel.kernels._cuda import ring_attention as _cuda_ring_attention  # noqa: F401
from ejkernel.kernels._cuda import scaled_dot_product_attention as _cuda_sdpa  # noqa: F401
from ejkernel.kernels._pallas.gpu import blocksparse_attention as _mosaic_gpu_blocksparse_attention  # noqa: F401
from ejkernel.kernels._pallas.gpu import flash_attention as _mosaic_gpu_flash_attention  # noqa: F401
from ejkernel.kernels._pallas.gpu import grouped_matmul as _mosaic_gpu_grouped_matmul  # noqa: F401
from ejkernel.kernels._pallas.tpu import blocksparse_attention as _tpu_blocksparse_attention  # noqa: F401
from ejkernel.kernels._pallas.tpu import flash_attention as _tpu_flash_attention  # noqa: F401
from ejkernel.kernels._pallas.tpu import grouped_matmul as _tpu_grouped_matmul  # noqa: F401
from ejkernel.kernels._pallas.tpu import paged_attention as _tpu_paged_attention  # noqa: F401
from ejkernel.kernels._triton import blocksparse_attention as _triton_blocksparse_attention  # noqa: F401
from ejkernel.kernels._triton import flash_attention as _triton_flash_attention  # noqa: F401
from ejkernel.kernels._triton import flash_mla as _triton_flash_mla  # noqa: F401
from ejkernel.kernels._triton import grouped_matmul as _triton_grouped_matmul  # noqa: F401
from ejkernel.kernels._triton import linear_attention as _triton_linear_attention  # noqa: F401
from ejkernel.kernels._triton import mean_pooling as _triton_mean_pooling  # noqa: F401
from ejkernel.kernels._triton import native_sparse_attention as _triton_native_sparse_attention  # noqa: F401
from ejkernel.kernels._triton import paged_attention as _triton_paged_attention  # noqa: F401
from ejkernel.kernels._triton import ring_attention as _triton_ring_attention  # noqa: F401
from ejkernel.kernels._triton import state_space_v1 as _triton_state_space_v1  # noqa: F401
from ejkernel.kernels._triton import state_space_v2 as _triton_state_space_v2  # noqa: F401
from ejkernel.kernels._xla import attention as _xla_attention  # noqa: F401
from ejkernel.kernels._xla import blocksparse_attention as _xla_blocksparse_attention  # noqa: F401
from ejkernel.kernels._xla import flash_attention as _xla_flash_attention  # noqa: F401
from ejkernel.kernels._xla import flash_mla as _xla_flash_mla  # noqa: F401
from ejkernel.kernels._xla import grouped_matmul as _xla_grouped_matmul  # noqa: F401
from ejkernel.kernels._xla import linear_attention as _xla_linear_attention  # noqa: F401
from ejkernel.kernels._xla import mean_pooling as _xla_mean_pooling  # noqa: F401
from ejkernel.kernels._xla import multi_latent_ragged_page_attention as _xla_mla_ragged_paged  # noqa: F401
from ejkernel.kernels._xla import native_sparse_attention as _xla_native_sparse_attention  # noqa: F401
from ejkernel.kernels._xla import paged_attention as _xla_paged_attention  # noqa: F401
from ejkernel.kernels._xla import quantized_matmul as _xla_quantized_matmul  # noqa: F401
from ejkernel.kernels._xla import ragged_gated_delta_rule as _xla_ragged_gated_delta_rule  # noqa: F401
from ejkernel.kernels._xla import ring_attention as _xla_ring_attention  # noqa: F401
from ejkernel.kernels._xla import scaled_dot_product_attention as _xla_sdpa  # noqa: F401
from ejkernel.kernels._xla import state_space_v1 as _xla_state_space_v1  # noqa: F401
from ejkernel.kernels._xla import state_space_v2 as _xla_state_space_v2  # noqa: F401
from ejkernel.registry import kernel_registry  # noqa: F401  (upstream imports it from here)
