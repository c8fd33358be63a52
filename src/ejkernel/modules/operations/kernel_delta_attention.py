"""`kernel_delta_attention` (KDA): delta-rule linear attention with a per-head decay.

Per token: `h ← h·exp(decay_t)`, `u_t = beta_t (v_t − hᵀ k_t)`, `h ← h + k_t u_tᵀ`, `o_t = (scale · q_t)ᵀ h`,
with q and k L2-normalised along `Dk` by default (`ejkernel.reference.linear_attention.delta_rule_reference`).
"""

import dataclasses

from jaxtyping import Array, Float

from ejkernel.kernels._common.linear_attention.checks import check_chunk_size, check_linear_call
from ejkernel.modules.operations._common import executor, typechecked
from ejkernel.modules.operations._linear_attention import ChunkedConfig, ChunkedKernel
from ejkernel.ops import Invocation
from ejkernel.registry import Backend, Platform, implementations

IMPLEMENTATIONS = implementations(
    "kernel_delta_attention",
    (Platform.TRITON, Backend.GPU, "ejkernel.kernels._triton.linear_attention:kernel_delta_attention_triton"),
    (Platform.XLA, Backend.ANY, "ejkernel.kernels._xla.linear_attention:kernel_delta_attention"),
)


@dataclasses.dataclass(frozen=True)
class KernelDeltaAttentionConfig(ChunkedConfig):
    """How `kernel_delta_attention` runs: the fields of `ChunkedConfig` (platform, chunk size, Triton
    tiling); none changes the result beyond rounding. `chunk_size=None` takes the call's `chunk_size`."""


class KernelDeltaAttention(ChunkedKernel):
    """The executor's `Kernel` for `kernel_delta_attention`: config `KernelDeltaAttentionConfig`.

    Without a measured config the call's `chunk_size` is used; autotuning (policy `autotune`) times the
    default config and chunks of 32, 64 and 128 tokens, on forward and backward for a differentiated call.
    """

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
    """KDA: the delta rule with a per-head decay, over `[batch, seq, heads, dim]` inputs.

    Per batch row and head, with a float32 `[dim_k, dim_v]` state `h`, each token does `h ← h · exp(decay_t)`,
    `u_t = beta_t (v_t − hᵀ k_t)`, `h ← h + k_t u_tᵀ`, `o_t = (softmax_scale · q_t)ᵀ h`
    (`ejkernel.reference.linear_attention.delta_rule_reference`). With `use_qk_l2norm`, q and k are first
    divided by `sqrt(Σ x² + 1e-6)` along `dim_k`, in float32. A one-token call with an `initial_state` is a
    decode step.

    Args:
        query: `[batch, seq, heads, dim_k]`, any float dtype; key and value share it.
        key: `[batch, seq, heads, dim_k]` (as many heads as the query).
        value: `[batch, seq, heads, dim_v]`.
        beta: `[batch, seq, heads]` float, the write strength of each token.
        decay: `[batch, seq, heads]` float, a log decay per head and token (the factor is `exp(decay)`);
            None (default): none.
        initial_state: `[batch, heads, dim_k, dim_v]`, any float dtype, the state before the first token;
            None (default): zeros.
        softmax_scale: Multiplies the (normalised) query; None (default): `dim_k ** -0.5`.
        chunk_size: Tokens per chunk of the chunked form, a positive power of two (default 64); a config
            (given, cached or tuned) that names its own wins. It never changes the result beyond rounding.
        use_qk_l2norm: L2-normalise q and k as above (default True).
        use_chunked: True (default): the chunked form; False: the recurrent form (token by token, on XLA).
        return_state: Also return the final state (default False).
        platform: `"auto"`, `"xla"` or `"triton"`; None (default): `cfg.platform`, else auto.
        cfg: A `KernelDeltaAttentionConfig` fixing platform and tiling; None (default): the executor's
            choice (cache, tuning, else the call's `chunk_size`).

    Returns:
        `out [batch, seq, heads, dim_v]` in the query's dtype, or with `return_state` the pair
        `(out, final_state)`, `final_state` float32 `[batch, heads, dim_k, dim_v]`.

    Raises:
        TypeError: An argument of another rank, dtype kind or named size than above (one line naming it),
            query, key and value of different dtypes, or a `cfg` of another class.
        ValueError: `chunk_size` not a positive power of two; a `platform` that is unknown, has no
            implementation on this device or contradicts `cfg.platform`.
        NotImplementedError: `platform="triton"` for a call it does not serve: `use_chunked=False` over
            more than one token, or `dim_k` or `dim_v` not a power of two in [16, 256].

    Example:
        >>> import jax, numpy as np
        >>> from ejkernel.modules import kernel_delta_attention
        >>> rng = np.random.default_rng(0)
        >>> q, k = rng.standard_normal((2, 2, 8, 2, 16), np.float32)
        >>> v = rng.standard_normal((2, 8, 2, 4), np.float32)
        >>> beta = rng.random((2, 8, 2), np.float32)
        >>> decay = -rng.random((2, 8, 2), np.float32)
        >>> attend = lambda *a: kernel_delta_attention(*a, chunk_size=4, return_state=True)
        >>> out, state = jax.jit(attend)(q, k, v, beta, decay)
        >>> print(out.shape, out.dtype, state.shape, state.dtype)
        (2, 8, 2, 4) float32 (2, 2, 16, 4) float32
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
