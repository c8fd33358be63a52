"""Registers the XLA Mamba-1 selective scan (chunked associative scan, custom VJP)."""

from ejkernel.kernels._xla.state_space_v1._interface import state_space_v1_xla
from ejkernel.registry import Backend, Platform, kernel_registry

kernel_registry.register("state_space_v1", Platform.XLA, Backend.ANY, priority=0)(state_space_v1_xla)
