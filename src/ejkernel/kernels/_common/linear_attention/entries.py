"""The five linear-attention ops as every platform serves them: public signatures, canonical options.

Each checks its arguments and resolves the scale (unless its public function has: `ejkernel.checked_calls`), and
maps its gates onto `driver.linear_attention`, whose sequential parts run on `engine(cfg, **engine_options)`: the
plain-JAX engine by default (the xla platform serves these entries as they are), the Triton platform's engine there.
"""

from __future__ import annotations

import jax.numpy as jnp

from ejkernel.checked_calls import arguments_checked
from ejkernel.kernels._common.linear_attention.checks import (
    check_chunk_size,
    check_layer,
    check_linear_call,
    config_chunk,
)
from ejkernel.kernels._common.linear_attention.driver import DEFAULT_CHUNK, linear_attention, to_f32, xla_engine
from ejkernel.kernels._common.linear_attention.inputs import delta_rule_inputs, lightning_gamma


def resolve_scale(softmax_scale, query) -> float:
    """The query's scale: `softmax_scale`, else `dim_k ** -0.5` (the public functions and the entries)."""
    return query.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)


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


def _gated_form(
    query,
    g,
    g_gamma,
    gk,
    gv,
    initial_state,
    cu_seqlens,
    *,
    scale: float,
    reverse=False,
    cfg=None,
    engine=xla_engine,
    **engine_options,
) -> dict:
    """`linear_attention`'s keywords for the gated recurrence of the three entries below (arguments checked, scale
    resolved): chunked, or token by token for decoding and per-value-channel gates. The entries call the driver
    themselves, so that no frame of this family's own stands between an entry and the driver.

    `engine(cfg, **engine_options)` says where the sequential parts run (plain JAX by default; GPU kernels on the
    Triton platform, whose engine takes `interpret=`).
    """
    runner = engine(cfg, **engine_options)
    return dict(
        scale=scale,
        g=_add(to_f32(g), None if g_gamma is None else _per_token_gamma(to_f32(g_gamma), query)),
        gk=gk,
        gv=gv,
        initial_state=initial_state,
        cu_seqlens=cu_seqlens,
        reverse=reverse,
        chunk_size=config_chunk(cfg, runner.gated_chunk),
        recurrent=gv is not None or _decoding(query, cu_seqlens),
        engine=runner,
    )


def recurrent_attention(
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
    return_state=False,
    **options,
):
    """`recurrent_attention`; options (`reverse`, `cfg`, `engine` and its options) as `_gated_form`'s."""
    if not arguments_checked("recurrent"):
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
        softmax_scale = resolve_scale(softmax_scale, query)
    form = _gated_form(query, g, g_gamma, gk, gv, initial_state, cu_seqlens, scale=softmax_scale, **options)
    return _returned(*linear_attention(query, key, value, **form), return_state)


def check_gla_call(query, key, value, g, g_gamma, initial_state, cu_seqlens):
    """`check_linear_call` with GLA's rules: grouped key/value heads, a per-key-channel gate `g`."""
    gates = {"g": (g, "dim_k")}
    return check_linear_call(
        query, key, value, grouped=True, gates=gates, g_gamma=g_gamma, initial_state=initial_state,
        cu_seqlens=cu_seqlens,
    )  # fmt: skip


def gla_attention(
    query,
    key,
    value,
    g=None,
    g_gamma=None,
    initial_state=None,
    cu_seqlens=None,
    *,
    softmax_scale=None,
    return_state=False,
    **options,
):
    """`gla_attention` (per-key-channel gate `g`); options as `_gated_form`'s."""
    if not arguments_checked("gla"):
        check_gla_call(query, key, value, g, g_gamma, initial_state, cu_seqlens)
        softmax_scale = resolve_scale(softmax_scale, query)
    form = _gated_form(query, None, g_gamma, g, None, initial_state, cu_seqlens, scale=softmax_scale, **options)
    return _returned(*linear_attention(query, key, value, **form), return_state)


def lightning_attention(
    query,
    key,
    value,
    initial_state=None,
    cu_seqlens=None,
    *,
    layer_idx,
    num_layers,
    softmax_scale=None,
    return_state=False,
    **options,
):
    """`lightning_attention` (the layer's fixed per-head decay); options as `_gated_form`'s."""
    if not arguments_checked("lightning_attn"):
        check_layer(layer_idx, num_layers)
        check_linear_call(query, key, value, grouped=True, initial_state=initial_state, cu_seqlens=cu_seqlens)
        softmax_scale = resolve_scale(softmax_scale, query)
    g_gamma = jnp.asarray(lightning_gamma(query.shape[2], layer_idx, num_layers))
    form = _gated_form(query, None, g_gamma, None, None, initial_state, cu_seqlens, scale=softmax_scale, **options)
    return _returned(*linear_attention(query, key, value, **form), return_state)


def _delta_rule(
    query, key, value, beta, decay, seg_ids, initial_state, *, scale, use_qk_l2norm, recurrent, chunk, engine
):
    q, k, beta, decay, restarts = delta_rule_inputs(query, key, beta, decay, seg_ids)
    return linear_attention(
        q,
        k,
        value,
        scale=scale,
        l2norm=use_qk_l2norm,
        g=decay,
        beta=beta,
        restarts=restarts,
        initial_state=initial_state,
        chunk_size=chunk,
        recurrent=recurrent or _decoding(query),
        engine=engine,
    )


def kernel_delta_attention(
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
    **engine_options,
):
    """`kernel_delta_attention`: the delta rule with a per-head decay; options as `_gated_form`'s (`cfg`, `engine`
    and its options)."""
    if not arguments_checked("kernel_delta_attention"):
        check_chunk_size("chunk_size", chunk_size)
        gates = {"beta": (beta, "head"), "decay": (decay, "head")}
        check_linear_call(query, key, value, grouped=False, gates=gates, initial_state=initial_state)
        softmax_scale = resolve_scale(softmax_scale, query)
    out, state = _delta_rule(
        query,
        key,
        value,
        beta,
        decay,
        None,
        initial_state,
        scale=softmax_scale,
        use_qk_l2norm=use_qk_l2norm,
        recurrent=not use_chunked,
        chunk=config_chunk(cfg, chunk_size),
        engine=engine(cfg, **engine_options),
    )
    return _returned(out, state, return_state)


def gated_delta_rule(
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
    **engine_options,
):
    """`gated_delta_rule`; `seg_ids` packs sequences per row (see the reference); `engine` and its
    options as `_gated_form`'s."""
    del autotune_chunk_candidates  # chooses the configs tried by autotuning, not the computation
    if not arguments_checked("gated_delta_rule"):
        gates = {"beta": (beta, "head"), "decay": (decay, "head")}
        check_linear_call(query, key, value, grouped=False, gates=gates, initial_state=initial_state, seg_ids=seg_ids)
    runner = engine(cfg, **engine_options)
    out, state = _delta_rule(
        query,
        key,
        value,
        beta,
        decay,
        seg_ids,
        initial_state,
        scale=resolve_scale(None, query),
        use_qk_l2norm=use_qk_l2norm,
        recurrent=not use_chunked,
        chunk=config_chunk(cfg, runner.delta_chunk),
        engine=runner,
    )
    return _returned(out, state, return_state)
