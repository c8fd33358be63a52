"""Grouped matmul in plain JAX: a loop over the tile schedule, one `[block_m, K] x [K, N]` matmul per item.

The loop visits only the (tile, group) items of owned rows (`_common.grouped_matmul.work_items`), so the
work is that of one dense matmul plus at most one extra tile per group boundary, and memory stays at
the output's size. The backward products are the same loop: `dlhs` with the other transpose, `drhs`
accumulating `lhs_tileᵀ · dout_tile` into its group's `[K, N]` block.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from ejkernel.kernels._common.grouped_matmul import implementation, work_items

DEFAULT_BLOCK_M = 512
MIN_BLOCK_M = 8


def _block_m(m: int, params) -> int:
    block = params.block_q if params is not None and params.block_q is not None else DEFAULT_BLOCK_M
    return max(MIN_BLOCK_M, min(block, pl.next_power_of_2(m)))


def _owned_items(items):
    """`[first, last)`: the items that compute a group (contiguous in the schedule)."""
    computes = items.group >= 0
    first = jnp.argmax(computes).astype(jnp.int32)
    return first, first + jnp.sum(computes, dtype=jnp.int32)


def _tiles(x, block_m: int):
    """`x [M, ...]` padded to whole tiles."""
    extra = -x.shape[0] % block_m
    return jnp.pad(x, [(0, extra)] + [(0, 0)] * (x.ndim - 1)) if extra else x


def _item_rows(items, w, block_m: int):
    """Tile start of item `w` and the mask `[block_m]` of the rows it keeps."""
    start = items.tile[w] * block_m
    rows = start + jnp.arange(block_m, dtype=jnp.int32)
    return start, (rows >= items.row_lo[w]) & (rows < items.row_hi[w])


def gmm(lhs, rhs, group_sizes, group_offset, *, transpose_rhs, out_dtype, tiling):
    """`out [M, N]`: each owned row times its group's rhs; zeros elsewhere. `tiling = (block_m, precision)`."""
    block_m, precision = tiling
    m, num_local = lhs.shape[0], rhs.shape[0]
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    items = work_items(group_sizes, group_offset, num_local, m, block_m)
    x = _tiles(lhs, block_m)
    contract = 1 if transpose_rhs else 0

    def step(w, out):
        start, keep = _item_rows(items, w, block_m)
        tile = lax.dynamic_slice_in_dim(x, start, block_m)
        weights = lax.dynamic_index_in_dim(rhs, items.group[w], keepdims=False)
        y = lax.dot_general(
            tile, weights, (((1,), (contract,)), ((), ())), precision=precision, preferred_element_type=jnp.float32
        )
        current = lax.dynamic_slice_in_dim(out, start, block_m)
        return lax.dynamic_update_slice_in_dim(out, jnp.where(keep[:, None], y.astype(out.dtype), current), start, 0)

    first, last = _owned_items(items)
    out = lax.fori_loop(first, last, step, jnp.zeros((x.shape[0], n), out_dtype))
    return out[:m]


def tgmm(x, y, group_sizes, group_offset, *, num_local: int, out_dtype, tiling):
    """`[L, Kx, Ny]`: per local group l, `x_lᵀ · y_l` over its rows (zeros for an empty group)."""
    block_m, precision = tiling
    m = x.shape[0]
    items = work_items(group_sizes, group_offset, num_local, m, block_m)
    xt, yt = _tiles(x, block_m), _tiles(y, block_m)

    def step(w, acc):
        start, keep = _item_rows(items, w, block_m)
        x_tile = jnp.where(keep[:, None], lax.dynamic_slice_in_dim(xt, start, block_m), 0)
        y_tile = lax.dynamic_slice_in_dim(yt, start, block_m)
        product = lax.dot_general(
            x_tile, y_tile, (((0,), (0,)), ((), ())), precision=precision, preferred_element_type=jnp.float32
        )
        group = items.group[w]
        return lax.dynamic_update_index_in_dim(acc, acc[group] + product, group, 0)

    first, last = _owned_items(items)
    acc = lax.fori_loop(first, last, step, jnp.zeros((num_local, x.shape[1], y.shape[1]), jnp.float32))
    return acc.astype(out_dtype)


def _tilings(dims, lhs, *, cfg, interpret, precision, transpose_rhs):
    fwd = getattr(cfg, "fwd_params", None)
    bwd = getattr(cfg, "bwd_params", None) or fwd
    return (_block_m(dims.m, fwd), precision), *[(_block_m(dims.m, bwd), precision)] * 2


grouped_matmul_xla = implementation(
    gmm,
    tgmm,
    _tilings,
    """Grouped matmul `[M, K] x [G, K, N] -> [M, N]` in plain JAX (semantics: `grouped_matmul_reference`).

    Tiles are `cfg.fwd_params.block_q` rows (default 512, at most M rounded up to a power of two); the
    backward uses `cfg.bwd_params.block_q` (default the forward's). `precision` is every matmul's.
    `interpret` and `do_padding` concern kernels only and change nothing here.
    """,
)
