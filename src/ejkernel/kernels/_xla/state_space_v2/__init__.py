"""Registers the XLA Mamba-2 SSD scan (on the linear-attention family's chunked core)."""

from ejkernel.kernels._xla.state_space_v2._interface import state_space_v2_xla
from ejkernel.registry import Backend, Platform, kernel_registry

kernel_registry.register("state_space_v2", Platform.XLA, Backend.ANY, priority=0)(state_space_v2_xla)
