"""`attention`: dense softmax attention that also returns its weights."""

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from ejkernel.kernels._common.attention import canonical_sinks, check_broadcastable
from ejkernel.modules.operations._attention_args import check_bias, check_qkv, parse_window
from ejkernel.modules.operations._common import executor, typechecked
from ejkernel.ops import Kernel, KernelConfig
from ejkernel.types import MaskInfo


@dataclasses.dataclass(frozen=True)
class AttentionConfig(KernelConfig):
    """Dense attention runs on XLA only; the config exists for uniformity."""

    allowed_platforms = ("auto", "xla")


class Attention(Kernel):
    op_id = "attention"
    config_type = AttentionConfig

    def platform_cfgs(self, platform, inv):
        yield AttentionConfig(platform=platform)


@typechecked
def attention(
    query: Float[Array, "batch seq_q heads dim"],
    key: Float[Array, "batch seq_k kv_heads dim"],
    value: Float[Array, "batch seq_k kv_heads dim_v"],
    bias: Float[Array, "..."] | None = None,
    dropout_rng: jax.Array | None = None,
    softmax_aux: Float[Array, "..."] | None = None,
    /,
    *,
    mask_info: MaskInfo | None = None,
    init_bias: Callable[[], Array] | None = None,
    deterministic: bool = True,
    softmax_scale: float | None = None,
    logits_soft_cap: float | None = None,
    dtype: Any = jnp.bfloat16,
    softmax_dtype: Any = None,
    dropout_prob: float = 0.0,
    causal: bool = False,
    sliding_window: int | tuple[int, int] | None = None,
) -> tuple[Float[Array, "batch seq_q heads dim_v"], Float[Array, "batch heads seq_q seq_k"]]:
    """`(out, weights)`: softmax attention with its `[B, H, Sq, Sk]` weights materialised.

    Same masking semantics as `flash_attention` (a `mask_info` is applied as a dense mask); dropout
    (`dropout_prob` with `deterministic=False`) draws from `dropout_rng`. Results are in `dtype`, the
    softmax in `softmax_dtype` (default float32). `softmax_aux` are sink logits as in `flash_attention`
    (1-D, or `[heads, n]` for n sinks per head).
    """
    check_qkv(query, key, value)
    batch, q_len, heads, dim = query.shape
    if bias is None and init_bias is not None:
        bias = init_bias()
    bias = check_bias(bias, batch, heads, q_len, key.shape[1])
    if not 0.0 <= dropout_prob < 1.0:
        raise ValueError(f"dropout_prob must be in [0, 1), got {dropout_prob}")
    if dropout_prob > 0.0 and not deterministic and dropout_rng is None:
        raise ValueError("dropout with deterministic=False needs dropout_rng")
    if logits_soft_cap is not None and not logits_soft_cap > 0:
        raise ValueError(f"logits_soft_cap must be positive, got {logits_soft_cap}")
    for name, wanted in (("dtype", dtype), ("softmax_dtype", softmax_dtype)):
        if wanted is not None and not jnp.issubdtype(wanted, jnp.floating):
            raise TypeError(f"{name} must be a floating-point dtype, got {jnp.dtype(wanted)}")
    mask = None if mask_info is None else mask_info.get_or_compute_attention_mask()
    if mask is not None:
        check_broadcastable("mask_info's attention mask", mask, batch, heads, q_len, key.shape[1], seq_broadcast=False)
    return executor(
        Attention(),
        query,
        key,
        value,
        bias,
        dropout_rng,
        canonical_sinks(softmax_aux, heads),
        attention_mask=mask,
        softmax_scale=float(dim**-0.5 if softmax_scale is None else softmax_scale),
        logits_soft_cap=logits_soft_cap,
        dtype=jnp.dtype(dtype),
        softmax_dtype=None if softmax_dtype is None else jnp.dtype(softmax_dtype),
        dropout_prob=float(dropout_prob),
        deterministic=bool(deterministic),
        causal=bool(causal),
        sliding_window=parse_window(sliding_window),
    )
