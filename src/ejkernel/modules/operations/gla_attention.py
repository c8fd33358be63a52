"""`gla_attention`: gated linear attention, a per-key-channel decaying state instead of a softmax over keys.

Per batch row and head: `h_t = h_{t-1} ⊙ exp(g_t + g_gamma)[:, None] + k_t v_tᵀ`, `o_t = (scale · q_t)ᵀ h_t`
(`ejkernel.reference.linear_attention`). Time and memory are linear in the sequence length.
"""

import dataclasses

from jaxtyping import Array, Float, Int

from ejkernel.kernels._common.linear_attention import ChunkedConfig, ChunkedKernel, check_linear_call
from ejkernel.modules.operations._common import executor, typechecked


@dataclasses.dataclass(frozen=True)
class GLAttentionConfig(ChunkedConfig):
    """The tiling of the chunked form (see `ChunkedConfig`)."""


class GLAttention(ChunkedKernel):
    op_id = "gla"
    config_type = GLAttentionConfig


@typechecked
def gla_attention(
    query: Float[Array, "batch seq heads dim_k"],
    key: Float[Array, "batch seq kv_heads dim_k"],
    value: Float[Array, "batch seq kv_heads dim_v"],
    g: Float[Array, "batch seq heads dim_k"] | None = None,
    g_gamma: Float[Array, "*gamma_batch heads"] | None = None,
    initial_state: Float[Array, "num_states heads dim_k dim_v"] | None = None,
    cu_seqlens: Int[Array, " num_seqs_plus_1"] | None = None,
    /,
    *,
    softmax_scale: float | None = None,
    reverse: bool = False,
    return_state: bool = False,
    platform: str | None = None,
    cfg: GLAttentionConfig | None = None,
):
    """Gated linear attention over `[batch, seq, heads, dim]` inputs.

    `g [B,S,H,Dk]` is the per-key-channel log decay (the factor is `exp(g)`), `g_gamma [H]` (or
    `[B,H]`) a constant log decay per head; both optional. Key/value may have fewer heads than the
    query (grouped). `initial_state [B,H,Dk,Dv]` seeds the state; with `cu_seqlens [N+1]` the batch is
    1, holds N sequences back to back, each with its own recurrence and state `[N,H,Dk,Dv]`.
    `reverse` runs from the last token to the first. Returns `out [B,S,H,Dv]`, or
    `(out, final_state float32)` with `return_state`. `softmax_scale` defaults to `Dk ** -0.5`.

    `cu_seqlens` must rise from 0 without decreasing to S (a ValueError outside `jit`); under `jit` each
    bound is clamped into `[previous bound, S]`, the first to 0 and the last to S (a sequence past S is
    empty), and the result is that of the clamped bounds.
    """
    dk, _ = check_linear_call(
        query,
        key,
        value,
        grouped=True,
        gates={"g": (g, "dim_k")},
        g_gamma=g_gamma,
        initial_state=initial_state,
        cu_seqlens=cu_seqlens,
    )
    return executor(
        GLAttention(),
        query,
        key,
        value,
        g,
        g_gamma,
        initial_state,
        cu_seqlens,
        softmax_scale=dk**-0.5 if softmax_scale is None else float(softmax_scale),
        reverse=bool(reverse),
        return_state=bool(return_state),
        platform=platform,
        cfg=cfg,
    )
