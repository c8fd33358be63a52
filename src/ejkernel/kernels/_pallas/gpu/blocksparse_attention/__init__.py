"""Registers the Pallas Mosaic GPU (Hopper) block-sparse attention: flash attention's forward, dQ and dK/dV
(or fused backward) kernels walking the block table.

Ranked below the Triton kernels for now (5 against 10; XLA is 0): `platform="pallas"` (or a config for
it) selects these kernels, `auto` still takes Triton. On an H100 (`exp/bsa_gpu.py`, S=16384 H=16 D=128
bf16, random blocks at 10% / 25%) they trained in 1.86 / 4.07 ms against Triton's 3.25 / 7.33 and matched
XLA in two of its three checks (the third, segment ids, did not run); their GPU tests have not run yet:
the priority goes above Triton's once they have passed. Calls these kernels
decline (bias, dense masks that vary within a tile or are traced, other dtypes / head dims,
non-Hopper GPUs) fall to Triton.
"""

from ejkernel.kernels._pallas.gpu.blocksparse_attention._interface import blocksparse_attention_mosaic_gpu
from ejkernel.registry import Backend, Platform, kernel_registry

kernel_registry.register("blocksparse_attention", Platform.PALLAS, Backend.GPU, priority=5)(
    blocksparse_attention_mosaic_gpu
)
