"""`scaled_dot_product_attention`: `jax.nn.dot_product_attention`'s semantics, routed to cuDNN or XLA, except that
a query row that sees no key gives zeros (jax.nn: the mean of V), as in `flash_attention` and `attention`."""

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import PartitionSpec
from jaxtyping import Array, Float, Int

from ejkernel.kernels._common.attention import check_broadcastable
from ejkernel.modules.operations._attention_args import (
    attention_roles,
    check_bias,
    check_qkv,
    dense_mask_spec,
    parse_window,
)
from ejkernel.modules.operations._common import executor, require_lengths, typechecked
from ejkernel.ops import Kernel, KernelConfig
from ejkernel.ops.executor import specs_by_slot
from ejkernel.registry import Backend, Platform, implementations
from ejkernel.types import MaskInfo

IMPLEMENTATIONS = implementations(
    "scaled_dot_product_attention",
    (Platform.CUDA, Backend.GPU, "ejkernel.kernels._cuda.scaled_dot_product_attention:sdpa_cudnn"),
    (Platform.XLA, Backend.ANY, "ejkernel.kernels._xla.scaled_dot_product_attention:sdpa_xla"),
)


@dataclasses.dataclass(frozen=True)
class ScaledDotProductAttentionConfig(KernelConfig):
    """Only the platform: both routes are fused library kernels with nothing to tile.

    `scaled_dot_product_attention` takes no `cfg`; this config is what the executor selects and caches.
    Values out of range are a ValueError when the config is built.

    Attributes:
        platform: Default `"auto"`. `"auto"`, `"xla"` or `"cuda"` (cuDNN).
        fwd_params: Default None. Unused.
        bwd_params: Default None. Unused.
        backend: Default `"any"`. The device kind the config is meant for (`"gpu"`, `"tpu"`, `"cpu"`); a call
            on another kind is refused (ValueError).

    Example:
        >>> from ejkernel.modules import ScaledDotProductAttentionConfig
        >>> ScaledDotProductAttentionConfig(platform="cuda").platform
        'cuda'
    """

    allowed_platforms = ("auto", "xla", "cuda")


class ScaledDotProductAttention(Kernel):
    """The `Kernel` the executor runs for `scaled_dot_product_attention` (op id `"scaled_dot_product_attention"`).

    It takes `(query, key, value, bias)` with `jax.nn.dot_product_attention`'s keyword options (`mask`,
    `scale`, `is_causal`, `query_seq_lengths`, `key_value_seq_lengths`, `local_window_size`); call
    `scaled_dot_product_attention` rather than this class. Implementations: cuDNN (`"cuda"`, GPU), then XLA.
    """

    op_id = "scaled_dot_product_attention"
    config_type = ScaledDotProductAttentionConfig

    def axis_roles(self, args, kwargs):
        """As flash attention's, and neither sequence split where positions matter: key/value rows always,
        query rows with a causal or windowed mask or query lengths (shard-local positions would restart at 0)."""
        inputs, out = attention_roles(args, sinks_at=None)
        positional = (
            kwargs.get("is_causal")
            or kwargs.get("local_window_size") is not None
            or kwargs.get("query_seq_lengths") is not None
        )
        inputs[0] = ("query", ("batch", "seq" if positional else "queries", "heads", "dim"))
        for i, name in ((1, "key"), (2, "value")):
            inputs[i] = (name, ("batch", "seq", "heads", "dim"))
        return inputs, out

    def platform_cfgs(self, platform, inv):
        yield ScaledDotProductAttentionConfig(platform=platform)

    def kwarg_specs(self, kwargs, in_specs):
        """The dense mask follows the query and key rows; per-row lengths follow the batch."""
        mask = kwargs.get("mask")
        specs = {} if mask is None else {"mask": dense_mask_spec(mask, in_specs[0], in_specs[1])}
        batch = (tuple(in_specs[0]) or (None,))[0]
        for name in ("query_seq_lengths", "key_value_seq_lengths"):
            if kwargs.get(name) is not None:
                specs[name] = PartitionSpec(batch)
        return specs


@typechecked
def scaled_dot_product_attention(
    query: Float[Array, "batch seq_q heads dim"],
    key: Float[Array, "batch seq_k kv_heads dim"],
    value: Float[Array, "batch seq_k kv_heads dim_v"],
    bias: Float[Array, "..."] | None = None,
    cum_seqlens_q: Int[Array, " batch"] | None = None,
    cum_seqlens_k: Int[Array, " batch"] | None = None,
    /,
    *,
    mask_info: MaskInfo | None = None,
    init_bias: Callable[[], Array] | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    sliding_window: int | tuple[int, int] | None = None,
    platform: str | None = None,
    mesh: jax.sharding.Mesh | None = None,
    in_specs: Any = None,
    out_specs: Any = None,
) -> Float[Array, "batch seq_q heads dim_v"]:
    """Attention as `jax.nn.dot_product_attention` defines it, on cuDNN where it can run, else XLA.

    Layout `[batch, seq, heads, dim]` (grouped-query when `kv_heads < heads`). One difference from jax.nn:
    a query row that sees no key gives zeros, and nothing flows back from it: a row past its query length,
    a row whose keys are all masked (a query segment no key shares, a window past the keys) and a row whose
    key length is 0 alike. jax.nn gives the mean of V for the second kind; zeros are the rule of
    `flash_attention` and `attention`, and what a row attending nothing means. No `cfg`: there is nothing
    to tune. The tensors are positional-only, the options keyword-only.

    Args:
        query: `[batch, seq_q, heads, dim]`, float (cuDNN: bfloat16 or float16).
        key: `[batch, seq_k, kv_heads, dim]` in query's dtype, with `heads % kv_heads == 0`.
        value: `[batch, seq_k, kv_heads, dim]` in query's dtype; its head dim must be the query's.
        bias: Default None. Float, broadcastable as `[1|batch, 1|heads, seq_q, seq_k]` (fewer dims get
            leading 1s); added to the scaled logits.
        cum_seqlens_q: Default None. Int `[batch]`: each row's number of real queries (jax.nn's
            `query_seq_lengths`): lengths, not cumulative offsets, whatever the name says. Values outside
            `[0, seq_q]` are a ValueError outside `jit` (under `jit` too with `EJKERNEL_CHECKS=1`); otherwise,
            under `jit`, they act as clamped into that range.
        cum_seqlens_k: Default None. Int `[batch]`: each row's number of real keys (jax.nn's
            `key_value_seq_lengths`), with the same rules against `seq_k`.
        mask_info: Default None. A `MaskInfo`, applied as its dense `[1|batch, 1|heads, seq_q, seq_k]` mask
            (every transform included). cuDNN declines a dense mask: XLA serves such calls.
        init_bias: Default None. A function of no arguments returning the bias, called when `bias` is None.
        softmax_scale: Default None, meaning `dim ** -0.5`.
        causal: Default False. Keep keys `k <= q` (positions from the start of both sequences).
        sliding_window: Default None. Non-negative `(left, right)` keeps keys `q - left <= k <= q + right`
            (jax.nn's `local_window_size`); an int `w` means `(w, w)`.
        platform: Default None, meaning `"auto"`: cuDNN where it accepts the call, else XLA. One of `"auto"`,
            `"xla"`, `"cuda"`.
        mesh: Default None. A `jax.sharding.Mesh`: with `in_specs` and `out_specs` (the three or none) the
            call runs under `jax.shard_map`.
        in_specs: Default None. A `PartitionSpec` per tensor passed (or per positional slot); the lengths
            follow the batch, a dense mask the query and key rows. The key/value sequence may not be split,
            nor the query sequence under `causal`, a window or query lengths.
        out_specs: Default None. The output's `PartitionSpec`.

    Returns:
        `[batch, seq_q, heads, dim]` in query's dtype, with zeros for every query row that sees no key.

    Raises:
        TypeError: a rank, dtype or size the annotations refuse (one line naming the argument; key and value
            share query's batch), query, key and value of different dtypes, or a `sliding_window` that is
            neither an int nor a pair.
        ValueError: `heads` not a multiple of `kv_heads`; value's head dim not the query's; a `bias` or
            `mask_info` mask of the wrong shape; lengths outside their range (see above); a negative window;
            a platform that is unknown or has no implementation on this device; `mesh`, `in_specs`,
            `out_specs` not given together, or specs that split a sequence as forbidden above.
        NotImplementedError: `platform="cuda"` for a call cuDNN declines (a dtype other than bfloat16 or
            float16, a dense mask, a window reaching right of the query without `causal`).

    Example:
        >>> import jax, numpy as np
        >>> from ejkernel.modules import scaled_dot_product_attention
        >>> rng = np.random.default_rng(0)
        >>> q = rng.standard_normal((2, 16, 4, 8), np.float32)
        >>> kv = rng.standard_normal((2, 16, 2, 8), np.float32)
        >>> kv_lengths = np.array([16, 0], np.int32)  # row 1 has no key
        >>> attend = jax.jit(lambda q, kv, n: scaled_dot_product_attention(q, kv, kv, None, None, n, causal=True))
        >>> out = attend(q, kv, kv_lengths)
        >>> out.shape, bool((np.asarray(out)[1] == 0).all())
        ((2, 16, 4, 8), True)
    """
    check_qkv(query, key, value)
    batch, q_len, heads, dim = query.shape
    kv_len = key.shape[1]
    if value.shape[-1] != dim:
        raise ValueError(f"value's head dim must equal the query's ({dim}) here, got value shape {value.shape}")
    if bias is None and init_bias is not None:
        bias = init_bias()
    bias = check_bias(bias, batch, heads, q_len, kv_len)
    for name, lengths, length in (("cum_seqlens_q", cum_seqlens_q, q_len), ("cum_seqlens_k", cum_seqlens_k, kv_len)):
        if lengths is not None:
            require_lengths(name, lengths, batch, length)
    mask = None if mask_info is None else mask_info.get_or_compute_attention_mask()
    if mask is not None:
        check_broadcastable("mask_info's attention mask", mask, batch, heads, q_len, kv_len, seq_broadcast=False)
    options = dict(
        scale=softmax_scale,
        is_causal=bool(causal),
        query_seq_lengths=cum_seqlens_q,
        key_value_seq_lengths=cum_seqlens_k,
        local_window_size=parse_window(sliding_window),
    )
    if in_specs is not None:  # one per tensor passed or per slot of the six; the lengths follow the batch
        slots = (query, key, value, bias, cum_seqlens_q, cum_seqlens_k)
        by_slot = specs_by_slot("scaled_dot_product_attention", slots, in_specs, mesh)
        in_specs = tuple(by_slot[i] for i in range(4) if i in by_slot)
    return executor(
        ScaledDotProductAttention(),
        query,
        key,
        value,
        bias,
        mask=mask,
        platform=platform,
        mesh=mesh,
        in_specs=in_specs,
        out_specs=out_specs,
        **options,
    )
