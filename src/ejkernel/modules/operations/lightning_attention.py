"""`lightning_attention`: linear attention with a fixed per-head decay that depends on the layer's depth.

Head h of layer `layer_idx` (of `num_layers`) decays its state by `exp(-(8 / H)·(1 - layer_idx / num_layers)·h)`
per token: `h_t = h_{t-1}·exp(γ_h) + k_t v_tᵀ`, `o_t = (scale · q_t)ᵀ h_t` (`ejkernel.reference.linear_attention`).
"""

import dataclasses

from jaxtyping import Array, Float, Int

from ejkernel.kernels._common.linear_attention.checks import check_layer, check_linear_call
from ejkernel.modules.operations._common import executor, typechecked
from ejkernel.modules.operations._linear_attention import ChunkedConfig, ChunkedKernel
from ejkernel.registry import Backend, Platform, implementations

IMPLEMENTATIONS = implementations(
    "lightning_attn",
    (Platform.TRITON, Backend.GPU, "ejkernel.kernels._triton.linear_attention:lightning_attention_triton"),
    (Platform.XLA, Backend.ANY, "ejkernel.kernels._xla.linear_attention:lightning_attention"),
)


@dataclasses.dataclass(frozen=True)
class LightningAttentionConfig(ChunkedConfig):
    """How `lightning_attention` runs: the fields of `ChunkedConfig` (platform, chunk size, Triton
    tiling); none changes the result beyond rounding."""


class LightningAttention(ChunkedKernel):
    """The executor's `Kernel` for `lightning_attention`: op id `"lightning_attn"`, config `LightningAttentionConfig`.

    Autotuning (policy `autotune`) times the default config and chunks of 32, 64 and 128 tokens, on forward
    and backward for a differentiated call (`ChunkedKernel`).
    """

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
    """Lightning attention: linear attention with a fixed decay per head, set by the layer's depth.

    Head h (of `heads`) decays its `[dim_k, dim_v]` state by `exp(γ_h)` per token, with
    `γ_h = -(8 / heads) · (1 - layer_idx / num_layers) · h`: `h_t = h_{t-1} · exp(γ_h) + k_t v_tᵀ`,
    `o_t = (softmax_scale · q_t)ᵀ h_t` (`ejkernel.reference.linear_attention`). Head 0 never decays; the
    first layer decays most. The state is float32. Key/value may have fewer heads than the query: query
    head h reads key/value head `h // (heads // kv_heads)`.

    With `cu_seqlens` the batch is 1 and holds `num_seqs` sequences back to back, each with its own
    recurrence and state. Bounds must rise from 0, never decreasing, to `seq` exactly: a ValueError outside
    `jit` (under it too with `EJKERNEL_CHECKS=1`); otherwise, under `jit`, each bound is clamped into
    `[previous bound, seq]`, the first to 0 and the last to `seq` (a sequence past `seq` is empty), and the
    result is that of the clamped bounds.

    Args:
        query: `[batch, seq, heads, dim_k]`, any float dtype; key and value share it.
        key: `[batch, seq, kv_heads, dim_k]`; `kv_heads` divides `heads`.
        value: `[batch, seq, kv_heads, dim_v]`.
        initial_state: `[batch, heads, dim_k, dim_v]` (`[num_seqs, heads, dim_k, dim_v]` with `cu_seqlens`),
            any float dtype, the state before the first token; None (default): zeros.
        cu_seqlens: `[num_seqs + 1]` integer bounds of packed sequences, as above; None (default): each batch
            row is one sequence.
        layer_idx: int, required, `0 <= layer_idx < num_layers`: this layer's index.
        num_layers: int, required, positive: the model's number of layers.
        softmax_scale: Multiplies the query; None (default): `dim_k ** -0.5`.
        reverse: Run each sequence from its last token to its first (default False); the state then enters
            at the last token and leaves after the first.
        return_state: Also return the final state (default False).
        platform: `"auto"`, `"xla"` or `"triton"`; None (default): `cfg.platform`, else auto.
        cfg: A `LightningAttentionConfig` fixing platform and tiling; None (default): the executor's choice
            (cache, tuning or heuristics).

    Returns:
        `out [batch, seq, heads, dim_v]` in the query's dtype, or with `return_state` the pair
        `(out, final_state)`, `final_state` float32 and shaped like `initial_state`.

    Raises:
        TypeError: An argument of another rank, dtype kind, named size or type than above (one line naming
            it), query, key and value of different dtypes, or a `cfg` of another class.
        ValueError: `layer_idx` or `num_layers` out of range; `heads` not a multiple of `kv_heads`;
            `initial_state` or `cu_seqlens` of a wrong shape; `cu_seqlens` with `batch` > 1 or with bad bounds
            (rule above); a `platform` that is unknown, has no implementation on this device or contradicts
            `cfg.platform`.
        NotImplementedError: `platform="triton"` for a call it does not serve: `dim_k` or `dim_v` not a power
            of two in [16, 256], or packed decoding (fewer than `num_seqs + 1` tokens), which runs on XLA.

    Example:
        >>> import jax, numpy as np
        >>> from ejkernel.modules import lightning_attention
        >>> rng = np.random.default_rng(0)
        >>> q, k, v = rng.standard_normal((3, 1, 10, 2, 8), np.float32)
        >>> cu_seqlens = np.array([0, 4, 10])  # two sequences: tokens 0-3 and 4-9
        >>> attend = lambda *a: lightning_attention(*a, layer_idx=1, num_layers=4, return_state=True)
        >>> out, state = jax.jit(attend)(q, k, v, None, cu_seqlens)
        >>> print(out.shape, state.shape, state.dtype)
        (1, 10, 2, 8) (2, 2, 8, 8) float32
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
