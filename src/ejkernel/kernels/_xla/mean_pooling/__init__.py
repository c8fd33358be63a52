"""Registers the XLA mean pooling."""

from ejkernel.kernels._xla.mean_pooling._interface import mean_pooling_xla
from ejkernel.registry import Backend, Platform, kernel_registry

kernel_registry.register("mean_pooling", Platform.XLA, Backend.ANY, priority=0)(mean_pooling_xla)
