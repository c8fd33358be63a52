"""The Pallas-Triton Mamba-2 SSD scan (the GLA kernels of the linear-attention family)."""

from ejkernel.kernels._triton.state_space_v2._interface import state_space_v2_triton

__all__ = ["state_space_v2_triton"]
