"""The XLA native sparse attention (compressed branch in jnp, selected branch with a custom VJP)."""

from ejkernel.kernels._xla.native_sparse_attention._interface import native_sparse_attention_xla

__all__ = ["native_sparse_attention_xla"]
