"""Grouped matmul in plain JAX: a loop over the span schedule, one `[block_m, K] x [K, N]` matmul per span.

The loop visits only the spans of owned rows (`_common.grouped_matmul.row_spans`: `block_m` rows of one
group, from the group's first row on), so the work is that of one dense matmul plus at most one partial
span per group, and memory stays at the output's size. The backward products are the same loop: `dlhs`
with the other transpose, `drhs` accumulating `lhs_spanᵀ · dout_span` into its group's `[K, N]` block.

With `cfg.bypass_xla_tiling` the product is instead one `jax.lax.ragged_dot_general` (`ragged`), XLA's own
grouped matmul: native on TPU and GPU; on CPU, XLA expands it into one masked matmul per group.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from ejkernel.kernels._common.grouped_matmul import implementation, local_group_bounds, row_spans, tile_params
from ejkernel.kernels._common.grouped_matmul_quantized import PackedGroupWeights, group_weights

DEFAULT_BLOCK_M = 512
MIN_BLOCK_M = 8


def _block_m(m: int, params) -> int:
    block = params.block_q if params is not None and params.block_q is not None else DEFAULT_BLOCK_M
    return max(MIN_BLOCK_M, min(block, pl.next_power_of_2(m)))


def _owned_spans(spans):
    """`[first, last)`: the spans that compute a group (contiguous in the schedule; the others write
    zeros, which the loops start from)."""
    computes = spans.group >= 0
    first = jnp.argmax(computes).astype(jnp.int32)
    return first, first + jnp.sum(computes, dtype=jnp.int32)


def _padded(x, block_m: int):
    """`x [M, ...]` with rows up to `block_m` (spans start within M; only a shorter M needs rows added)."""
    extra = block_m - x.shape[0]
    return jnp.pad(x, [(0, extra)] + [(0, 0)] * (x.ndim - 1)) if extra > 0 else x


def _span_rows(spans, w, block_m: int):
    """First row of span `w` and the mask `[block_m]` of the rows it writes."""
    start = spans.start[w]
    rows = start + jnp.arange(block_m, dtype=jnp.int32)
    return start, (rows >= spans.write_lo[w]) & (rows < spans.write_hi[w])


def gmm(lhs, rhs, group_sizes, group_offset, *, transpose_rhs, out_dtype, tiling):
    """`out [M, N]`: each owned row times its group's rhs (a packed group decoded where the span needs it);
    zeros elsewhere. `tiling = (block_m, precision)`."""
    block_m, precision = tiling
    m, num_local = lhs.shape[0], rhs.shape[0]
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    spans = row_spans(group_sizes, group_offset, num_local, m, block_m)
    x = _padded(lhs, block_m)
    contract = 1 if transpose_rhs else 0

    def step(w, out):
        start, keep = _span_rows(spans, w, block_m)
        rows = lax.dynamic_slice_in_dim(x, start, block_m)
        weights = group_weights(rhs, spans.group[w], rows.dtype)
        y = lax.dot_general(
            rows, weights, (((1,), (contract,)), ((), ())), precision=precision, preferred_element_type=jnp.float32
        )
        current = lax.dynamic_slice_in_dim(out, start, block_m)
        return lax.dynamic_update_slice_in_dim(out, jnp.where(keep[:, None], y.astype(out.dtype), current), start, 0)

    first, last = _owned_spans(spans)
    out = lax.fori_loop(first, last, step, jnp.zeros((x.shape[0], n), out_dtype))
    return out[:m]


def tgmm(x, y, group_sizes, group_offset, *, num_local: int, out_dtype, tiling):
    """`[L, Kx, Ny]`: per local group l, `x_lᵀ · y_l` over its rows (zeros for an empty group)."""
    block_m, precision = tiling
    m = x.shape[0]
    spans = row_spans(group_sizes, group_offset, num_local, m, block_m)
    xt, yt = _padded(x, block_m), _padded(y, block_m)

    def step(w, acc):
        start, keep = _span_rows(spans, w, block_m)
        x_rows = jnp.where(keep[:, None], lax.dynamic_slice_in_dim(xt, start, block_m), 0)
        y_rows = lax.dynamic_slice_in_dim(yt, start, block_m)
        product = lax.dot_general(
            x_rows, y_rows, (((0,), (0,)), ((), ())), precision=precision, preferred_element_type=jnp.float32
        )
        group = spans.group[w]
        return lax.dynamic_update_index_in_dim(acc, acc[group] + product, group, 0)

    first, last = _owned_spans(spans)
    acc = lax.fori_loop(first, last, step, jnp.zeros((num_local, x.shape[1], y.shape[1]), jnp.float32))
    return acc.astype(out_dtype)


def ragged(lhs, rhs, group_sizes, group_offset, *, transpose_rhs, out_dtype, precision):
    """`out [M, N]` by XLA's ragged dot, no tiling and no padding (zeros on unowned rows; JAX differentiates it).

    The ragged dot takes the groups from row 0: a shard's groups (`group_offset` not None) start where the
    groups before them end, so lhs is rolled to bring that row to 0, and the product back.
    """
    m, num_local = lhs.shape[0], rhs.shape[0]
    contract = 2 if transpose_rhs else 1
    numbers = lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=(((1,), (contract,)), ((), ())), lhs_ragged_dimensions=(0,), rhs_group_dimensions=(0,)
    )
    product = lambda x, sizes: lax.ragged_dot_general(
        x, rhs, sizes, numbers, precision=precision, preferred_element_type=out_dtype
    )
    if group_offset is None:
        return product(lhs, group_sizes)
    starts, ends = local_group_bounds(group_sizes, group_offset, num_local, m)
    return jnp.roll(product(jnp.roll(lhs, -starts[0], axis=0), ends - starts), starts[0], axis=0)


def _tilings(dims, lhs, *, cfg, interpret, precision, transpose_rhs, quantized):
    del quantized  # (rows per tile alone: the same for decoded weights)
    fwd, bwd = tile_params(cfg)
    bwd = bwd or fwd
    return (_block_m(dims.m, fwd), precision), *[(_block_m(dims.m, bwd), precision)] * 2


grouped_matmul_xla = implementation(
    gmm,
    tgmm,
    _tilings,
    """Grouped matmul `[M, K] x [G, K, N] -> [M, N]` in plain JAX (semantics: `grouped_matmul_reference`).

    Tiles are `cfg.fwd_params.block_q` rows (or `cfg.block_m`; default 512, at most M rounded up to a power
    of two); the backward uses `cfg.bwd_params.block_q` (default the forward's). `cfg.bypass_xla_tiling`
    runs XLA's ragged dot instead (`ragged`). `precision` is every matmul's. `interpret` and `do_padding`
    concern kernels only and change nothing here. A `QuantizedArray` rhs is decoded one group at a time, in
    each span's step (with `bypass_xla_tiling`, all at once before the ragged dot); v3 scales are applied to
    the whole rhs first.
    """,
    untiled=ragged,
    decodes=lambda weights: isinstance(weights, PackedGroupWeights),
)
