"""Session 38's trial (call 1; not landed: 0.4165 ms against the two kernels' 0.3283): the decode step of the ragged
gated delta rule in one Pallas-Triton kernel, on the state pool in place.

One program per (request, head, tile of `block_v` value columns): it reads its request's token (q, k, v, beta,
decay; q and k L2-normalised in the kernel), loads the `[Dk, block_v]` float32 tile of the request's slot
straight from the pool, runs one delta-rule step and writes the tile back into the same slot. The pool is
aliased to the kernel's output (`input_output_aliases`), so under `jit` with the pool donated nothing is copied.

Which programs work is data: a request `WRITES` (the first live request of its slot), `READS` (live, but an
earlier request writes its slot: output only) or is `IDLE` (empty, or its slot outside the pool: zero output, no
write). A call with request bounds decides it in XLA beforehand (`Requests`); for a decode batch (request r is
token r) each program decides it, scanning the slots before its own. A reader must see its slot's old state, which
the writer overwrites in place, so the writer serves it: after its own step, it scans the requests after its own
for readers of its slot (rare) and steps each of their tokens from the old tile it still holds, storing their
outputs. A reader's own programs do nothing. One kernel, no ordering between programs.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from ejkernel.kernels._common.vma import out_struct
from ejkernel.kernels._triton.ragged_gated_delta_rule._decode import (
    F32,
    IDLE,
    READS,
    WRITES,
    TritonRaggedDecodeTiling,
    _normalised,
)

SCAN = 1024
"""Slots compared per step of a scan over the requests."""


def _step(refs, r, head, cols, h, s):
    """Request `r`'s token on the old tile `h` `[Dk, cols]` of `head`: `h ← h·e^{decay}`, `u = β (v − hᵀk)`,
    `h ← h + k uᵀ`, `o = scale · qᵀ h`; the output stored, the new tile returned."""
    token_ref, q_ref, k_ref, v_ref, beta_ref, decay_ref, out_ref = refs
    token = token_ref[r]
    q = _normalised(q_ref[token, head, :], s["l2norm"]) * s["scale"]
    k = _normalised(k_ref[token, head, :], s["l2norm"])
    if decay_ref is not None:
        h = h * jnp.exp(decay_ref[token, head].astype(F32))
    u = beta_ref[token, head].astype(F32) * (v_ref[token, head, cols].astype(F32) - jnp.sum(h * k[:, None], 0))
    h = h + k[:, None] * u[None, :]
    out_ref[r, head, cols] = jnp.sum(q[:, None] * h, axis=0).astype(out_ref.dtype)
    return h


def _scan(slot_ref, first, last, visit, carry):
    """Folds `visit(block, rows, slots, in_range, carry)` over the requests `[first, last)` in blocks of `SCAN`
    (`block`: the rows' `pl.ds`)."""
    block = min(SCAN, pl.next_power_of_2(slot_ref.shape[0]))

    def body(i, carry):
        rows = i * block + jnp.arange(block, dtype=jnp.int32)
        in_range = (rows >= first) & (rows < last)
        at = pl.ds(i * block, block)
        return visit(at, rows, plgpu.load(slot_ref.at[at], mask=in_range, other=-1), in_range, carry)

    return lax.fori_loop(lax.div(first, block), lax.div(last + block - 1, block), body, carry)


def _mode_of(slot_ref, r, slot, num_slots: int):
    """Request r's mode in a decode batch, from the slots: `IDLE` outside the pool, else `READS` where an earlier
    request names its slot (that one is live too, and writes it), else `WRITES`."""
    seen = lambda at, rows, slots, in_range, seen: jnp.maximum(seen, jnp.max((slots == slot).astype(jnp.int32)))
    earlier = _scan(slot_ref, 0, r, seen, jnp.int32(0))
    live = ((slot >= 0) & (slot < num_slots)).astype(jnp.int32)
    return live * (WRITES - (WRITES - READS) * earlier)  # (IDLE is 0)


def _serve_readers(slot_ref, mode_ref, r, slot, serve):
    """`serve(r')` for each request r' > r that reads slot `slot` (a decode batch: every later request naming it;
    with modes given: those of mode `READS`), in order."""
    count = slot_ref.shape[0]

    def visit(at, rows, slots, in_range, carry):
        hits = in_range & (slots == slot)
        if mode_ref is not None:
            hits = hits & (plgpu.load(mode_ref.at[at], mask=in_range, other=IDLE) == READS)

        def next_reader(hits):
            reader = jnp.min(jnp.where(hits, rows, count))
            serve(reader)
            return hits & (rows != reader)

        lax.while_loop(lambda hits: jnp.max(hits.astype(jnp.int32)) > 0, next_reader, hits)
        return carry

    _scan(slot_ref, r + 1, count, visit, jnp.int32(0))


def _decode_kernel(token_ref, slot_ref, *refs, **s):
    """One program per (request, head, tile): a writer steps, stores its output and the new tile in place, then
    serves its slot's readers from the old tile; an idle request's output tile is zeros; a reader's programs do
    nothing (its writer stores its output)."""
    refs = list(refs)
    mode_ref = refs.pop(0) if s["modes_given"] else None
    q_ref, k_ref, v_ref, beta_ref = refs[:4]
    decay_ref = refs[4] if s["has_decay"] else None
    pool_ref, out_ref, new_pool_ref = refs[4 + s["has_decay"] :]  # the last aliases the pool
    r, head, tile = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    bv = s["block_v"]
    cols = pl.ds(pl.multiple_of(tile * bv, bv), bv)
    slot = slot_ref[r]
    mode = mode_ref[r] if mode_ref is not None else _mode_of(slot_ref, r, slot, pool_ref.shape[0])
    step_refs = (token_ref, q_ref, k_ref, v_ref, beta_ref, decay_ref, out_ref)

    @pl.when(mode == WRITES)
    def _():
        old = plgpu.load(pool_ref.at[slot, head, :, cols]).astype(F32)
        new = _step(step_refs, r, head, cols, old, s)
        plgpu.store(new_pool_ref.at[slot, head, :, cols], new.astype(new_pool_ref.dtype))
        _serve_readers(slot_ref, mode_ref, r, slot, lambda reader: _step(step_refs, reader, head, cols, old, s))

    @pl.when(mode == IDLE)
    def _():
        out_ref[r, head, cols] = jnp.zeros((bv,), out_ref.dtype)


def decode_step(
    tiling: TritonRaggedDecodeTiling, l2norm: bool, query, key, value, beta, decay, pool, token, slot, mode=None
):
    """`(out [N, H, Dv] in the query's dtype, the pool after the step)`: request `r` steps token `token[r]` on slot
    `slot[r]` as `mode[r]` says (`IDLE`, `READS`, `WRITES`); the pool is updated in place (aliased). `mode` None:
    a decode batch (`token[r] = r`), each request's mode decided from the slots in the kernel."""
    num_requests, heads, dv = token.shape[0], query.shape[1], value.shape[-1]
    bv = min(tiling.block_v, dv)
    tokens = [query, key, value, beta] + ([] if decay is None else [decay])
    index = [token, slot] + ([] if mode is None else [mode])
    static = dict(block_v=bv, l2norm=l2norm, scale=query.shape[-1] ** -0.5, has_decay=decay is not None)
    kernel = pl.pallas_call(
        functools.partial(_decode_kernel, modes_given=mode is not None, **static),
        grid=(num_requests, heads, dv // bv),
        out_shape=[
            out_struct((num_requests, heads, dv), query.dtype, *index, *tokens, pool),
            out_struct(pool.shape, pool.dtype, *index, *tokens, pool),
        ],
        input_output_aliases={len(index) + len(tokens): 1},
        compiler_params=plgpu.CompilerParams(num_warps=tiling.num_warps, num_stages=1),
        interpret=tiling.interpret,
        name="ejkernel_ragged_delta_decode",
    )
    return tuple(kernel(*index, *tokens, pool))
