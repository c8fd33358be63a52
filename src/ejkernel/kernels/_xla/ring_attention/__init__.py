"""Registers the XLA ring attention (K/V blocks around a mesh axis, XLA flash attention per step)."""

from ejkernel.kernels._xla.ring_attention._interface import ring_attention_xla
from ejkernel.registry import Backend, Platform, kernel_registry

kernel_registry.register("ring_attention", Platform.XLA, Backend.ANY, priority=0)(ring_attention_xla)
