"""`lightning_attention`: linear attention with a fixed per-head decay that depends on the layer's depth.

Head h of layer `layer_idx` (of `num_layers`) decays its state by `exp(-(8 / H)·(1 - layer_idx / num_layers)·h)`
per token: `h_t = h_{t-1}·exp(γ_h) + k_t v_tᵀ`, `o_t = (scale · q_t)ᵀ h_t` (`ejkernel.reference.linear_attention`).
"""

import dataclasses

from jaxtyping import Array, Float, Int

from ejkernel.kernels._common.linear_attention import (
    ChunkedConfig,
    ChunkedKernel,
    check_layer,
    check_linear_call,
)
from ejkernel.modules.operations._common import executor, typechecked


@dataclasses.dataclass(frozen=True)
class LightningAttentionConfig(ChunkedConfig):
    """The tiling of the chunked form (see `ChunkedConfig`)."""


class LightningAttention(ChunkedKernel):
    op_id = "lightning_attn"
    config_type = LightningAttentionConfig


@typechecked
def lightning_attention(
    query: Float[Array, "batch seq heads dim_k"],
    key: Float[Array, "batch seq kv_heads dim_k"],
    value: Float[Array, "batch seq kv_heads dim_v"],
    initial_state: Float[Array, "num_states heads dim_k dim_v"] | None = None,
    cu_seqlens: Int[Array, " num_seqs_plus_1"] | None = None,
    /,
    *,
    layer_idx: int,
    num_layers: int,
    softmax_scale: float | None = None,
    reverse: bool = False,
    return_state: bool = False,
    platform: str | None = None,
    cfg: LightningAttentionConfig | None = None,
):
    """Lightning attention over `[batch, seq, heads, dim]` inputs (0 <= layer_idx < num_layers).

    Key/value may have fewer heads than the query (grouped). `initial_state [B,H,Dk,Dv]` seeds the
    state; with `cu_seqlens [N+1]` the batch is 1 and holds N packed sequences (states `[N,H,Dk,Dv]`).
    `reverse` runs from the last token to the first. Returns `out [B,S,H,Dv]`, or
    `(out, final_state float32)` with `return_state`. `softmax_scale` defaults to `Dk ** -0.5`.

    `cu_seqlens` must rise from 0 without decreasing to S (a ValueError outside `jit`); under `jit` each
    bound is clamped into `[previous bound, S]`, the first to 0 and the last to S (a sequence past S is
    empty), and the result is that of the clamped bounds.
    """
    check_layer(layer_idx, num_layers)
    dk, _ = check_linear_call(query, key, value, grouped=True, initial_state=initial_state, cu_seqlens=cu_seqlens)
    return executor(
        LightningAttention(),
        query,
        key,
        value,
        initial_state,
        cu_seqlens,
        layer_idx=layer_idx,
        num_layers=num_layers,
        softmax_scale=dk**-0.5 if softmax_scale is None else float(softmax_scale),
        reverse=bool(reverse),
        return_state=bool(return_state),
        platform=platform,
        cfg=cfg,
    )
