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
from ejkernel.types import MaskInfo


@dataclasses.dataclass(frozen=True)
class ScaledDotProductAttentionConfig(KernelConfig):
    """Only the platform: both routes are fused library kernels with nothing to tile."""

    allowed_platforms = ("auto", "xla", "cuda")


class ScaledDotProductAttention(Kernel):
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

    `cum_seqlens_q/k [B]` are the valid lengths of each row (jax.nn's `query_seq_lengths` /
    `key_value_seq_lengths`). `init_bias()` supplies the bias when `bias` is None. A `mask_info` is
    applied as a dense mask. No `cfg`: there is nothing to tune.

    A query row that sees no key gives zeros, and nothing flows back from it: a row past its query
    length, a row whose keys are all masked (a query segment no key shares, a window past the keys)
    and a row whose key length is 0 alike. jax.nn gives the mean of V for the second kind; zeros are
    the rule of `flash_attention` and `attention`, and what a row attending nothing means.
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
