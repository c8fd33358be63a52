"""The family's driver: `linear_attention` runs either recurrence on an `Engine`; `chunked_linear_attention` is
its chunked form with per-head and per-key-channel gates (Mamba-2's SSD on XLA runs on it).

Semantics are those of `ejkernel.reference.linear_attention`. `linear_attention` maps grouped-query heads
to their key/value head, scales q, cuts the inputs into chunks (packed sequences each starting on a chunk
boundary, `layout`), then runs the chunked form (training and prefill) or the recurrent form (decoding,
per-value-channel gates, `use_chunked=False`) of `scan`. The base `Engine` runs all of it in plain JAX
(the xla platform); the Triton platform's engine runs the sequential and intra-chunk parts in kernels.
"""

from __future__ import annotations

import jax.numpy as jnp

from ejkernel.kernels._common.bounds import clamp_packed
from ejkernel.kernels._common.linear_attention.inputs import l2_normalize
from ejkernel.kernels._common.linear_attention.layout import ChunkLayout, flip_time
from ejkernel.kernels._common.linear_attention.numerics import delta_chunk, delta_step, diagonal_chunk, diagonal_step
from ejkernel.kernels._common.linear_attention.scan import ScanPasses, chunked_scan, recurrent_scan

DEFAULT_CHUNK = 64
RECURRENT_CHUNK = 16  # tokens between the states the recurrent form keeps for its backward


class Engine:
    """Where a platform runs the parts of the family that are not parallel over tokens.

    `passes`: the chunked form's sequential passes over chunks; `decode(step, tokens, init)`: one token
    per batch row (`tokens` `[B, H, ...]`, returns `(out [B, H, Dv], state)`), or None for the recurrent
    form in `lax.scan`; `gated(xs, init, layout, *, scale)`: the whole chunked form of the gated
    recurrence (no delta rule) on token-layout inputs, or None to run it through `chunked`;
    `delta(xs, init, layout, *, scale, l2norm)`: likewise the chunked delta rule of one sequence per row without
    restarts (q and k L2-normalised there if `l2norm`), or None; `check` raises NotImplementedError for calls the
    platform does not serve;
    `gated_chunk` / `delta_chunk`: the gated recurrence's / the gated delta rule's chunk size where the
    config names none; `key_gated_chunk_cap`: the largest chunk the chunked gated recurrence with per-key-channel
    gates runs (a larger one asked runs as this, changing only the rounding), or None.
    """

    passes = ScanPasses()
    decode = None
    gated = None
    delta = None
    min_chunk = 1
    gated_chunk = DEFAULT_CHUNK
    delta_chunk = DEFAULT_CHUNK
    key_gated_chunk_cap = None

    def chunked(self, xs: dict, init, starts, *, delta: bool, dtype):
        """The chunked form on chunk-layout inputs (float32; `dtype` the caller's): `(out, exit states)`."""
        del dtype
        return chunked_scan(delta_chunk if delta else diagonal_chunk, self.passes, xs, init, starts)

    def check(self, *, dk: int, dv: int, chunk: int, recurrent: bool, one_token: bool) -> None:
        del dk, dv, chunk, recurrent, one_token


XLA_ENGINE = Engine()  # every part in plain JAX: the xla platform's engine


def xla_engine(cfg) -> Engine:
    """The plain-JAX engine, whatever the config."""
    del cfg
    return XLA_ENGINE


def to_f32(x):
    """`x` in float32, None kept."""
    return None if x is None else x.astype(jnp.float32)


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def linear_attention(
    q,
    k,
    v,
    *,
    scale: float,
    l2norm: bool = False,
    g=None,
    gk=None,
    gv=None,
    beta=None,
    restarts=None,
    initial_state=None,
    cu_seqlens=None,
    reverse: bool = False,
    chunk_size: int = DEFAULT_CHUNK,
    recurrent: bool = False,
    engine: Engine = XLA_ENGINE,
):
    """Either recurrence of the family; returns `(out [B,S,H,Dv] in v.dtype, final_state [N,H,Dk,Dv] float32)`.

    Without `beta`: `h_t = h_{t-1} ⊙ exp(g_t + gk_t[:, None] + gv_t[None, :]) + k_t v_tᵀ`. With `beta [B,S,H]`:
    the delta rule with per-head decay `g`, and state resets before the tokens where `restarts [B,S]` is
    set. Outputs `o_t = scale · q_tᵀ h_t`. `gv` needs the recurrent form. `engine` runs the sequential parts.
    `l2norm` (the delta rule's `use_qk_l2norm`): q and k are L2-normalised along Dk first (`l2_normalize`), by the
    engine's own delta form where it runs (its kernels can do it as they load them).
    Traced `cu_seqlens` are clamped (`clamp_packed`, exact: bounds from 0 to S, never decreasing).
    """
    batch, seq_len, _, dk = q.shape
    if cu_seqlens is not None:
        cu_seqlens = clamp_packed(cu_seqlens, seq_len, exact=True)
    num_heads = max(q.shape[2], v.shape[2])
    if q.shape[2] < num_heads and (beta is not None or recurrent or gk is not None):
        raise ValueError("a query and key shared by groups of value heads need the chunked form with per-head gates")
    if gv is not None and not recurrent:
        raise ValueError("per-value-channel gates (gv) need the recurrent form")
    chunk = max(engine.min_chunk, min(chunk_size, _next_power_of_2(seq_len)))
    if gk is not None and engine.key_gated_chunk_cap is not None:
        chunk = min(chunk, engine.key_gated_chunk_cap)
    num_states = batch if cu_seqlens is None else cu_seqlens.shape[0] - 1
    decoding = seq_len == 1 or (cu_seqlens is not None and seq_len <= num_states)  # about one token per sequence
    one_token = cu_seqlens is None and seq_len == 1
    engine.check(dk=dk, dv=v.shape[-1], chunk=chunk, recurrent=recurrent, one_token=one_token)
    shape = (num_states, num_heads, dk, v.shape[-1])
    init = jnp.zeros(shape, jnp.float32) if initial_state is None else to_f32(initial_state)
    # The engine's own whole form (gated, or the delta rule of one sequence per row) takes q, k, v as
    # given (dtype, unscaled, grouped heads not repeated).
    own_form = engine.gated if beta is None else engine.delta if restarts is None and cu_seqlens is None else None
    whole = not recurrent and own_form is not None
    if l2norm and not (whole and beta is not None):
        q, k = l2_normalize(q), l2_normalize(k)
    if whole:
        gates = dict(a_key=to_f32(gk)) if beta is None else dict(beta=to_f32(beta))
        xs = dict(q=q, k=k, v=v, a_head=to_f32(g), **gates)
    else:
        if k.shape[2] < q.shape[2]:  # grouped-query: each key/value head serves a group of query heads
            kv_head = jnp.arange(num_heads) // (num_heads // k.shape[2])
            k, v = k[:, :, kv_head], v[:, :, kv_head]
        xs = dict(q=to_f32(q) * scale, k=to_f32(k), v=to_f32(v))
        if beta is not None:
            restarts = None if restarts is None else to_f32(restarts)[..., None]
            xs.update(beta=to_f32(beta), a_head=to_f32(g), restarts=restarts)
        elif recurrent:
            a_key = gk if g is None else g[..., None] if gk is None else gk + g[..., None]
            xs.update(a_key=to_f32(a_key), a_value=to_f32(gv))
        else:
            xs.update(a_head=to_f32(g), a_key=to_f32(gk))
    xs = {name: x for name, x in xs.items() if x is not None}
    if reverse:
        xs, cu_seqlens, init = flip_time(xs, cu_seqlens, init)

    if recurrent and engine.decode is not None and one_token:
        xs.pop("restarts", None)  # (no restart is possible at a row's first token)
        out, final = engine.decode(
            delta_step if beta is not None else diagonal_step, {n: x[:, 0] for n, x in xs.items()}, init
        )
        return out[:, None].astype(v.dtype), final
    if recurrent:
        chunk = 1 if decoding else min(chunk, RECURRENT_CHUNK)
    layout = (
        ChunkLayout.dense(batch, seq_len, chunk)
        if cu_seqlens is None
        else ChunkLayout.packed(cu_seqlens, seq_len, chunk)
    )
    if whole:
        options = dict(l2norm=l2norm) if beta is not None else {}
        out, final = own_form(xs, init, layout, scale=scale, **options)
    else:
        chunks = {name: layout.to_chunks(x) for name, x in xs.items()}
        if recurrent:
            step = delta_step if beta is not None else diagonal_step
            out, h_out = recurrent_scan(step, chunks, init, layout.starts)
        else:
            out, h_out = engine.chunked(chunks, init, layout.starts, delta=beta is not None, dtype=jnp.dtype(v.dtype))
        out, final = layout.from_chunks(out), layout.final_states(h_out, init)
    if reverse:
        out = jnp.flip(out, axis=1)
        final = final if cu_seqlens is None else jnp.flip(final, axis=0)
    return out.astype(v.dtype), final


def chunked_linear_attention(
    q, k, v, *, g=None, gk=None, scale, initial_state=None, reverse=False, cu_seqlens=None, chunk_size=64
):
    """Chunked linear attention with per-head and per-key-channel log decays, in plain JAX.

    Recurrence, per batch row and head (state `h` is `[Dk, Dv]`, float32):
        h_t = h_{t-1} * exp(g_t) * exp(gk_t)[:, None] + k_t v_tᵀ ;   o_t = scale * q_tᵀ h_t

    Args:
      q, k: `[B, S, H, Dk]` (k may have fewer heads, a divisor of H: query head h reads k/v head
        h // (H // Hk)); v: `[B, S, Hk, Dv]`. Any float dtype; computed in float32.
      g: `[B, S, H]` per-head log decay (<= 0 decays), optional.
      gk: `[B, S, H, Dk]` per-key-channel log decay, optional; g and gk may both be given.
      scale: multiplies q (e.g. `Dk ** -0.5`).
      initial_state: `[B, H, Dk, Dv]`, or `[N, H, Dk, Dv]` with `cu_seqlens`; zeros if None.
      reverse: run the recurrence from the last token to the first (of each sequence).
      cu_seqlens: `[N + 1]` int32 cumulative lengths `[0, n1, n1+n2, ...]` of N sequences packed along
        axis 1 of a batch of 1; each sequence runs its own recurrence from its own initial state.
      chunk_size: tokens per chunk (a power of two; clamped for short inputs).

    Returns `(out [B, S, H, Dv] in v.dtype, final_state [B or N, H, Dk, Dv] float32)`.

    q and k may also both have fewer heads than v (`[B, S, G, Dk]`, shared by the value heads
    `h // (H // G)`, as SSD's C and B), with per-head gates g only: H is then v's heads, and no per-head
    copy of q or k is formed.

    Differentiable w.r.t. q, k, v, g, gk and initial_state (custom VJP: memory linear in S; the
    backward keeps one state per chunk). Stable for any length: gates are summed inside a chunk only
    and every exponential taken is of a non-positive number when the gates are non-positive.
    Works under `jit` and `vmap`. SSD (Mamba-2) maps onto it with q = C, k = B, v = dt·x,
    g = A·dt, scale = 1.
    """
    return linear_attention(
        q,
        k,
        v,
        scale=scale,
        g=g,
        gk=gk,
        initial_state=initial_state,
        cu_seqlens=cu_seqlens,
        reverse=reverse,
        chunk_size=chunk_size,
    )
