"""Argument types shared by the ops: `MaskInfo` and the canonical mask it hands to kernels.

`mask_info` holds `MaskInfo`'s fields, constructors and `replace`; `mask_views` its queries and
`CanonicalMask`; `mask_transforms` its transforms; `mask_arrays` the array helpers behind them;
`windows` the `(left, right)` sliding windows; `mask` upstream's path for the public names.
"""

from ejkernel.types.mask_info import MaskInfo
from ejkernel.types.mask_views import CanonicalMask

__all__ = ["CanonicalMask", "MaskInfo"]
