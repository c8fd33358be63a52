"""Registers the XLA grouped matmul (tile-schedule loop, custom VJP)."""

from ejkernel.kernels._xla.grouped_matmul._interface import grouped_matmul_xla
from ejkernel.registry import Backend, Platform, kernel_registry

kernel_registry.register("grouped_matmul", Platform.XLA, Backend.ANY, priority=0)(grouped_matmul_xla)
