"""The Pallas-Triton Mamba-1 selective scan (chunk-parallel forward and backward kernels)."""

from ejkernel.kernels._triton.state_space_v1._interface import state_space_v1_triton

__all__ = ["state_space_v1_triton"]
