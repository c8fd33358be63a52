"""The XLA Mamba-1 selective scan (chunked associative scan, custom VJP)."""

from ejkernel.kernels._xla.state_space_v1._interface import state_space_v1_xla

__all__ = ["state_space_v1_xla"]
