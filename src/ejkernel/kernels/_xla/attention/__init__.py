"""Registers the dense XLA attention (returns the weights too)."""

from ejkernel.kernels._common.attention import public_defaults
from ejkernel.kernels._xla.attention._interface import attention_xla
from ejkernel.registry import Backend, Platform, kernel_registry

kernel_registry.register("attention", Platform.XLA, Backend.ANY, priority=0)(public_defaults(attention_xla))
