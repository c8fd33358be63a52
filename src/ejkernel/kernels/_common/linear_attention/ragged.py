"""What the ragged gated delta rule's implementations share: its float32 inputs, the state pool's reads and
writes, and the decode step of one token per request (`decode_tokens`, also upstream's TPU decode entry).

Semantics are those of `ejkernel.reference.ragged_gated_delta_rule`.
"""

from __future__ import annotations

import jax.numpy as jnp

from ejkernel.kernels._common.linear_attention.inputs import l2_normalize
from ejkernel.kernels._common.linear_attention.numerics import delta_step


def delta_inputs(query, key, value, beta, decay, use_qk_l2norm: bool):
    """Float32 inputs of the recurrence: q (normalised if asked, then scaled by `Dk^-½`), k, v, beta, decay."""
    q, k = (l2_normalize(query), l2_normalize(key)) if use_qk_l2norm else (query, key)
    f32 = lambda x: x.astype(jnp.float32)
    decay = jnp.zeros(beta.shape, jnp.float32) if decay is None else f32(decay)
    return f32(q) * query.shape[-1] ** -0.5, f32(k), f32(value), f32(beta), decay


def read_states(recurrent_state, slots):
    """`[n, H, Dk, Dv]` float32: the states at `slots` (out-of-range slots clamped; they are never written)."""
    return jnp.take(recurrent_state, slots, axis=0, mode="clip").astype(jnp.float32)


def scatter_first(recurrent_state, slots, states, keep):
    """`recurrent_state` with `states[i]` written at `slots[i]` for the rows where `keep` is set.

    Of several kept rows naming one slot, the first (lowest row) writes it; out-of-range slots are
    dropped. Every write lands on its own slot, so the result never depends on the scatter's order.
    """
    num_slots, rows = recurrent_state.shape[0], jnp.arange(slots.shape[0], dtype=jnp.int32)
    keep = keep & (slots >= 0) & (slots < num_slots)
    target = jnp.where(keep, slots, num_slots)
    first = jnp.full((num_slots + 1,), slots.shape[0], jnp.int32).at[target].min(rows)
    target = jnp.where(keep & (first[target] == rows), target, num_slots)
    return recurrent_state.at[target].set(states.astype(recurrent_state.dtype), mode="drop")


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
    keep = (slots >= 0) & (slots < recurrent_state.shape[0])
    out = jnp.where(keep.reshape((-1,) + (1,) * (out.ndim - 1)), out, 0.0)
    return out.astype(query.dtype), scatter_first(recurrent_state, slots, final, keep)
