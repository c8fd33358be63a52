"""Reference linear attention: the step-by-step float32 recurrences every implementation is tested against.

Two recurrences cover the family (API.md section 2b). Per batch row and head the state `h` is a
`[Dk, Dv]` matrix and gates are log decays:

- gated linear recurrence (`recurrent_attention`, `gla_attention`, `lightning_attention`):
  `h_t = h_{t-1} ⊙ exp(g_t + g_gamma + gk_t[:, None] + gv_t[None, :]) + k_t v_tᵀ`, `o_t = (scale·q_t)ᵀ h_t`;
- delta rule (`kernel_delta_attention`, `gated_delta_rule`): `h ← h·exp(decay_t)`,
  `u_t = beta_t (v_t − hᵀ k_t)`, `h ← h + k_t u_tᵀ`, `o_t = (scale·q_t)ᵀ h`.

Written for clarity: one token at a time (`lax.scan`), batch rows side by side (`vmap`), packed
sequences one at a time (a Python loop over `cu_seqlens`), gradients by autodiff. Never optimised, never registered.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def _f32(x):
    return None if x is None else jnp.asarray(x, jnp.float32)


def _per_query_head(x, num_heads):
    """`[B, S, Hkv, D]` -> `[B, S, H, D]`: query head h reads key/value head h // (H // Hkv)."""
    return x[:, :, jnp.arange(num_heads) // (num_heads // x.shape[2])]


def _run_sequences(step, xs, initial_state, cu_seqlens, reverse):
    """Runs `step` over time for every batch row (or every packed sequence); returns `(out, final_states)`.

    `xs` holds per-token arrays `[B, S, ...]`; `initial_state` is `[N, H, Dk, Dv]` (N = B, or the number
    of packed sequences), float32.
    """

    def run(h0, seq):
        if reverse:
            seq = {name: x[::-1] for name, x in seq.items()}
        final, out = jax.lax.scan(step, h0, seq)
        return (out[::-1] if reverse else out), final

    if cu_seqlens is None:  # the rows side by side
        return jax.vmap(run)(initial_state, xs)
    bounds = np.asarray(cu_seqlens)
    outs, finals = [], []
    for i in range(len(bounds) - 1):  # one sequence at a time
        out, final = run(initial_state[i], {name: x[0, bounds[i] : bounds[i + 1]] for name, x in xs.items()})
        outs.append(out)
        finals.append(final)
    return jnp.concatenate(outs)[None], jnp.stack(finals)


def linear_recurrence_reference(
    query,
    key,
    value,
    g=None,
    g_gamma=None,
    gk=None,
    gv=None,
    initial_state=None,
    cu_seqlens=None,
    *,
    softmax_scale=None,
    reverse=False,
):
    """The gated linear recurrence, token by token. Returns `(out [B,S,H,Dv] float32, final_state float32)`.

    query `[B,S,H,Dk]`; key `[B,S,Hkv,Dk]`, value `[B,S,Hkv,Dv]` (H % Hkv == 0); g `[B,S,H]`;
    g_gamma `[H]` or `[B,H]`; gk `[B,S,H,Dk]`; gv `[B,S,H,Dv]`; initial_state `[N,H,Dk,Dv]`; with
    `cu_seqlens [N+1]` the batch is 1 and holds N sequences back to back, each with its own recurrence.
    `reverse` runs every recurrence from its last token to its first. The final state is `[N,H,Dk,Dv]`.
    """
    q, k, v = _f32(query), _f32(key), _f32(value)
    batch, seq_len, num_heads, dk = q.shape
    dv = v.shape[-1]
    k, v = _per_query_head(k, num_heads), _per_query_head(v, num_heads)
    scale = dk**-0.5 if softmax_scale is None else softmax_scale
    log_decay = jnp.zeros((batch, seq_len, num_heads, dk, dv), jnp.float32)
    if g is not None:
        log_decay = log_decay + _f32(g)[..., None, None]
    if g_gamma is not None:
        log_decay = log_decay + jnp.broadcast_to(_f32(g_gamma), (batch, num_heads))[:, None, :, None, None]
    if gk is not None:
        log_decay = log_decay + _f32(gk)[..., :, None]
    if gv is not None:
        log_decay = log_decay + _f32(gv)[..., None, :]

    def step(h, x):
        h = h * jnp.exp(x["log_decay"]) + x["k"][:, :, None] * x["v"][:, None, :]
        return h, jnp.einsum("hk,hkv->hv", scale * x["q"], h, precision=jax.lax.Precision.HIGHEST)

    n = batch if cu_seqlens is None else len(cu_seqlens) - 1
    h0 = jnp.zeros((n, num_heads, dk, dv), jnp.float32) if initial_state is None else _f32(initial_state)
    return _run_sequences(step, dict(q=q, k=k, v=v, log_decay=log_decay), h0, cu_seqlens, reverse)


def gla_reference(query, key, value, g=None, g_gamma=None, initial_state=None, cu_seqlens=None, **options):
    """`gla_attention`: the recurrence with a per-key-channel gate `g [B,S,H,Dk]`."""
    return linear_recurrence_reference(query, key, value, None, g_gamma, g, None, initial_state, cu_seqlens, **options)


def lightning_reference(query, key, value, initial_state=None, cu_seqlens=None, *, layer_idx, num_layers, **options):
    """`lightning_attention`: the recurrence with the fixed decay `-(8/H)·(1 - layer_idx/num_layers)·h` of head h."""
    num_heads = query.shape[2]
    g_gamma = -(8.0 / num_heads) * (1.0 - layer_idx / num_layers) * jnp.arange(num_heads, dtype=jnp.float32)
    return linear_recurrence_reference(
        query, key, value, None, g_gamma, None, None, initial_state, cu_seqlens, **options
    )


def delta_rule_reference(
    query,
    key,
    value,
    beta,
    decay=None,
    initial_state=None,
    seg_ids=None,
    *,
    softmax_scale=None,
    use_qk_l2norm=True,
):
    """The (gated) delta rule, token by token. Returns `(out [B,S,H,Dv] float32, final_state [B,H,Dk,Dv])`.

    query, key `[B,S,H,Dk]`; value `[B,S,H,Dv]`; beta and decay `[B,S,H]`; initial_state `[B,H,Dk,Dv]`.
    With `use_qk_l2norm`, q and k are first divided by `sqrt(Σ x² + 1e-6)` over `Dk`.

    `seg_ids [B,S]` packs several sequences per row: a token with a negative id is padding (it leaves
    the state alone and outputs zeros); the state restarts from zeros at every token whose id differs
    from that of the row's previous non-padding token. `initial_state` seeds each row's first
    sequence, and the final state is the one after the row's last non-padding token.
    """
    q, k, v, beta = _f32(query), _f32(key), _f32(value), _f32(beta)
    batch, seq_len, num_heads, dk = q.shape
    if use_qk_l2norm:
        q = q / jnp.sqrt(jnp.sum(q * q, axis=-1, keepdims=True) + 1e-6)
        k = k / jnp.sqrt(jnp.sum(k * k, axis=-1, keepdims=True) + 1e-6)
    scale = dk**-0.5 if softmax_scale is None else softmax_scale
    decay = jnp.zeros((batch, seq_len, num_heads), jnp.float32) if decay is None else _f32(decay)
    seg = jnp.zeros((batch, seq_len), jnp.int32) if seg_ids is None else jnp.asarray(seg_ids, jnp.int32)

    def step(carry, x):
        h, previous_id = carry  # previous_id: id of the last non-padding token so far (-1: none yet)
        valid = x["seg"] >= 0
        restart = valid & (previous_id >= 0) & (x["seg"] != previous_id)
        h_new = jnp.where(restart, 0.0, h) * jnp.exp(x["decay"])[:, None, None]
        u = x["beta"][:, None] * (x["v"] - jnp.einsum("hkv,hk->hv", h_new, x["k"], precision="highest"))
        h_new = h_new + x["k"][:, :, None] * u[:, None, :]
        out = jnp.einsum("hk,hkv->hv", scale * x["q"], h_new, precision=jax.lax.Precision.HIGHEST)
        carry = (jnp.where(valid, h_new, h), jnp.where(valid, x["seg"], previous_id))
        return carry, jnp.where(valid, out, 0.0)

    def run(h0, xs):  # one row
        (final, _), out = jax.lax.scan(step, (h0, jnp.int32(-1)), xs)
        return out, final

    h0 = jnp.zeros((batch, num_heads, dk, v.shape[-1]), jnp.float32) if initial_state is None else _f32(initial_state)
    return jax.vmap(run)(h0, dict(q=q, k=k, v=v, beta=beta, decay=decay, seg=seg))
