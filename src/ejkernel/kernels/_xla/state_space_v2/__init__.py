"""The XLA Mamba-2 SSD scan (on the linear-attention family's chunked core)."""

from ejkernel.kernels._xla.state_space_v2._interface import state_space_v2_xla

__all__ = ["state_space_v2_xla"]
