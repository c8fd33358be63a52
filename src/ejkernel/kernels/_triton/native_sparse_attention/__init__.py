"""The native sparse attention whose selected branch runs on Pallas-Triton kernels."""

from ejkernel.kernels._triton.native_sparse_attention._interface import native_sparse_attention_triton

__all__ = ["native_sparse_attention_triton"]
