"""Sliding windows as `(left, right)` pairs: query `i` sees keys `i - left <= j <= i + right`. Read by
`MaskInfo` and by every attention op and kernel that takes a window."""

import numpy as np

Window = tuple[int, int]
UNLIMITED = 2**30
"""A window side given as None (no limit); large, yet safe in int32 position arithmetic."""


def window_pair(window: int | tuple[int, int], name: str = "window") -> Window:
    """An int `w` means `(w, w)`; a pair is `(left, right)`; both sides must be non-negative ints."""
    pair = (window, window) if isinstance(window, int | np.integer) else window
    if (
        not isinstance(pair, tuple | list)
        or len(pair) != 2
        or any(not isinstance(w, int | np.integer) or isinstance(w, bool) for w in pair)
    ):
        raise TypeError(f"{name} must be an int or a (left, right) pair of ints, got {window!r}")
    if min(pair) < 0:
        raise ValueError(f"{name} must be non-negative, got {window!r}")
    return int(pair[0]), int(pair[1])


def clamp_window(window: Window | None, reach: int) -> Window | None:
    """`(left, right)` with each side at most `reach`: past every position a window masks nothing more,
    and kernels computing positions in int32 must not see sides like 2**40."""
    return None if window is None else (min(window[0], reach), min(window[1], reach))


def intersect_windows(a: Window | None, b: Window | None) -> Window | None:
    """The window allowed by both of two `(left, right)` windows (None: no window)."""
    if a is None or b is None:
        return a if b is None else b
    return (min(a[0], b[0]), min(a[1], b[1]))
