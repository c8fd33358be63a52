"""Quantization modes and their parameters: names, defaults and domains, and the grouping axis.

| mode            | codes          | bits             | group_size                      | scales            |
|-----------------|----------------|------------------|---------------------------------|-------------------|
| affine          | unsigned ints  | 1..8, default 4  | 16, 32, ..., 1024; default 64   | float, with zeros |
| nf4             | NF4 index      | 4 (ignored)      | 16, 32, ..., 1024; default 64   | float             |
| mxfp4 / mxfp8   | E2M1 / E4M3    | 4 / 8 (ignored)  | 32                              | uint8 exponent    |
| nvfp4 / nvfp8   | E2M1 / E4M3    | 4 / 8 (ignored)  | 16                              | uint8 E4M3 code   |
"""

import numbers
from typing import Literal, NamedTuple

QuantizationMode = Literal["affine", "nf4", "mxfp4", "mxfp8", "nvfp4", "nvfp8"]
"""The type of `mode`: the quantization formats `quantize` knows (any case is accepted at run time)."""
QuantizationAxis = Literal["row", "col"]
"""The type of `axis`: `"row"` or `"col"` (see `quantize` and `quantized_matmul`, which use them differently)."""

MODES = ("affine", "nf4", "mxfp4", "mxfp8", "nvfp4", "nvfp8")
AXES = ("row", "col")
GROUP_SIZES = (16, 32, 64, 128, 256, 512, 1024)
_FIXED_BITS = {"nf4": 4, "mxfp4": 4, "mxfp8": 8, "nvfp4": 4, "nvfp8": 8}
_FIXED_GROUP = {"mxfp4": 32, "mxfp8": 32, "nvfp4": 16, "nvfp8": 16}


class QuantParams(NamedTuple):
    """One mode with its group size and code width, resolved and checked."""

    mode: str
    group_size: int
    bits: int

    @property
    def float_scales(self) -> bool:
        """Whether the scales are floats (affine, nf4) rather than uint8 codes (mx*, nv*)."""
        return self.mode in ("affine", "nf4")

    @property
    def codebook(self) -> str:
        """What a code means: `"int"` (affine), `"nf4"`, `"e2m1"` or `"e4m3"`."""
        if self.mode in ("affine", "nf4"):
            return "int" if self.mode == "affine" else "nf4"
        return "e2m1" if self.bits == 4 else "e4m3"


def _is_int(value) -> bool:
    """Python and NumPy integers, not bools."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def resolve_params(mode, group_size, bits) -> QuantParams:
    """The mode's name lower-cased, and its group size and bits with defaults filled in and domains checked."""
    if not isinstance(mode, str):
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    name = mode.lower()
    if name in ("mxfp", "nvfp"):
        raise ValueError(f"mode={mode!r} names no element format: use {name}4 or {name}8")
    if name not in MODES:
        raise ValueError(f"mode must be one of {MODES} (any case), got {mode!r}")
    if name in _FIXED_GROUP:
        fixed = _FIXED_GROUP[name]
        if group_size is not None and group_size != fixed:
            raise ValueError(f"group_size must be {fixed} for mode {name!r}, got {group_size!r}")
        group_size = fixed
    elif group_size is None:
        group_size = 64
    elif not _is_int(group_size) or group_size not in GROUP_SIZES:
        raise ValueError(f"group_size must be one of {GROUP_SIZES} for mode {name!r}, got {group_size!r}")
    group_size = int(group_size)
    if name != "affine":
        return QuantParams(name, group_size, _FIXED_BITS[name])  # the format fixes the width: `bits` is ignored
    if bits is None:
        bits = 4
    elif not _is_int(bits) or not 1 <= bits <= 8:
        raise ValueError(f"bits must be an int in 1..8 for mode 'affine', got {bits!r}")
    return QuantParams(name, group_size, int(bits))


def resolve_axis(axis) -> str:
    """`"row"` or `"col"`, else a `ValueError`."""
    if axis not in AXES:
        raise ValueError(f"axis must be 'row' or 'col', got {axis!r}")
    return axis


def packed_words(n: int, bits: int) -> int:
    """32-bit words holding `n` codes of `bits` bits: `ceil(n * bits / 32)`."""
    return -(-n * bits // 32)
