"""Finding values among sorted bounds inside kernels' plain-JAX schedules (paged batches, grouped matmuls)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

COMPARE_ALL_PAIRS = 2**22  # up to this many (bound, value) pairs a search compares them all


def sorted_position(bounds: jax.Array, values: jax.Array) -> jax.Array:
    """`jnp.searchsorted(bounds, values, side="right")`. For few pairs (a decode batch's sequences and
    tiles, a grouped matmul's groups) one fused comparison of every value with every bound: JAX's binary
    search lowers to a while loop of small steps, a fixed cost that counts where a decode step takes a
    fraction of a millisecond (an H100's paged decode at batch 8 lost 0.2 ms to it)."""
    method = "compare_all" if bounds.size * values.size <= COMPARE_ALL_PAIRS else "scan"
    return jnp.searchsorted(bounds, values, side="right", method=method)
