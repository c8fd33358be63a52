"""Reference ragged gated delta rule: packed requests, each running the delta rule on its own state slot.

Request `r` owns tokens `[qsl[r], qsl[r+1])` of the packed `[T, ...]` inputs and slot `state_indices[r]`
of the state pool `[S, H, Dk, Dv]`. It runs `delta_rule_reference` (API.md section 2b, token by token)
from that slot's state and writes its final state back. Tokens of no request output zeros; slots of no
non-empty request keep their state. Written for clarity: a Python loop over concrete request bounds.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ejkernel.reference.linear_attention import delta_rule_reference


def ragged_gated_delta_rule_reference(
    query,
    key,
    value,
    beta,
    decay,
    recurrent_state,
    query_start_loc,
    state_indices,
    *,
    use_qk_l2norm=True,
):
    """Returns `(out [T,H,Dv] float32, new_state [S,H,Dk,Dv] float32)`.

    query, key `[T,H,Dk]`; value `[T,H,Dv]`; beta and decay `[T,H]` (decay None: no decay);
    `query_start_loc [N+1]` and `state_indices [N]` concrete. Every request reads its slot's state as
    given; when non-empty requests share a slot, the first of them (lowest index) writes it.
    """
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    q, k, v, beta, state = f32(query), f32(key), f32(value), f32(beta), f32(recurrent_state)
    decay = jnp.zeros_like(beta) if decay is None else f32(decay)
    bounds, slots = np.asarray(query_start_loc), np.asarray(state_indices)
    out = jnp.zeros(v.shape, jnp.float32)
    new_state, written = state, set()
    for r, slot in enumerate(slots):
        start, end = int(bounds[r]), int(bounds[r + 1])
        if start == end:
            continue
        request = [x[None, start:end] for x in (q, k, v, beta, decay)]
        o, h = delta_rule_reference(*request, initial_state=state[slot][None], use_qk_l2norm=use_qk_l2norm)
        out = out.at[start:end].set(o[0])
        if int(slot) not in written:
            new_state = new_state.at[slot].set(h[0])
            written.add(int(slot))
    return out, new_state
