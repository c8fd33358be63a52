"""`recurrent_attention`: the general gated linear recurrence, with per-head, per-key and per-value gates.

`h_t = h_{t-1} ⊙ (exp(g_t) · exp(g_gamma) · exp(gk_t)[:, None] · exp(gv_t)[None, :]) + k_t v_tᵀ`,
`o_t = (scale · q_t)ᵀ h_t` (`ejkernel.reference.linear_attention`); every gate is optional.
"""

import dataclasses

from jaxtyping import Array, Float, Int

from ejkernel.kernels._common.linear_attention import ChunkedConfig, ChunkedKernel, check_linear_call
from ejkernel.modules.operations._common import executor, typechecked


@dataclasses.dataclass(frozen=True)
class RecurrentAttentionConfig(ChunkedConfig):
    """The tiling of the chunked form (see `ChunkedConfig`)."""


class RecurrentAttention(ChunkedKernel):
    op_id = "recurrent"
    config_type = RecurrentAttentionConfig


@typechecked
def recurrent_attention(
    query: Float[Array, "batch seq heads dim_k"],
    key: Float[Array, "batch seq kv_heads dim_k"],
    value: Float[Array, "batch seq kv_heads dim_v"],
    g: Float[Array, "batch seq heads"] | Float[Array, "batch seq heads dim_k"] | None = None,
    g_gamma: Float[Array, "*gamma_batch heads"] | None = None,
    gk: Float[Array, "batch seq heads dim_k"] | None = None,
    gv: Float[Array, "batch seq heads dim_v"] | None = None,
    initial_state: Float[Array, "num_states heads dim_k dim_v"] | None = None,
    cu_seqlens: Int[Array, " num_seqs_plus_1"] | None = None,
    /,
    *,
    softmax_scale: float | None = None,
    reverse: bool = False,
    return_state: bool = False,
    platform: str | None = None,
    cfg: RecurrentAttentionConfig | None = None,
):
    """Gated linear recurrence over `[batch, seq, heads, dim]` inputs.

    Log decays (the factor is `exp(gate)`): `g [B,S,H]` per head, `g_gamma [H]` (or `[B,H]`) constant
    per head, `gk [B,S,H,Dk]` per key channel, `gv [B,S,H,Dv]` per value channel. Key/value may have
    fewer heads than the query (grouped). `initial_state [B,H,Dk,Dv]` seeds the state; with
    `cu_seqlens [N+1]` the batch is 1 and holds N packed sequences (states `[N,H,Dk,Dv]`). `reverse`
    runs from the last token to the first. Returns `out [B,S,H,Dv]`, or `(out, final_state float32)`
    with `return_state`. `softmax_scale` defaults to `Dk ** -0.5`. A `g` per key channel,
    `[B,S,H,Dk]` (upstream's shape), is a key gate: it joins `gk` (log decays add).

    `cu_seqlens` must rise from 0 without decreasing to S (a ValueError outside `jit`); under `jit` each
    bound is clamped into `[previous bound, S]`, the first to 0 and the last to S (a sequence past S is
    empty), and the result is that of the clamped bounds.
    """
    if g is not None and g.ndim == 4:
        g, gk = None, g if gk is None else gk + g
    dk, _ = check_linear_call(
        query,
        key,
        value,
        grouped=True,
        gates={"g": (g, "head"), "gk": (gk, "dim_k"), "gv": (gv, "dim_v")},
        g_gamma=g_gamma,
        initial_state=initial_state,
        cu_seqlens=cu_seqlens,
    )
    return executor(
        RecurrentAttention(),
        query,
        key,
        value,
        g,
        g_gamma,
        gk,
        gv,
        initial_state,
        cu_seqlens,
        softmax_scale=dk**-0.5 if softmax_scale is None else float(softmax_scale),
        reverse=bool(reverse),
        return_state=bool(return_state),
        platform=platform,
        cfg=cfg,
    )
