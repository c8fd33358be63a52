"""Stores that several Mosaic GPU kernels share: TMA stores of a tile's rows at any row of global memory.

A TMA box cannot be masked and a tiled (swizzled) shared-memory tile's boxes start at multiples of 8 rows, so a
kernel that owns only some rows of its tile, from any row, stores them from an untiled shared-memory tile in one
box per binary digit of their count (`store_rows`): the grouped matmul's spans, the paged prefill tiles.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu


def store_rows(out_tile, out_dst, row0, lo, hi):
    """TMA stores of the output rows `[lo, hi)` among `out_tile`'s (an untiled shared-memory tile whose row r is
    output row `row0 + r`; `out_dst(row, rows)` its destination in HBM): one box per binary digit of their count
    (`rows`, `rows / 2`, ..., 1 rows), so that no other row is written."""
    rows = out_tile.shape[0]
    first = jnp.clip(lo - row0, 0, rows)
    count = jnp.clip(hi - row0, 0, rows) - first
    size = rows
    while size:

        @pl.when((count & size) != 0)
        def _(first=first, size=size):
            plgpu.copy_smem_to_gmem(out_tile.at[pl.ds(first, size)], out_dst(row0 + first, size))

        first = first + (count & size)
        size //= 2
