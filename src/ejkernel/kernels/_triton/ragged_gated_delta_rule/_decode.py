"""The decode step of the ragged gated delta rule in one Pallas-Triton kernel, on the state pool in place.

One program per (request, head, tile of `block_v` value columns): it reads its request's token (q, k, v, beta,
decay; q and k L2-normalised in the kernel), loads the `[Dk, block_v]` float32 tile of the request's slot
straight from the pool, runs one delta-rule step and writes the tile back into the same slot. The pool is
aliased to the kernel's output (`input_output_aliases`), so under `jit` with the pool donated nothing is copied.

Which programs work is data: a request `WRITES` (the first live request of its slot), `READS` (live, but an
earlier request writes its slot: output only) or is `IDLE` (empty, or its slot outside the pool: zero output, no
write). A call with request bounds decides it in XLA beforehand (`Requests`); for a decode batch (request r is
token r) the readers' kernel decides it, each program scanning the slots before its own, and hands the modes on.
Readers must see the slot's old state, which a writer of the same slot overwrites in place; so they run first, in a
kernel of their own that writes no state, one program per request (readers are rare: a reader steps all its heads
and tiles in turn, every other program returns at once; on an H200 a grid of one program per tile cost 12 us of a
390 us step with no reader at all). The writers' kernel then writes the writers' outputs and states and the idle
requests' zero outputs.
"""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from ejkernel.kernels._common.linear_attention.inputs import L2_EPS
from ejkernel.kernels._common.linear_attention.ragged import IDLE, READS, WRITES
from ejkernel.kernels._common.vma import out_struct

F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class TritonRaggedDecodeTiling:
    """Value columns per program (a power of two, at most Dv), warps per program, interpret mode. 64 x 4 warps was
    the fastest on an H200 (256 requests, H 32, D 128: 0.388 ms against 0.446 at 32 columns, 0.711 at 16)."""

    block_v: int = 64
    num_warps: int = 4
    interpret: bool = False


def _normalised(x, l2norm: bool):
    x = x.astype(F32)
    return x * lax.rsqrt(jnp.sum(x * x) + L2_EPS) if l2norm else x


def _step(refs, r, head, cols, s):
    """One token of request `r` on the slot's tile `[Dk, cols]` of `head`: `h ← h·e^{decay}`, `u = β (v − hᵀk)`,
    `h ← h + k uᵀ`, `o = scale · qᵀ h`; the output stored, and the state too if a `new_pool` ref is given."""
    token_ref, slot_ref, q_ref, k_ref, v_ref, beta_ref, decay_ref, pool_ref, out_ref, new_pool_ref = refs
    token, slot = token_ref[r], slot_ref[r]
    q = _normalised(q_ref[token, head, :], s["l2norm"]) * s["scale"]
    k = _normalised(k_ref[token, head, :], s["l2norm"])
    h = plgpu.load(pool_ref.at[slot, head, :, cols]).astype(F32)
    if decay_ref is not None:
        h = h * jnp.exp(decay_ref[token, head].astype(F32))
    u = beta_ref[token, head].astype(F32) * (v_ref[token, head, cols].astype(F32) - jnp.sum(h * k[:, None], 0))
    h = h + k[:, None] * u[None, :]
    out_ref[r, head, cols] = jnp.sum(q[:, None] * h, axis=0).astype(out_ref.dtype)
    if new_pool_ref is not None:
        plgpu.store(new_pool_ref.at[slot, head, :, cols], h.astype(new_pool_ref.dtype))


def _mode_of(slot_ref, r, num_requests: int, num_slots: int):
    """Request r's mode in a decode batch, from the slots: `IDLE` outside the pool, else `READS` where an earlier
    request names its slot (that one is live too, and writes it first), else `WRITES`."""
    slot = slot_ref[r]
    block = min(1024, pl.next_power_of_2(num_requests))

    def scan(i, seen):
        rows = i * block + jnp.arange(block)
        earlier = plgpu.load(slot_ref.at[pl.ds(i * block, block)], mask=rows < r, other=-1)
        return jnp.maximum(seen, jnp.max((earlier == slot).astype(jnp.int32)))

    seen = lax.fori_loop(0, lax.div(r + block - 1, block), scan, jnp.int32(0))
    live = ((slot >= 0) & (slot < num_slots)).astype(jnp.int32)
    return live * (WRITES - (WRITES - READS) * seen)  # (IDLE is 0)


def _readers_kernel(token_ref, slot_ref, *refs, **s):
    """One program per request: a reader steps every head and tile in turn and stores its outputs (not the
    state); any other request returns at once (its row is the writers' kernel's). Without a mode input (a decode
    batch) the program decides its request's mode (`_mode_of`) and stores it in the last output."""
    refs = list(refs)
    mode_ref = refs.pop(0) if s["modes_given"] else None
    q_ref, k_ref, v_ref, beta_ref = refs[:4]
    decay_ref = refs[4] if s["has_decay"] else None
    pool_ref, out_ref, *mode_out = refs[4 + s["has_decay"] :]
    r, bv, tiles = pl.program_id(0), s["block_v"], s["tiles"]
    step_refs = (token_ref, slot_ref, q_ref, k_ref, v_ref, beta_ref, decay_ref, pool_ref, out_ref, None)
    if mode_ref is not None:
        mode = mode_ref[r]
    else:
        mode = _mode_of(slot_ref, r, slot_ref.shape[0], pool_ref.shape[0])
        mode_out[0][r] = mode

    @pl.when(mode == READS)
    def _():
        def body(i, carry):
            cols = pl.ds(pl.multiple_of(lax.rem(i, tiles) * bv, bv), bv)
            _step(step_refs, r, lax.div(i, tiles), cols, s)
            return carry

        lax.fori_loop(0, s["heads"] * tiles, body, 0)


def _writers_kernel(token_ref, slot_ref, mode_ref, q_ref, k_ref, v_ref, beta_ref, *refs, **s):
    """One program per (request, head, tile): a writer steps and stores its output and the state in place; an
    idle request's output tile is zeros; a reader's is left as the readers' kernel stored it."""
    decay_ref, refs = (refs[0], refs[1:]) if s["has_decay"] else (None, refs)
    pool_ref, _, out_ref, new_pool_ref = refs  # the second and fourth alias the readers' outputs and the pool
    r, head, tile = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    bv = s["block_v"]
    cols = pl.ds(pl.multiple_of(tile * bv, bv), bv)
    mode = mode_ref[r]
    step_refs = (token_ref, slot_ref, q_ref, k_ref, v_ref, beta_ref, decay_ref, pool_ref, out_ref, new_pool_ref)

    @pl.when(mode == WRITES)
    def _():
        _step(step_refs, r, head, cols, s)

    @pl.when(mode == IDLE)
    def _():
        out_ref[r, head, cols] = jnp.zeros((bv,), out_ref.dtype)


def decode_step(
    tiling: TritonRaggedDecodeTiling, l2norm: bool, query, key, value, beta, decay, pool, token, slot, mode=None
):
    """`(out [N, H, Dv] in the query's dtype, the pool after the step)`: request `r` steps token `token[r]` on slot
    `slot[r]` as `mode[r]` says (`IDLE`, `READS`, `WRITES`); the pool is updated in place (aliased). `mode` None:
    a decode batch (`token[r] = r`), the modes decided from the slots in the readers' kernel."""
    num_requests, heads, dv = token.shape[0], query.shape[1], value.shape[-1]
    bv = min(tiling.block_v, dv)
    tokens = [query, key, value, beta] + ([] if decay is None else [decay])
    static = dict(block_v=bv, l2norm=l2norm, scale=query.shape[-1] ** -0.5, has_decay=decay is not None)
    call = functools.partial(
        pl.pallas_call,
        compiler_params=plgpu.CompilerParams(num_warps=tiling.num_warps, num_stages=1),
        interpret=tiling.interpret,
    )
    index = [token, slot] + ([] if mode is None else [mode])
    out_shape = out_struct((num_requests, heads, dv), query.dtype, *index, *tokens, pool)
    modes_shape = () if mode is not None else (out_struct((num_requests,), jnp.int32, *index, *tokens, pool),)
    readers = call(
        functools.partial(_readers_kernel, heads=heads, tiles=dv // bv, modes_given=mode is not None, **static),
        grid=(num_requests,),
        out_shape=[out_shape, *modes_shape],
        name="ejkernel_ragged_delta_decode_readers",
    )
    # always (a `lax.cond` on the modes may read its predicate on the host)
    out, *decided = readers(*index, *tokens, pool)
    index = [token, slot, *decided] if mode is None else index
    aliased = len(index) + len(tokens)  # the pool's operand index, then the readers' outputs'
    writers = call(
        functools.partial(_writers_kernel, **static),
        grid=(num_requests, heads, dv // bv),
        out_shape=[out_shape, out_struct(pool.shape, pool.dtype, *index, *tokens, pool)],
        input_output_aliases={aliased + 1: 0, aliased: 1},
        name="ejkernel_ragged_delta_decode",
    )
    return writers(*index, *tokens, pool, out)
