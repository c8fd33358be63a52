"""The chunked delta rule of packed requests (prefill and mixed batches) in Pallas-Triton kernels, forward only.

The requests are laid out as `ChunkLayout.packed` lays packed sequences out (each starting on a chunk boundary,
zeros between them), one batch row of `NC·C` tokens, described per chunk by `chunk_table` (per-chunk arithmetic,
no while loop). Four steps:

1. `_pack_kernel` builds that layout in one pass, reading each chunk's rows where they sit in the flat
   `[T, H, D]` inputs (masked loads: no gather, no full-size intermediate): q and k L2-normalised, q scaled, the
   log decays summed within chunks (the cumulative gates), and v chunk-major, `[NC, 1, H, C, D]`.
2. The WY transform, local to each chunk, in one kernel (`wy_in_kernel`), returns u and w chunk-major in
   v's and k's dtype.
3. `_states_kernel`, the one sequential pass, walks the chunks of one request per program (grid: request x head
   x value tile, as the dense form's batch rows), reading u and w chunk-major, entering from the request's slot
   of the pool and leaving its final state.
4. `_outputs_kernel` stores each chunk's outputs straight at its tokens (masked stores) in the query's dtype.

Matmul operands are in the inputs' dtype (float32 in full precision for float32 inputs), as in
`gated_delta_rule`'s Triton path.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from ejkernel.kernels._common.linear_attention.inputs import L2_EPS
from ejkernel.kernels._common.linear_attention.ragged import Requests, packed_bounds
from ejkernel.kernels._common.search import sorted_position
from ejkernel.kernels._common.vma import out_struct
from ejkernel.kernels._triton._helpers import dot
from ejkernel.kernels._triton.linear_attention._delta import forward_pass_defaults, wy_in_kernel
from ejkernel.kernels._triton.linear_attention._gla_common import (
    F32,
    TritonGlaTiling,
    call_pallas,
    iota,
    pair_decays,
    tile_slice,
)

PACK_WARPS = 4


def _states_kernel(
    first_ref, count_ref, slot_ref, k_ref, w_ref, u_ref, g_ref, pool_ref, e_ref, values_ref, final_ref, **s
):
    """Request `n`'s chunks in order from its slot's state `h`: store h (the chunk's entry state); `U = u − w h`
    (stored); `h ← e^{g_C} h + (k ⊙ e^{g_C − g})ᵀ U`. Its final state is h after its last chunk (the slot's
    state for an empty request). u and w come chunk-major, `[NC, 1, H, C, D]`."""
    chunk, mm, bv = s["chunk"], s["mm"], s["block_v"]
    n, head, tile = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    cols = tile_slice(tile, bv)
    first = first_ref[n]
    one = pl.ds(0, 1)

    def step(i, h):
        c = first + i
        e_ref[0, c, head, :, cols] = h.astype(e_ref.dtype)
        start = pl.multiple_of(c * chunk, chunk)
        rows = pl.ds(start, chunk)
        g, g_last = g_ref[0, rows, head, one], g_ref[0, start + chunk - 1, head, one]
        values = u_ref[c, 0, head, :, cols].astype(F32) - dot(w_ref[c, 0, head, :, :].astype(mm), h.astype(mm))
        values_ref[0, rows, head, cols] = values.astype(values_ref.dtype)
        k = (k_ref[0, rows, head, :].astype(F32) * jnp.exp(g_last[None, :] - g)).astype(mm)
        return jnp.exp(g_last) * h + dot(k, values.astype(mm), trans_a=True)

    init = pool_ref[slot_ref[n], head, :, cols].astype(F32)
    final_ref[n, head, :, cols] = lax.fori_loop(0, count_ref[n], step, init)


def _states(t: TritonGlaTiling, chunk: int, first, count, slots, k, w, u, g, pool):
    """`(entry states [1, NC, H, Dk, Dv], values U [1, NC·C, H, Dv] (w's dtype), final states [N, H, Dk, Dv]
    float32)`; chunks of no request are left unwritten (their outputs are never read). u and w chunk-major."""
    _, seq, heads, dk = k.shape
    dv = u.shape[-1]
    bv, warps, stages = forward_pass_defaults(dk, dv, first.shape[0] * heads)
    bv = min(bv, dv)
    args = (first, count, slots, k, w, u, g, pool)
    return call_pallas(
        _states_kernel,
        t,
        warps,
        (first.shape[0], heads, dv // bv),
        None,
        None,
        [
            out_struct((1, seq // chunk, heads, dk, dv), t.state_dtype(k.dtype), *args),
            out_struct((1, seq, heads, dv), w.dtype, *args),
            out_struct((first.shape[0], heads, dk, dv), F32, *args),
        ],
        "ejkernel_ragged_delta_states",
        stages=stages,
        chunk=chunk,
        mm=t.mm(k.dtype),
        block_v=bv,
    )(*args)


class ChunkTable(NamedTuple):
    """Where the chunks of the packed layout sit among the tokens, `[NC]` int32 each: chunk `c` holds tokens
    `start[c] + r` for `r < rows[c]` (0: a chunk of no request), of which rows `lo[c] <= r < hi[c]` are a live
    request's (the others count as zero tokens); `first` and `count` `[N]`: each request's first chunk and
    number of chunks."""

    start: jax.Array
    rows: jax.Array
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
    rows = jnp.where(used, within(cu[owner + 1]), 0)
    hi = jnp.where(used & req.live[owner], within(req.bounds[owner + 1]), 0)
    return ChunkTable(start, rows, within(req.bounds[owner]), hi, first, count)


def _pack_kernel(start_ref, lo_ref, hi_ref, q_ref, k_ref, v_ref, beta_ref, *refs, **s):
    """Chunk `c` of head `h` in the chunk layout: row `r` is token `start[c] + r` where `lo[c] <= r < hi[c]`,
    else zero; q and k normalised if asked, q scaled; the log decays summed within the chunk (the cumulative
    gates); v chunk-major."""
    decay_ref, outs = (refs[0], refs[1:]) if s["has_decay"] else (None, refs)
    q_out, k_out, v_out, beta_out, gates_out = outs
    chunk = s["chunk"]
    c, head = pl.program_id(0), pl.program_id(1)
    tokens = pl.ds(start_ref[c], chunk)
    row = iota((chunk,), 0)
    keep = (row >= lo_ref[c]) & (row < hi_ref[c])

    def rows(ref, width=None):
        if width is None:
            return plgpu.load(ref.at[tokens, head], mask=keep, other=0.0).astype(F32)
        mask = jnp.broadcast_to(keep[:, None], (chunk, width))
        return plgpu.load(ref.at[tokens, head, pl.ds(0, width)], mask=mask, other=0.0).astype(F32)

    def normalised(x):
        return x * lax.rsqrt(jnp.sum(x * x, axis=1, keepdims=True) + L2_EPS) if s["l2norm"] else x

    dk, dv = q_out.shape[-1], v_out.shape[-1]
    q_out[...] = (normalised(rows(q_ref, dk)) * s["scale"]).astype(q_out.dtype)
    k_out[...] = normalised(rows(k_ref, dk)).astype(k_out.dtype)
    v_out[...] = rows(v_ref, dv).astype(v_out.dtype)
    beta_out[...] = rows(beta_ref)
    gates_out[...] = jnp.zeros((chunk,), F32) if decay_ref is None else jnp.cumsum(rows(decay_ref))


def _chunk_specs(chunk: int):
    """`(token(*width), major(width))`: the BlockSpecs of a (chunk, head) program's rows of the padded token layout
    `[1, NC·C, H, *width]` and of the chunk-major `[NC, 1, H, C, width]` one."""
    token = lambda *width: pl.BlockSpec((None, chunk, None, *width), lambda c, h: (0, c, h) + (0,) * len(width))
    major = lambda width: pl.BlockSpec((None, None, None, chunk, width), lambda c, h: (c, 0, h, 0, 0))
    return token, major


def pack_chunks(t: TritonGlaTiling, chunk: int, l2norm: bool, inputs, table: ChunkTable):
    """`(q, k [1, NC·C, H, Dk], v [NC, 1, H, C, Dv], beta, g [1, NC·C, H] float32)`: the tokens in the chunk
    layout of `table`, q, k and v in v's dtype, g the log decays summed within chunks; v chunk-major."""
    query, key, value, beta, decay = inputs
    heads, dk, dv = query.shape[1], query.shape[-1], value.shape[-1]
    num_chunks = table.start.shape[0]
    tokens = [query, key, value, beta] + ([] if decay is None else [decay])
    args = (table.start, table.lo, table.hi, *tokens)
    padded, mm = num_chunks * chunk, value.dtype
    out = lambda shape, dtype: out_struct(shape, dtype, *args)
    token, major = _chunk_specs(chunk)
    specs = [token(dk), token(dk), major(dv), token(), token()]
    shapes = [out((1, padded, heads, dk), mm)] * 2 + [out((num_chunks, 1, heads, chunk, dv), mm)]
    shapes += [out((1, padded, heads), F32)] * 2
    return call_pallas(
        _pack_kernel,
        t,
        PACK_WARPS,
        (num_chunks, heads),
        [pl.BlockSpec()] * len(args),
        specs,
        shapes,
        "ejkernel_ragged_delta_pack",
        chunk=chunk,
        l2norm=l2norm,
        scale=dk**-0.5,
        has_decay=decay is not None,
    )(*args)


def _outputs_kernel(start_ref, rows_ref, q_ref, g_ref, k_ref, g_row_ref, v_ref, e_ref, o_ref, *, chunk, mm, block_v):
    """Chunk `c`'s outputs `(q ⊙ e^g) h + (q kᵀ ⊙ D) U` (q scaled already), stored at its tokens `start[c] + r`,
    `r < rows[c]`; a chunk of no tokens does nothing."""
    c, head, tile = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    rows = rows_ref[c]

    @pl.when(rows > 0)
    def _():
        g, q = g_ref[...], q_ref[...]
        scores = dot(q.astype(mm), k_ref[...].astype(mm), trans_b=True) * pair_decays(g, g_row_ref[...][None, :])
        decayed = (q.astype(F32) * jnp.exp(g)).astype(mm)
        out = dot(decayed, e_ref[...].astype(mm)) + dot(scores.astype(mm), v_ref[...].astype(mm))
        keep = jnp.broadcast_to(iota((chunk, 1), 0) < rows, out.shape)
        at = o_ref.at[pl.ds(start_ref[c], chunk), head, tile_slice(tile, block_v)]
        plgpu.store(at, out.astype(o_ref.dtype), mask=keep)


def _outputs(t: TritonGlaTiling, chunk: int, num_tokens: int, dtype, start, rows, q, k, values, g, e):
    """`[T, H, Dv]` in `dtype`: every token's output, stored by the chunk holding it (the chunks cover the tokens)."""
    _, _, heads, dk = q.shape
    dv, bv = values.shape[-1], t.block_v
    block = lambda width: pl.BlockSpec((None, chunk, None, width), lambda c, h, j: (0, c, h, 0))
    args = (start, rows, q, g, k, jnp.swapaxes(g[..., 0], 1, 2), values, e)
    return call_pallas(
        _outputs_kernel,
        t,
        t.output_warps,
        (start.shape[0], heads, dv // bv),
        [
            pl.BlockSpec(),
            pl.BlockSpec(),
            block(dk),
            block(1),
            block(dk),
            pl.BlockSpec((None, None, chunk), lambda c, h, j: (0, h, c)),
            pl.BlockSpec((None, chunk, None, bv), lambda c, h, j: (0, c, h, j)),
            pl.BlockSpec((None, None, None, dk, bv), lambda c, h, j: (0, c, h, 0, j)),
        ],
        pl.BlockSpec(),
        out_struct((num_tokens, heads, dv), dtype, *args),
        "ejkernel_ragged_delta_outputs",
        chunk=chunk,
        mm=t.mm(q.dtype),
        block_v=bv,
    )(*args)


def _wy(t: TritonGlaTiling, chunk: int, k, v, beta, g):
    """`(u, w)` `[NC, 1, H, C, Dv | Dk]` in v's and k's dtype, chunk-major, of the packed chunks (`pack_chunks`' k,
    v, beta, g)."""
    num_chunks, heads = v.shape[0], v.shape[2]
    token, major = _chunk_specs(chunk)
    dk, dv = k.shape[-1], v.shape[-1]
    specs = [token(dk), major(dv), token(), token()], [major(dv), major(dk)]
    shapes = (v.shape, (*v.shape[:-1], dk))
    return wy_in_kernel(t, chunk, (num_chunks, heads), specs, shapes, k, v, beta, g, cumulative=True)


def packed_delta(t: TritonGlaTiling, chunk: int, l2norm: bool, inputs, req, pool):
    """`(out [T, H, Dv] in the query's dtype, final states [N, H, Dk, Dv] float32)` of the requests `req`
    (`Requests`), each entering from its slot of `pool` (clamped into the pool: a dropped request's state is
    never written). `inputs`: the op's `(query, key, value, beta, decay)` (decay may be None); tokens of no live
    request count as zeros (they output zeros and leave the states alone)."""
    query = inputs[0]
    num_tokens = query.shape[0]
    table = chunk_table(req, num_tokens, chunk)
    q, k, v, beta, g = pack_chunks(t, chunk, l2norm, inputs, table)
    u, w = _wy(t, chunk, k, v, beta, g)
    slots = jnp.clip(req.slots, 0, pool.shape[0] - 1)
    g = g[..., None]
    e, values, final = _states(t, chunk, table.first, table.count, slots, k, w, u, g, pool)
    return _outputs(t, chunk, num_tokens, query.dtype, table.start, table.rows, q, k, values, g, e), final
