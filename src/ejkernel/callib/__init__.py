"""Call helpers upstream ejkernel exports and EasyDeL imports: `ejit` (a `jax.jit` that takes the same options)
and `cdiv` (exact ceiling division for ints and arrays)."""

from ejkernel.callib._ejit import cdiv, ejit

__all__ = ["cdiv", "ejit"]
