"""Registers the Pallas Mosaic GPU (Hopper) block-sparse attention: flash attention's forward, dQ and dK/dV
(or fused backward) kernels walking the block table.

Ranked below the Triton kernels for now (5 against 10; XLA is 0): `platform="pallas"` (or a config for
it) selects these kernels, `auto` still takes Triton. They lower for CUDA and run in Mosaic GPU
interpret mode on a CPU, but have not yet been timed on a GPU (`exp/bsa_gpu.py` is the experiment);
the priority is to be raised above Triton's once an H100 run shows them faster. Calls these kernels
decline (bias, dense masks that vary within a tile or are traced, other dtypes / head dims,
non-Hopper GPUs) fall to Triton.
"""

from ejkernel.kernels._pallas.gpu.blocksparse_attention._interface import blocksparse_attention_mosaic_gpu
from ejkernel.registry import Backend, Platform, kernel_registry

kernel_registry.register("blocksparse_attention", Platform.PALLAS, Backend.GPU, priority=5)(
    blocksparse_attention_mosaic_gpu
)
