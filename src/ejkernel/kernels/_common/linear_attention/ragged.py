"""What the ragged gated delta rule's implementations share: the requests read from the traced bounds and slots,
the float32 inputs, the state pool's reads and writes, the whole op in plain JAX (`ragged_delta_rule`: the
XLA implementation, and the gradient of the others), and the decode step of one token per request
(`decode_tokens`, also upstream's TPU decode entry).

Semantics are those of `ejkernel.reference.ragged_gated_delta_rule`. Request `r` owns tokens
`[qsl[r], qsl[r+1])` and slot `state_indices[r]`; `qsl` and `state_indices` may be traced (serving runs
under `jit`), so every shape is static and the request bounds are only read as data. Out-of-range values
have one meaning: bounds are clamped to `[0, T]` and made non-decreasing, and a request whose slot is
outside the pool is dropped (its tokens output zeros, nothing is written). Of several non-empty requests
naming one slot, each reads the slot's old state and the first writes it. `qsl=None` says, statically, that
the call is a decode batch: token `i` is request `i` (`state_indices [T]`), as `qsl = arange(T + 1)` would with
no `lax.cond` between the paths.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from ejkernel.kernels._common.linear_attention.driver import linear_attention
from ejkernel.kernels._common.linear_attention.inputs import l2_normalize
from ejkernel.kernels._common.linear_attention.numerics import delta_step
from ejkernel.kernels._common.search import sorted_position

DEFAULT_CHUNK = 64
IDLE, READS, WRITES = 0, 1, 2  # a request's part in a decode step (the decode kernels' `mode`)
# the public op by name, for upstream's private entries (backends import no public module: `ejkernel.registry.resolve`)
PUBLIC_OP = "ejkernel.modules.operations.ragged_gated_delta_rule:ragged_gated_delta_rule"


class Requests(NamedTuple):
    """The requests of a call, as data: `bounds [N+1]` (clamped, non-decreasing), `lengths [N]`, `slots [N]`
    int32, `live [N]` (non-empty with a slot in the pool: they output and read), `writes [N]` (the first live
    request of each slot: they write), and `inside [T]` (the tokens of live requests)."""

    bounds: jax.Array
    lengths: jax.Array
    slots: jax.Array
    live: jax.Array
    writes: jax.Array
    inside: jax.Array


def in_pool(slots, num_slots: int):
    """`[N]` bool: the slots in `[0, num_slots)`."""
    return (slots >= 0) & (slots < num_slots)


def first_writers(slots, keep, num_slots: int):
    """`[N]` bool: the rows where `keep` is set whose slot (in `[0, num_slots)`) no earlier kept row names."""
    rows = jnp.arange(slots.shape[0], dtype=jnp.int32)
    keep = keep & in_pool(slots, num_slots)
    target = jnp.where(keep, slots, num_slots)
    first = jnp.full((num_slots + 1,), slots.shape[0], jnp.int32).at[target].min(rows)
    return keep & (first[target] == rows)


def decode_modes(writes, live):
    """`[N]` int32: `WRITES` where `writes`, `READS` where only `live` (an earlier request writes the slot: output
    only, from the old state), `IDLE` elsewhere (empty, or a slot outside the pool)."""
    return jnp.where(writes, WRITES, jnp.where(live, READS, IDLE)).astype(jnp.int32)


def requests(query_start_loc, state_indices, num_tokens: int, num_slots: int) -> Requests:
    """The `Requests` of a call (the out-of-range rules above applied)."""
    bounds = lax.cummax(jnp.clip(query_start_loc.astype(jnp.int32), 0, num_tokens))
    lengths = bounds[1:] - bounds[:-1]
    slots = state_indices.astype(jnp.int32)
    live = (lengths > 0) & in_pool(slots, num_slots)
    positions = jnp.arange(num_tokens, dtype=jnp.int32)
    request = jnp.clip(sorted_position(bounds[1:], positions), 0, slots.shape[0] - 1)
    inside = (positions >= bounds[0]) & (positions < bounds[-1]) & live[request]
    return Requests(bounds, lengths, slots, live, first_writers(slots, live, num_slots), inside)


def decode_or_chunked(decode, chunked, inputs, pool, query_start_loc, state_indices):
    """A call with request bounds on kernels: `decode(inputs, pool, req)` when every request has at most one token,
    else `chunked(inputs, pool, req)` (`lax.cond` on the traced lengths; `req` the call's `Requests`)."""
    req = requests(query_start_loc, state_indices, inputs[0].shape[0], pool.shape[0])
    return lax.cond(jnp.all(req.lengths <= 1), decode, chunked, inputs, pool, req)


def delta_inputs(query, key, value, beta, decay, use_qk_l2norm: bool):
    """Float32 inputs of the recurrence: q (normalised if asked, then scaled by `Dk^-½`), k, v, beta, decay."""
    q, k = (l2_normalize(query), l2_normalize(key)) if use_qk_l2norm else (query, key)
    f32 = lambda x: x.astype(jnp.float32)
    decay = jnp.zeros(beta.shape, jnp.float32) if decay is None else f32(decay)
    return f32(q) * query.shape[-1] ** -0.5, f32(k), f32(value), f32(beta), decay


def request_inputs(query, key, value, beta, decay, use_qk_l2norm: bool, inside):
    """`delta_inputs`, zero on the tokens outside `inside` (zero tokens output zeros and keep a state as it is)."""
    xs = delta_inputs(query, key, value, beta, decay, use_qk_l2norm)
    return tuple(jnp.where(inside.reshape((-1,) + (1,) * (x.ndim - 1)), x, 0.0) for x in xs)


def packed_bounds(bounds, num_tokens: int):
    """The requests as packed sequences covering every token: those before the first request join it, those
    from the last bound on join the last (zero tokens, `request_inputs`)."""
    return bounds.at[0].set(0).at[-1].set(num_tokens)


def read_states(recurrent_state, slots):
    """`[n, H, Dk, Dv]` float32: the states at `slots` (out-of-range slots clamped; they are never written)."""
    return jnp.take(recurrent_state, slots, axis=0, mode="clip").astype(jnp.float32)


def scatter_first(recurrent_state, slots, states, keep):
    """`recurrent_state` with `states[i]` written at `slots[i]` for the rows where `keep` is set.

    Of several kept rows naming one slot, the first (lowest row) writes it; out-of-range slots are
    dropped. Every write lands on its own slot, so the result never depends on the scatter's order.
    """
    num_slots = recurrent_state.shape[0]
    target = jnp.where(first_writers(slots, keep, num_slots), slots, num_slots)
    return recurrent_state.at[target].set(states.astype(recurrent_state.dtype), mode="drop")


def decode_token(bounds, num_tokens: int):
    """`[N]` the token of each request of a decode batch (at most one token each): its first, clamped."""
    return jnp.minimum(bounds[:-1], num_tokens - 1)


def place_decoded(out, token, keep, num_tokens: int):
    """Requests' outputs `[N, ...]` at their tokens in `[T, ...]` zeros; rows not in `keep` write nothing."""
    placed = jnp.where(keep, token, num_tokens)
    return jnp.zeros((num_tokens, *out.shape[1:]), out.dtype).at[placed].set(out, mode="drop")


def _decode(xs, init, bounds, lengths):
    """Each request's one token (if any) as a single delta-rule step: `(out [T,H,Dv], final [N,...])`."""
    num_tokens = xs[0].shape[0]
    token = decode_token(bounds, num_tokens)
    final, out = delta_step(init, *(x[token] for x in xs))
    return place_decoded(out, token, lengths > 0, num_tokens), final


def _chunked(xs, init, bounds, chunk_size: int):
    """Every request in the packed chunked form (`linear_attention` with `cu_seqlens`): `(out [T,H,Dv], final
    [N,...])`."""
    q, k, v, beta, decay = xs
    out, final = linear_attention(
        q[None],
        k[None],
        v[None],
        scale=1.0,
        g=decay[None],
        beta=beta[None],
        initial_state=init,
        cu_seqlens=packed_bounds(bounds, q.shape[0]),
        chunk_size=chunk_size,
    )
    return out[0], final


def require_pool_arguments(recurrent_state, state_indices) -> None:
    """ValueError naming the first of the pool arguments an entry got as None (they default to None only to keep
    upstream's argument order; `query_start_loc=None` is a decode batch)."""
    required = {"recurrent_state": recurrent_state, "state_indices": state_indices}
    for name, x in required.items():
        if x is None:
            raise ValueError(f"{name} is required, got None")


def ragged_delta_rule(
    query,
    key,
    value,
    beta,
    decay,
    recurrent_state,
    query_start_loc,
    state_indices,
    *,
    chunk_size: int | None = None,
    use_qk_l2norm: bool = True,
):
    """The whole op in plain, differentiable JAX: `(out [T,H,Dv] in query.dtype, new_state in recurrent_state's
    dtype)`; `chunk_size` None: `DEFAULT_CHUNK`.

    A call whose requests all have at most one token runs one `delta_step` per request, any other the family's
    packed chunked form (each request starting on a chunk boundary) in float32; `lax.cond` on the traced lengths
    picks the path, and both give the same result. New states are written back by `scatter_first`. Without
    `query_start_loc`, a decode batch: `decode_tokens`.
    """
    num_tokens = query.shape[0]
    if num_tokens == 0 or state_indices.shape[0] == 0:
        return jnp.zeros((num_tokens, *value.shape[1:]), query.dtype), recurrent_state
    if query_start_loc is None:
        return decode_tokens(query, key, value, beta, decay, recurrent_state, state_indices, use_qk_l2norm)
    req = requests(query_start_loc, state_indices, num_tokens, recurrent_state.shape[0])
    xs = request_inputs(query, key, value, beta, decay, use_qk_l2norm, req.inside)
    init = read_states(recurrent_state, req.slots)
    out, final = lax.cond(
        jnp.all(req.lengths <= 1),
        lambda xs, init: _decode(xs, init, req.bounds, req.lengths),
        lambda xs, init: _chunked(xs, init, req.bounds, chunk_size or DEFAULT_CHUNK),
        xs,
        init,
    )
    return out.astype(query.dtype), scatter_first(recurrent_state, req.slots, final, req.lengths > 0)


def decode_tokens(query, key, value, beta, decay, recurrent_state, state_indices, use_qk_l2norm: bool):
    """One decode step per token: token `i` reads slot `state_indices[i]` and writes its new state there.

    Returns `(out [T,H,Dv] in query.dtype, new_state in recurrent_state.dtype)`. Of tokens naming one
    slot, the first (lowest index) writes it; a token whose slot is out of range outputs zeros and
    writes nothing.
    """
    if state_indices.shape != query.shape[:1]:
        raise ValueError(
            f"state_indices must be [tokens] = ({query.shape[0]},) (one slot per token), got {state_indices.shape}"
        )
    slots = state_indices.astype(jnp.int32)
    final, out = delta_step(
        read_states(recurrent_state, slots), *delta_inputs(query, key, value, beta, decay, use_qk_l2norm)
    )
    keep = in_pool(slots, recurrent_state.shape[0])
    out = jnp.where(keep.reshape((-1,) + (1,) * (out.ndim - 1)), out, 0.0)
    return out.astype(query.dtype), scatter_first(recurrent_state, slots, final, keep)
