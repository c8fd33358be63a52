"""Registers the XLA native sparse attention (compressed branch in jnp, selected branch with a custom VJP)."""

from ejkernel.kernels._xla.native_sparse_attention._interface import native_sparse_attention_xla
from ejkernel.registry import Backend, Platform, kernel_registry

kernel_registry.register("native_sparse_attention", Platform.XLA, Backend.ANY, priority=0)(native_sparse_attention_xla)
