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
from ejkernel.registry import Backend, Platform, implementations
from ejkernel.types import MaskInfo

IMPLEMENTATIONS = implementations(
    "attention",
    (Platform.XLA, Backend.ANY, "ejkernel.kernels._xla.attention:attention"),
)


@dataclasses.dataclass(frozen=True)
class AttentionConfig(KernelConfig):
    """Dense attention runs on XLA only; the config exists for uniformity.

    `attention` takes no `cfg`; this config is what the executor selects and caches. Values out of range
    are a ValueError when the config is built.

    Attributes:
        platform: Default `"auto"`. `"auto"` or `"xla"`.
        fwd_params: Default None. Unused.
        bwd_params: Default None. Unused.
        backend: Default `"any"`. The device kind the config is meant for (`"gpu"`, `"tpu"`, `"cpu"`); a call
            on another kind is refused (ValueError).

    Example:
        >>> from ejkernel.modules import AttentionConfig
        >>> AttentionConfig().platform
        'auto'
    """

    allowed_platforms = ("auto", "xla")


class Attention(Kernel):
    """The `Kernel` the executor runs for `attention` (op id `"attention"`): one XLA implementation.

    It takes `(query, key, value, bias, dropout_rng, softmax_aux)` with the options `attention` resolved
    (a dense `attention_mask`, the scale, 1-D sinks); call `attention` rather than this class.
    """

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
    """`(out, weights)`: softmax attention with its `[batch, heads, seq_q, seq_k]` weights materialised.

    Layout `[batch, seq, heads, dim]` for the tensors and `[batch, heads, seq_q, seq_k]` for the weights;
    grouped-query when `kv_heads < heads`. Same masking semantics as `flash_attention` (a `mask_info` is
    applied as a dense mask): a query row with no key to attend gets zero weights and a zero output. Both
    results are in `dtype` (bfloat16 by default, whatever the inputs' dtype), the softmax in
    `softmax_dtype` (default float32). XLA only; use `flash_attention` when the weights are not needed. The
    tensors are positional-only, the options keyword-only.

    Args:
        query: `[batch, seq_q, heads, dim]`, float.
        key: `[batch, seq_k, kv_heads, dim]` in query's dtype, with `heads % kv_heads == 0`.
        value: `[batch, seq_k, kv_heads, dim_v]` in query's dtype.
        bias: Default None. Float, broadcastable as `[1|batch, 1|heads, seq_q, seq_k]` (fewer dims get
            leading 1s); added to the logits after the soft cap.
        dropout_rng: Default None. A `jax.random` key, needed for dropout.
        softmax_aux: Default None. Float sink logits in the softmax denominator only, as in
            `flash_attention`: 1-D of length `heads`, one per head; other lengths, shared by all heads;
            `[heads, n]`, n per head; `[1, n]`, n shared. With sinks, a row's weights sum to less than 1.
        mask_info: Default None. A `MaskInfo`, applied as its dense `[1|batch, 1|heads, seq_q, seq_k]` mask.
        init_bias: Default None. A function of no arguments returning the bias, called when `bias` is None.
        deterministic: Default True. True turns dropout off whatever `dropout_prob` says.
        softmax_scale: Default None, meaning `dim ** -0.5`.
        logits_soft_cap: Default None. A positive `c`: logits become `c · tanh(logits / c)`.
        dtype: Default `jnp.bfloat16`. Float dtype of both results.
        softmax_dtype: Default None, meaning float32. Float dtype of the logits and the softmax.
        dropout_prob: Default 0.0. Rate in `[0, 1)`; with `deterministic=False`, dropout on the weights
            (the returned weights are the dropped-out ones).
        causal: Default False. Keep keys `k <= q` (positions from the start of both sequences).
        sliding_window: Default None. Non-negative `(left, right)` keeps keys `q - left <= k <= q + right`;
            an int `w` means `(w, w)`.

    Returns:
        A pair `(out, weights)`, out `[batch, seq_q, heads, dim_v]` and weights
        `[batch, heads, seq_q, seq_k]`, both in `dtype`.

    Raises:
        TypeError: a rank, dtype or size the annotations refuse (one line naming the argument; key and value
            share query's batch), query, key and value of different dtypes, a `dtype` or `softmax_dtype`
            that is not a float dtype, or a `sliding_window` that is neither an int nor a pair.
        ValueError: `heads` not a multiple of `kv_heads`; a `bias`, `softmax_aux` or `mask_info` mask of the
            wrong shape; a `dropout_prob` outside `[0, 1)`; dropout with `deterministic=False` but no
            `dropout_rng`; `logits_soft_cap <= 0`; a negative window.

    Example:
        >>> import jax, numpy as np
        >>> from ejkernel.modules import attention
        >>> rng = np.random.default_rng(0)
        >>> q = rng.standard_normal((2, 16, 4, 8), np.float32)
        >>> kv = rng.standard_normal((2, 16, 2, 8), np.float32)
        >>> out, weights = jax.jit(lambda q, kv: attention(q, kv, kv, causal=True))(q, kv)
        >>> out.shape, weights.shape, out.dtype
        ((2, 16, 4, 8), (2, 4, 16, 16), dtype(bfloat16))
        >>> bool(np.allclose(np.asarray(weights, np.float32).sum(-1), 1.0, atol=1e-2))
        True
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
