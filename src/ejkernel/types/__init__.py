"""Argument types shared by the ops: `MaskInfo` and the canonical mask it hands to kernels."""

from ejkernel.types.mask_info import CanonicalMask, MaskInfo

__all__ = ["CanonicalMask", "MaskInfo"]
