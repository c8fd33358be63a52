"""The ragged gated delta rule in plain JAX: packed requests, each on its own slot of a state pool.

Semantics are those of `ejkernel.reference.ragged_gated_delta_rule`. Request `r` owns tokens
`[qsl[r], qsl[r+1])` and slot `state_indices[r]`; `qsl` and `state_indices` may be traced (serving runs
under `jit`), so every shape is static and the request bounds are only read as data:

- decode path (every request has at most one token): one `delta_step` per request, in float32;
- chunked path (any mix): the family's packed chunked form (`linear_attention` with `cu_seqlens`: each
  request starts on a chunk boundary, WY/UT transform inside chunks, states passed between them) in
  float32. Tokens before `qsl[0]` join request 0 and tokens from `qsl[N]` on join request N-1 as zero
  tokens (q = k = v = beta = decay = 0), which output zeros and leave a state exactly as it was.

`lax.cond` on the traced lengths picks the path; both give the same result. New states are written
back by `scatter_first`: only non-empty requests write, and of several sharing a slot only the first.
Out-of-range values have one meaning: bounds are clamped to `[0, T]` and made non-decreasing, and a
request whose slot is outside the pool is dropped (its tokens become zero tokens, nothing is written).
Everything is plain autodiff-able JAX (the chunked form through its custom VJP), so `jax.grad` of a
surrounding model runs and differentiates through the op.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from ejkernel.kernels._common.linear_attention.driver import linear_attention
from ejkernel.kernels._common.linear_attention.numerics import delta_step
from ejkernel.kernels._common.linear_attention.ragged import delta_inputs, read_states, scatter_first
from ejkernel.kernels._common.search import sorted_position

DEFAULT_CHUNK = 64


def _decode(xs, init, bounds, lengths):
    """Each request's one token (if any) as a single delta-rule step: `(out [T,H,Dv], final [N,...])`."""
    num_tokens = xs[0].shape[0]
    token = jnp.minimum(bounds[:-1], num_tokens - 1)
    final, out = delta_step(init, *(x[token] for x in xs))
    placed = jnp.where(lengths > 0, token, num_tokens)
    return jnp.zeros((num_tokens, *out.shape[1:]), out.dtype).at[placed].set(out, mode="drop"), final


def _chunked(xs, init, bounds, chunk_size: int):
    """Every request in the packed chunked form: `(out [T,H,Dv], final [N,...])`."""
    q, k, v, beta, decay = xs
    num_tokens = q.shape[0]
    cu_seqlens = bounds.at[0].set(0).at[-1].set(num_tokens)  # padding tokens join the first and last request
    out, final = linear_attention(
        q[None],
        k[None],
        v[None],
        scale=1.0,
        g=decay[None],
        beta=beta[None],
        initial_state=init,
        cu_seqlens=cu_seqlens,
        chunk_size=chunk_size,
    )
    return out[0], final


def ragged_gated_delta_rule_xla(
    query,
    key,
    value,
    beta,
    decay=None,
    recurrent_state=None,
    query_start_loc=None,
    state_indices=None,
    *,
    chunk_size: int = DEFAULT_CHUNK,
    use_qk_l2norm: bool = True,
    cfg=None,
):
    """`ragged_gated_delta_rule` in plain JAX: `(out [T,H,Dv] in query.dtype, new_state in recurrent_state.dtype)`.

    Arguments as the public op's (checked there); `cfg.chunk_size`, when given, wins over `chunk_size`.
    Under `jit`, request bounds are clamped into `[0, T]` and made non-decreasing, and requests whose
    slot is outside `[0, S)` are dropped (zero outputs, no write).
    """
    required = {"recurrent_state": recurrent_state, "query_start_loc": query_start_loc, "state_indices": state_indices}
    for name, x in required.items():
        if x is None:
            raise ValueError(f"{name} is required, got None")
    chunk = getattr(cfg, "chunk_size", None) or chunk_size
    num_tokens = query.shape[0]
    if num_tokens == 0 or state_indices.shape[0] == 0:
        return jnp.zeros((num_tokens, *value.shape[1:]), query.dtype), recurrent_state
    bounds = lax.cummax(jnp.clip(query_start_loc.astype(jnp.int32), 0, num_tokens))
    lengths = bounds[1:] - bounds[:-1]
    slots = state_indices.astype(jnp.int32)
    positions = jnp.arange(num_tokens, dtype=jnp.int32)
    request = jnp.clip(sorted_position(bounds[1:], positions), 0, slots.shape[0] - 1)
    slot_ok = (slots >= 0) & (slots < recurrent_state.shape[0])
    inside = (positions >= bounds[0]) & (positions < bounds[-1]) & slot_ok[request]  # tokens of a kept request
    xs = delta_inputs(query, key, value, beta, decay, use_qk_l2norm)
    xs = tuple(jnp.where(inside.reshape((-1,) + (1,) * (x.ndim - 1)), x, 0.0) for x in xs)
    init = read_states(recurrent_state, slots)
    out, final = lax.cond(
        jnp.all(lengths <= 1),
        lambda xs, init: _decode(xs, init, bounds, lengths),
        lambda xs, init: _chunked(xs, init, bounds, chunk),
        xs,
        init,
    )
    return out.astype(query.dtype), scatter_first(recurrent_state, slots, final, lengths > 0)
