"""`kernel_delta_attention` (KDA): delta-rule linear attention with a per-head decay.

Per token: `h ← h·exp(decay_t)`, `u_t = beta_t (v_t − hᵀ k_t)`, `h ← h + k_t u_tᵀ`, `o_t = (scale · q_t)ᵀ h`,
with q and k L2-normalised along `Dk` by default (`ejkernel.reference.linear_attention.delta_rule_reference`).
"""

import dataclasses

from jaxtyping import Array, Float

from ejkernel.kernels._common.linear_attention import ChunkedConfig, ChunkedKernel, check_chunk_size, check_linear_call
from ejkernel.modules.operations._common import executor, typechecked
from ejkernel.ops import Invocation


@dataclasses.dataclass(frozen=True)
class KernelDeltaAttentionConfig(ChunkedConfig):
    """The tiling of the chunked form (see `ChunkedConfig`); `chunk_size` None takes the call's `chunk_size`."""


class KernelDeltaAttention(ChunkedKernel):
    op_id = "kernel_delta_attention"
    config_type = KernelDeltaAttentionConfig

    def heuristic_cfg(self, inv: Invocation) -> KernelDeltaAttentionConfig:
        return KernelDeltaAttentionConfig(platform=inv.platform, chunk_size=inv.kwargs["chunk_size"])


@typechecked
def kernel_delta_attention(
    query: Float[Array, "batch seq heads dim_k"],
    key: Float[Array, "batch seq heads dim_k"],
    value: Float[Array, "batch seq heads dim_v"],
    beta: Float[Array, "batch seq heads"],
    decay: Float[Array, "batch seq heads"] | None = None,
    initial_state: Float[Array, "batch heads dim_k dim_v"] | None = None,
    /,
    *,
    softmax_scale: float | None = None,
    chunk_size: int = 64,
    use_qk_l2norm: bool = True,
    use_chunked: bool = True,
    return_state: bool = False,
    platform: str | None = None,
    cfg: KernelDeltaAttentionConfig | None = None,
):
    """The delta rule over `[batch, seq, heads, dim]` inputs; `beta` is the per-token write strength.

    `decay [B,S,H]` is a per-head log decay (the factor is `exp(decay)`), optional.
    `initial_state [B,H,Dk,Dv]` seeds the state. `chunk_size` (a power of two) sets the chunks of the
    chunked form; `use_chunked=False` runs the XLA recurrent form (token by token). A one-token call
    with an `initial_state` is a decode step. Returns `out [B,S,H,Dv]`, or `(out, final_state float32)`
    with `return_state`. `softmax_scale` defaults to `Dk ** -0.5`.
    """
    check_chunk_size("chunk_size", chunk_size)
    dk, _ = check_linear_call(
        query,
        key,
        value,
        grouped=False,
        gates={"beta": (beta, "head"), "decay": (decay, "head")},
        initial_state=initial_state,
    )
    return executor(
        KernelDeltaAttention(),
        query,
        key,
        value,
        beta,
        decay,
        initial_state,
        softmax_scale=dk**-0.5 if softmax_scale is None else float(softmax_scale),
        chunk_size=chunk_size,
        use_qk_l2norm=bool(use_qk_l2norm),
        use_chunked=bool(use_chunked),
        return_state=bool(return_state),
        platform=platform,
        cfg=cfg,
    )
