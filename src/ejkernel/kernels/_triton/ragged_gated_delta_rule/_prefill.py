"""The chunked delta rule of packed requests (prefill and mixed batches) in Pallas-Triton kernels, forward only.

The requests are laid out as `ChunkLayout.packed` lays packed sequences out (each starting on a chunk boundary,
zeros between them), described per chunk by `chunk_table` (per-chunk arithmetic, no while loop). No kernel copies
the tokens into that layout: each reads a chunk's rows of q, k and v where they sit in the flat `[T, H, D]` inputs
(masked loads, `_token_rows`), q and k L2-normalised as loaded, q scaled. Two kernels, after XLA gathers each
chunk's betas and sums its log decays (`chunk_scalars`, `[NC·C, H]` float32: small):

1. The WY transform, local to each chunk (`_wy_kernel` on `_delta.wy_blocks`), returns u and w chunk-major in
   v's dtype.
2. `_pass_kernel`, the one sequential pass, walks the chunks of one request per program (grid: request x head
   x value tile, as the dense form's batch rows), reading u and w chunk-major, entering from the request's slot
   of the pool and leaving its final state; it stores each chunk's outputs straight at its tokens (masked
   stores) in the query's dtype, so no chunk's entry state or values go to memory. Its addresses and masks are
   affine in the step, from the request's `RequestSpans`, as the dense form's are.

Matmul operands are in the inputs' dtype (float32 in full precision for float32 inputs), as in
`gated_delta_rule`'s Triton path; q and k are rounded to v's dtype after their norm, as the dense path does.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from ejkernel.kernels._common.linear_attention.ragged import Requests, packed_bounds
from ejkernel.kernels._common.search import sorted_position
from ejkernel.kernels._common.vma import out_struct
from ejkernel.kernels._triton.linear_attention._delta import (
    WY_WARPS,
    as_loaded,
    chunk_exit,
    chunk_values,
    forward_pass_defaults,
    pass_outputs,
    wy_blocks,
)
from ejkernel.kernels._triton.linear_attention._gla_common import (
    F32,
    SUB,
    TritonGlaTiling,
    call_pallas,
    iota,
    tile_slice,
)


def _token_rows(ref, start, keep, head):
    """`[len(keep), D]` float32: rows `start + r` of `ref [T, H, D]` at `head` where `keep[r]`, else zeros."""
    size, width = keep.shape[0], ref.shape[-1]
    mask = jnp.broadcast_to(keep[:, None], (size, width))
    return plgpu.load(ref.at[pl.ds(start, size), head, pl.ds(0, width)], mask=mask, other=0.0).astype(F32)


def _live(lo_ref, hi_ref, c, first: int, size: int):
    """`[size]` bool: which rows `first + r` of chunk `c` are a live request's."""
    row = iota((size,), 0) + first
    return (row >= lo_ref[c]) & (row < hi_ref[c])


def _normalised_rows(ref, start, keep, head, l2norm: bool, dtype, scale: float = 1.0):
    """`_token_rows` as the products take them (`as_loaded`)."""
    return as_loaded(_token_rows(ref, start, keep, head), l2norm, dtype, scale)


class ChunkTable(NamedTuple):
    """Where the chunks of the packed layout sit among the tokens, `[NC]` int32 each: chunk `c` starts at token
    `start[c]` (0: a chunk of no request), and its rows `lo[c] <= r < hi[c]` are a live request's (the others count
    as zero tokens); `first` and `count` `[N]`: each request's first chunk and number of chunks."""

    start: jax.Array
    lo: jax.Array
    hi: jax.Array
    first: jax.Array
    count: jax.Array


def chunk_table(req: Requests, num_tokens: int, chunk: int) -> ChunkTable:
    """The `ChunkTable` of `ChunkLayout.packed` on the requests' bounds stretched over the tokens (the first
    from token 0, the last to the end), from per-chunk arithmetic (no array of the tokens' size, no while loop)."""
    num_requests = req.lengths.shape[0]
    num_chunks = max(1, -(-(num_tokens + num_requests * (chunk - 1)) // chunk))  # as ChunkLayout.packed
    cu = packed_bounds(req.bounds, num_tokens)
    count = (cu[1:] - cu[:-1] + chunk - 1) // chunk
    first = jnp.cumsum(count) - count
    chunks = jnp.arange(num_chunks, dtype=jnp.int32)
    owner = jnp.clip(sorted_position(first, chunks) - 1, 0, num_requests - 1)  # empty requests are never picked
    used = chunks < first[-1] + count[-1]
    start = jnp.where(used, cu[owner] + (chunks - first[owner]) * chunk, 0)
    within = lambda bound: jnp.clip(bound - start, 0, chunk)
    hi = jnp.where(used & req.live[owner], within(req.bounds[owner + 1]), 0)
    return ChunkTable(start, within(req.bounds[owner]), hi, first, count)


def chunk_scalars(table: ChunkTable, chunk: int, beta, decay):
    """`(beta, g)` `[1, NC·C, H]` float32 in the chunk layout of `table`: row `r` of chunk `c` is token `start[c] +
    r`'s where `lo[c] <= r < hi[c]`, else zero; g the log decays summed within the chunk (the cumulative gates;
    zeros without decay)."""
    num_chunks, heads = table.start.shape[0], beta.shape[1]
    row = jnp.arange(chunk, dtype=jnp.int32)
    keep = ((row >= table.lo[:, None]) & (row < table.hi[:, None]))[..., None]
    tokens = jnp.clip(table.start[:, None] + row, 0, beta.shape[0] - 1)
    take = lambda x: jnp.where(keep, x[tokens].astype(F32), 0.0)
    gates = jnp.zeros((num_chunks, chunk, heads), F32) if decay is None else jnp.cumsum(take(decay), axis=1)
    return tuple(x.reshape(1, num_chunks * chunk, heads) for x in (take(beta), gates))


def _wy_kernel(start_ref, lo_ref, hi_ref, k_ref, v_ref, beta_ref, g_ref, u_ref, w_ref, *, l2norm: bool):
    """`wy_blocks` of chunk `c` and head `h`: k and v read at the chunk's tokens, k normalised if asked, both in
    v's dtype; beta and the cumulative gates in the chunk layout."""
    c, head = pl.program_id(0), pl.program_id(1)
    firsts = range(0, u_ref.shape[0], SUB)
    rows = [pl.ds(first, SUB) for first in firsts]
    keeps = [_live(lo_ref, hi_ref, c, first, SUB) for first in firsts]
    at = [start_ref[c] + first for first in firsts]
    dtype = v_ref.dtype
    keys = [_normalised_rows(k_ref, a, keep, head, l2norm, dtype) for a, keep in zip(at, keeps, strict=True)]
    values = [_token_rows(v_ref, a, keep, head).astype(dtype) for a, keep in zip(at, keeps, strict=True)]
    wy_blocks(keys, values, [beta_ref[r] for r in rows], [g_ref[r] for r in rows], u_ref, w_ref)


def _wy(t: TritonGlaTiling, chunk: int, l2norm: bool, table: ChunkTable, key, value, beta, g):
    """`(u, w)` `[NC, 1, H, C, Dv | Dk]` in v's dtype, chunk-major, of the chunks of `table` (`chunk_scalars`' beta
    and g)."""
    num_chunks, heads, dk, dv = table.start.shape[0], key.shape[1], key.shape[-1], value.shape[-1]
    token = lambda: pl.BlockSpec((None, chunk, None), lambda c, h: (0, c, h))
    major = lambda width: pl.BlockSpec((None, None, None, chunk, width), lambda c, h: (c, 0, h, 0, 0))
    args = (table.start, table.lo, table.hi, key, value, beta, g)
    shapes = [out_struct((num_chunks, 1, heads, chunk, width), value.dtype, *args) for width in (dv, dk)]
    in_specs = [pl.BlockSpec()] * 5 + [token(), token()]
    grid = (num_chunks, heads)
    name = "ejkernel_ragged_delta_wy"
    return call_pallas(_wy_kernel, t, WY_WARPS, grid, in_specs, [major(dv), major(dk)], shapes, name, l2norm=l2norm)(
        *args
    )


def _pass_kernel(*refs, **s):
    """Request `n`'s chunks in order from its slot's state `h`: `U = u − w h`; the chunk's outputs `(q ⊙ e^g) h +
    (q kᵀ ⊙ D) U` (q scaled) stored at its tokens `base + i·C + r` below the request's stretched end; `h ← e^{g_C}
    h + (k ⊙ e^{g_C − g})ᵀ U`. Its final state is h after its last chunk (the slot's state for an empty request). u
    and w come chunk-major, `[NC, 1, H, C, D]`; q and k from the tokens, rows of the request's live span
    `[lo, hi)`. Every address is affine in the step, from four scalars read once (`RequestSpans`), so none waits on a
    load inside the sequential loop. h and U enter the outputs' products rounded to the state dtype and w's, as a
    stored copy would be; neither goes to memory."""
    first_ref, count_ref, slot_ref, base_ref, end_ref, lo_ref, hi_ref, q_ref, k_ref, w_ref, u_ref = refs[:11]
    g_ref, g_row_ref, pool_ref, o_ref, final_ref = refs[11:]
    chunk, mm, bv, l2norm = s["chunk"], s["mm"], s["block_v"], s["l2norm"]
    n, head, tile = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    cols = tile_slice(tile, bv)
    first, base, end, lo, hi = first_ref[n], base_ref[n], end_ref[n], lo_ref[n], hi_ref[n]
    one = pl.ds(0, 1)

    def step(i, h):
        c = first + i
        at = pl.multiple_of(c * chunk, chunk)  # the chunk's first row in the chunk layout
        rows = pl.ds(at, chunk)
        g, g_last = g_ref[0, rows, head, one], g_ref[0, at + chunk - 1, head, one]
        values = chunk_values(u_ref[c, 0, head, :, cols], w_ref[c, 0, head, :, :], h, mm)
        start = base + i * chunk
        token = start + iota((chunk,), 0)
        keep = (token >= lo) & (token < hi)
        keys = _normalised_rows(k_ref, start, keep, head, l2norm, w_ref.dtype)
        q = _normalised_rows(q_ref, start, keep, head, l2norm, w_ref.dtype, s["scale"])
        out = pass_outputs(
            q,
            keys,
            g,
            g_row_ref[0, head, rows],
            values,
            h,
            mm=mm,
            state_dtype=s["state_dtype"],
            values_dtype=w_ref.dtype,
        )
        stored = jnp.broadcast_to((token < end)[:, None], out.shape)
        plgpu.store(o_ref.at[pl.ds(start, chunk), head, cols], out.astype(o_ref.dtype), mask=stored)
        return chunk_exit(keys, g, g_last, values, h, mm)

    init = pool_ref[slot_ref[n], head, :, cols].astype(F32)
    final_ref[n, head, :, cols] = lax.fori_loop(0, count_ref[n], step, init)


class RequestSpans(NamedTuple):
    """Each request's tokens in the packed layout, `[N]` int32 each: its chunks cover tokens `base` to `end` (the
    requests' bounds stretched over the tokens, `packed_bounds`), of which `[lo, hi)` are live (empty for a request
    that is not: its tokens count as zeros)."""

    base: jax.Array
    end: jax.Array
    lo: jax.Array
    hi: jax.Array


def request_spans(req: Requests, num_tokens: int) -> RequestSpans:
    """The `RequestSpans` of `req`."""
    cu = packed_bounds(req.bounds, num_tokens)
    lo = req.bounds[:-1]
    return RequestSpans(cu[:-1], cu[1:], lo, jnp.where(req.live, req.bounds[1:], lo))


def _pass(t: TritonGlaTiling, chunk: int, l2norm: bool, table: ChunkTable, spans: RequestSpans, slots, inputs):
    """`(out [T, H, Dv] in the query's dtype, final states [N, H, Dk, Dv] float32)` of `_pass_kernel`, one program
    per request, head and tile of value columns (`forward_pass_defaults`). The chunks cover the tokens, so every
    token's output is stored. `inputs`: `(query, key, w, u, g, pool)`, u and w chunk-major, g `[1, NC·C, H]`."""
    query, key, w, u, g, pool = inputs
    heads, dk, dv = key.shape[1], key.shape[-1], u.shape[-1]
    num_requests = table.first.shape[0]
    bv, warps, stages = forward_pass_defaults(dk, dv, num_requests * heads)
    bv = min(bv, dv)
    args = (table.first, table.count, slots, *spans, query, key, w, u, g[..., None], jnp.swapaxes(g, 1, 2), pool)
    return call_pallas(
        _pass_kernel,
        t,
        warps,
        (num_requests, heads, dv // bv),
        None,
        None,
        [
            out_struct((*query.shape[:-1], dv), query.dtype, *args),
            out_struct((num_requests, heads, dk, dv), F32, *args),
        ],
        "ejkernel_ragged_delta_pass",
        stages=stages,
        chunk=chunk,
        mm=t.mm(w.dtype),
        block_v=bv,
        l2norm=l2norm,
        scale=dk**-0.5,
        state_dtype=t.state_dtype(w.dtype),
    )(*args)


def packed_delta(t: TritonGlaTiling, chunk: int, l2norm: bool, inputs, req, pool):
    """`(out [T, H, Dv] in the query's dtype, final states [N, H, Dk, Dv] float32)` of the requests `req`
    (`Requests`), each entering from its slot of `pool` (clamped into the pool: a dropped request's state is
    never written). `inputs`: the op's `(query, key, value, beta, decay)` (decay may be None); tokens of no live
    request count as zeros (they output zeros and leave the states alone)."""
    query, key, value, beta, decay = inputs
    table = chunk_table(req, query.shape[0], chunk)
    beta, g = chunk_scalars(table, chunk, beta, decay)
    u, w = _wy(t, chunk, l2norm, table, key, value, beta, g)
    slots = jnp.clip(req.slots, 0, pool.shape[0] - 1)
    spans = request_spans(req, query.shape[0])
    return _pass(t, chunk, l2norm, table, spans, slots, (query, key, w, u, g, pool))
