"""Entry points of the linear attention: one driver, `chunked_linear_attention`, and the five ops.

Semantics are those of `ejkernel.reference.linear_attention`. Every op goes through `linear_attention`:
grouped-query heads mapped to their key/value head, q scaled, inputs cut into chunks (packed sequences
each starting on a chunk boundary, `_layout`), then the chunked form (training and prefill) or the
recurrent form (decoding, per-value-channel gates, `use_chunked=False`) of `_scan`. The entries
registered here run all of it in plain JAX; the Triton platform registers the same entries with an
`Engine` that runs the sequential and intra-chunk parts in kernels.
"""

from __future__ import annotations

import jax.numpy as jnp

from ejkernel.kernels._common.bounds import clamp_packed
from ejkernel.kernels._common.linear_attention import (
    check_chunk_size,
    check_layer,
    check_linear_call,
    delta_chunk,
    delta_step,
    diagonal_chunk,
    diagonal_step,
    l2_normalize,
    lightning_gamma,
    segment_restarts,
)

from ._layout import ChunkLayout, flip_time
from ._scan import ScanPasses, chunked_scan, recurrent_scan

DEFAULT_CHUNK = 64
RECURRENT_CHUNK = 16  # tokens between the states the recurrent form keeps for its backward


class Engine:
    """Where a platform runs the parts of the family that are not parallel over tokens.

    `passes`: the chunked form's sequential passes over chunks; `decode(step, tokens, init)`: one token
    per batch row (`tokens` `[B, H, ...]`, returns `(out [B, H, Dv], state)`), or None for the recurrent
    form in `lax.scan`; `gated(xs, init, layout, *, scale)`: the whole chunked form of the gated
    recurrence (no delta rule) on token-layout inputs, or None to run it through `chunked`;
    `delta(xs, init, layout, *, scale)`: likewise the chunked delta rule of one sequence per row without
    restarts, or None; `check` raises NotImplementedError for calls the platform does not serve;
    `gated_chunk` / `delta_chunk`: the gated recurrence's / the gated delta rule's chunk size where the
    config names none.
    """

    passes = ScanPasses()
    decode = None
    gated = None
    delta = None
    min_chunk = 1
    gated_chunk = DEFAULT_CHUNK
    delta_chunk = DEFAULT_CHUNK

    def chunked(self, xs: dict, init, starts, *, delta: bool, dtype):
        """The chunked form on chunk-layout inputs (float32; `dtype` the caller's): `(out, exit states)`."""
        del dtype
        return chunked_scan(delta_chunk if delta else diagonal_chunk, self.passes, xs, init, starts)

    def check(self, *, dk: int, dv: int, chunk: int, recurrent: bool, one_token: bool) -> None:
        del dk, dv, chunk, recurrent, one_token


XLA_ENGINE = Engine()


def xla_engine(cfg) -> Engine:
    del cfg
    return XLA_ENGINE


def _f32(x):
    return None if x is None else x.astype(jnp.float32)


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def linear_attention(
    q,
    k,
    v,
    *,
    scale: float,
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
    num_states = batch if cu_seqlens is None else cu_seqlens.shape[0] - 1
    decoding = seq_len == 1 or (cu_seqlens is not None and seq_len <= num_states)  # about one token per sequence
    one_token = cu_seqlens is None and seq_len == 1
    engine.check(dk=dk, dv=v.shape[-1], chunk=chunk, recurrent=recurrent, one_token=one_token)
    shape = (num_states, num_heads, dk, v.shape[-1])
    init = jnp.zeros(shape, jnp.float32) if initial_state is None else _f32(initial_state)
    # The engine's own whole form (gated, or the delta rule of one sequence per row) takes q, k, v as
    # given (dtype, unscaled, grouped heads not repeated).
    own_form = engine.gated if beta is None else engine.delta if restarts is None and cu_seqlens is None else None
    whole = not recurrent and own_form is not None
    if whole:
        gates = dict(a_key=_f32(gk)) if beta is None else dict(beta=_f32(beta))
        xs = dict(q=q, k=k, v=v, a_head=_f32(g), **gates)
    else:
        if k.shape[2] < q.shape[2]:  # grouped-query: each key/value head serves a group of query heads
            kv_head = jnp.arange(num_heads) // (num_heads // k.shape[2])
            k, v = k[:, :, kv_head], v[:, :, kv_head]
        xs = dict(q=_f32(q) * scale, k=_f32(k), v=_f32(v))
        if beta is not None:
            restarts = None if restarts is None else _f32(restarts)[..., None]
            xs.update(beta=_f32(beta), a_head=_f32(g), restarts=restarts)
        elif recurrent:
            a_key = gk if g is None else g[..., None] if gk is None else gk + g[..., None]
            xs.update(a_key=_f32(a_key), a_value=_f32(gv))
        else:
            xs.update(a_head=_f32(g), a_key=_f32(gk))
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
        out, final = own_form(xs, init, layout, scale=scale)
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


# ---- the registered implementations (public signatures, canonical options) ----


def _scale(softmax_scale, query) -> float:
    return query.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)


def _chunk(cfg, default: int = DEFAULT_CHUNK) -> int:
    return getattr(cfg, "chunk_size", None) or default


def _decoding(query, cu_seqlens=None) -> bool:
    """One token per sequence (about): the recurrent form, without chunk padding."""
    return query.shape[1] == 1 or (cu_seqlens is not None and query.shape[1] < cu_seqlens.shape[0])


def _per_token_gamma(g_gamma, query):
    """A constant per-head log decay `[H]` or `[B, H]` as a per-token one `[B, S, H]`."""
    batch, seq_len, num_heads = query.shape[:3]
    return jnp.broadcast_to(jnp.broadcast_to(g_gamma, (batch, num_heads))[:, None, :], (batch, seq_len, num_heads))


def _add(a, b):
    return a if b is None else b if a is None else a + b


def _returned(out, state, return_state):
    return (out, state) if return_state else out


def _gated(
    query,
    key,
    value,
    g,
    g_gamma,
    gk,
    gv,
    initial_state,
    cu_seqlens,
    *,
    softmax_scale=None,
    reverse=False,
    return_state=False,
    cfg=None,
    engine=xla_engine,
):
    """The gated recurrence of the three entries below (arguments checked by them): chunked, or token by
    token for decoding and per-value-channel gates.

    `engine(cfg)` says where the sequential parts run (plain JAX here; GPU kernels on the Triton platform).
    """
    g = _add(_f32(g), None if g_gamma is None else _per_token_gamma(_f32(g_gamma), query))
    runner = engine(cfg)
    out, state = linear_attention(
        query,
        key,
        value,
        scale=_scale(softmax_scale, query),
        g=g,
        gk=gk,
        gv=gv,
        initial_state=initial_state,
        cu_seqlens=cu_seqlens,
        reverse=reverse,
        chunk_size=_chunk(cfg, runner.gated_chunk),
        recurrent=gv is not None or _decoding(query, cu_seqlens),
        engine=runner,
    )
    return _returned(out, state, return_state)


def recurrent_attention_xla(
    query, key, value, g=None, g_gamma=None, gk=None, gv=None, initial_state=None, cu_seqlens=None, **options
):
    """`recurrent_attention`; options (`softmax_scale`, `reverse`, `return_state`, `cfg`, `engine`) as `_gated`'s."""
    check_linear_call(
        query,
        key,
        value,
        grouped=True,
        gates={"g": (g, "head"), "gk": (gk, "dim_k"), "gv": (gv, "dim_v")},
        g_gamma=g_gamma,
        initial_state=initial_state,
        cu_seqlens=cu_seqlens,
    )
    return _gated(query, key, value, g, g_gamma, gk, gv, initial_state, cu_seqlens, **options)


def gla_attention_xla(query, key, value, g=None, g_gamma=None, initial_state=None, cu_seqlens=None, **options):
    """`gla_attention` (per-key-channel gate `g`); options as `_gated`'s."""
    check_linear_call(
        query,
        key,
        value,
        grouped=True,
        gates={"g": (g, "dim_k")},
        g_gamma=g_gamma,
        initial_state=initial_state,
        cu_seqlens=cu_seqlens,
    )
    return _gated(query, key, value, None, g_gamma, g, None, initial_state, cu_seqlens, **options)


def lightning_attention_xla(
    query, key, value, initial_state=None, cu_seqlens=None, *, layer_idx, num_layers, **options
):
    """`lightning_attention` (the layer's fixed per-head decay); options as `_gated`'s."""
    check_layer(layer_idx, num_layers)
    check_linear_call(query, key, value, grouped=True, initial_state=initial_state, cu_seqlens=cu_seqlens)
    g_gamma = jnp.asarray(lightning_gamma(query.shape[2], layer_idx, num_layers))
    return _gated(query, key, value, None, g_gamma, None, None, initial_state, cu_seqlens, **options)


def delta_rule_inputs(query, key, beta, decay, seg_ids, use_qk_l2norm: bool):
    """q, k (normalised if asked), beta, decay and restarts as the delta-rule core takes them.

    Padding tokens (negative segment id) get q = k = beta = decay = 0: they output zeros and leave
    the state alone.
    """
    q, k = (l2_normalize(query), l2_normalize(key)) if use_qk_l2norm else (query, key)
    if seg_ids is None:
        return q, k, beta, decay, None
    valid = (seg_ids >= 0)[:, :, None]
    q, k = jnp.where(valid[..., None], q, 0.0), jnp.where(valid[..., None], k, 0.0)
    beta = jnp.where(valid, beta, 0.0)
    decay = None if decay is None else jnp.where(valid, decay, 0.0)
    return q, k, beta, decay, segment_restarts(seg_ids)


def _delta_rule(
    query, key, value, beta, decay, seg_ids, initial_state, *, scale, use_qk_l2norm, recurrent, chunk, engine
):
    q, k, beta, decay, restarts = delta_rule_inputs(query, key, beta, decay, seg_ids, use_qk_l2norm)
    return linear_attention(
        q,
        k,
        value,
        scale=scale,
        g=decay,
        beta=beta,
        restarts=restarts,
        initial_state=initial_state,
        chunk_size=chunk,
        recurrent=recurrent or _decoding(query),
        engine=engine,
    )


def kernel_delta_attention_xla(
    query,
    key,
    value,
    beta,
    decay=None,
    initial_state=None,
    *,
    softmax_scale=None,
    chunk_size=DEFAULT_CHUNK,
    use_qk_l2norm=True,
    use_chunked=True,
    return_state=False,
    cfg=None,
    engine=xla_engine,
):
    """`kernel_delta_attention` in plain JAX: the delta rule with a per-head decay."""
    check_chunk_size("chunk_size", chunk_size)
    gates = {"beta": (beta, "head"), "decay": (decay, "head")}
    check_linear_call(query, key, value, grouped=False, gates=gates, initial_state=initial_state)
    out, state = _delta_rule(
        query,
        key,
        value,
        beta,
        decay,
        None,
        initial_state,
        scale=_scale(softmax_scale, query),
        use_qk_l2norm=use_qk_l2norm,
        recurrent=not use_chunked,
        chunk=_chunk(cfg, chunk_size),
        engine=engine(cfg),
    )
    return _returned(out, state, return_state)


def gated_delta_rule_xla(
    query,
    key,
    value,
    beta,
    decay=None,
    seg_ids=None,
    initial_state=None,
    *,
    autotune_chunk_candidates=None,
    use_qk_l2norm=True,
    use_chunked=True,
    return_state=False,
    cfg=None,
    engine=xla_engine,
):
    """`gated_delta_rule` in plain JAX; `seg_ids` packs sequences per row (see the reference)."""
    del autotune_chunk_candidates  # chooses the configs tried by autotuning, not the computation
    gates = {"beta": (beta, "head"), "decay": (decay, "head")}
    check_linear_call(query, key, value, grouped=False, gates=gates, initial_state=initial_state, seg_ids=seg_ids)
    runner = engine(cfg)
    out, state = _delta_rule(
        query,
        key,
        value,
        beta,
        decay,
        seg_ids,
        initial_state,
        scale=_scale(None, query),
        use_qk_l2norm=use_qk_l2norm,
        recurrent=not use_chunked,
        chunk=_chunk(cfg, runner.delta_chunk),
        engine=runner,
    )
    return _returned(out, state, return_state)
