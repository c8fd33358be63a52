"""Registers the native sparse attention whose selected branch runs on Pallas-Triton kernels."""

from ejkernel.kernels._triton.native_sparse_attention._interface import native_sparse_attention_triton
from ejkernel.registry import Backend, Platform, kernel_registry

kernel_registry.register("native_sparse_attention", Platform.TRITON, Backend.GPU, priority=10)(
    native_sparse_attention_triton
)
