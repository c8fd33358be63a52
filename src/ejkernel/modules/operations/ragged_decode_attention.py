"""`ragged_decode_attention`: one query per batch row over that row's keys `[start, end)` of dense K/V."""

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Float32, Int, Int8

from ejkernel.kernels._common.paged_attention.arguments import (
    check_cache_dtypes,
    check_cache_scales,
    check_heads,
    check_scale_pair,
    check_sequence_values,
    check_shape,
    check_sinks,
    check_soft_cap,
    decode_window,
    resolve_scale,
)
from ejkernel.modules.operations._common import executor, typechecked
from ejkernel.modules.operations.page_attention import PagedAttentionConfig, PagedAttentionKernel
from ejkernel.ops.axis_roles import sink_roles
from ejkernel.registry import Backend, Platform, implementations

IMPLEMENTATIONS = implementations(
    "ragged_decode_attention",
    (Platform.TRITON, Backend.GPU, "ejkernel.kernels._triton.paged_attention:ragged_decode_attention"),
    (Platform.XLA, Backend.ANY, "ejkernel.kernels._xla.paged_attention:ragged_decode_attention"),
)


@dataclasses.dataclass(frozen=True)
class RaggedDecodeAttentionConfig(PagedAttentionConfig):
    """Tiling of `ragged_decode_attention`: the fields and rules of `PagedAttentionConfig`."""


class RaggedDecodeAttention(PagedAttentionKernel):
    """`ragged_decode_attention` as the executor runs it (config `RaggedDecodeAttentionConfig`)."""

    op_id = "ragged_decode_attention"
    scale_slots: ClassVar[dict[str, int]] = {"key_cache_scales": 1, "value_cache_scales": 2}
    config_type = RaggedDecodeAttentionConfig

    def axis_roles(self, args, kwargs):
        """Rows `[B]` of every tensor split alike (the bounds too), heads alike, never the keys' sequence."""
        query, sinks = args[0], args[5]
        rows = ("batch", "heads", "dim") if query.ndim == 3 else ("batch", None, "heads", "dim")
        inputs = {0: ("query", rows), 1: ("key", ("batch", "seq", "heads", "dim"))}
        inputs |= {2: ("value", ("batch", "seq", "heads", "dim")), 3: ("sequence_start", ("batch",))}
        inputs[4] = ("sequence_end", ("batch",))
        if sinks is not None:
            inputs[5] = ("softmax_aux", sink_roles(sinks, query.shape[-2]))
        inputs = self.with_scale_roles(inputs, kwargs)
        return inputs, (*rows[:-1], None)

    def busy_integers(self, args):
        key, _, end = args[1], args[3], args[4]
        return {4: jnp.full(end.shape, key.shape[1], end.dtype)}  # every sequence's whole key range


@typechecked
def ragged_decode_attention(
    query: Float[Array, "batch num_heads head_dim"] | Float[Array, "batch 1 num_heads head_dim"],
    key: Float[Array, "batch seq num_kv_heads head_dim"] | Int8[Array, "batch seq num_kv_heads head_dim"],
    value: Float[Array, "batch seq num_kv_heads head_dim"] | Int8[Array, "batch seq num_kv_heads head_dim"],
    sequence_start: Int[Array, " batch"],
    sequence_end: Int[Array, " batch"],
    softmax_aux: Float[Array, " sinks"] | None = None,
    /,
    *,
    softmax_scale: float | None = None,
    sliding_window: int | tuple[int, int] | None = None,
    logits_soft_cap: float | None = None,
    key_cache_scales: Float32[Array, "batch seq num_kv_heads"] | None = None,
    value_cache_scales: Float32[Array, "batch seq num_kv_heads"] | None = None,
    platform: str | None = None,
    cfg: RaggedDecodeAttentionConfig | None = None,
    mesh: jax.sharding.Mesh | None = None,
    in_specs: Any = None,
    out_specs: Any = None,
) -> Float[Array, "batch num_heads head_dim"] | Float[Array, "batch 1 num_heads head_dim"]:
    """Decode step of a padded batch over dense K/V: row `b`'s query over its keys `[start, end)`.

    Row `b`'s query sits at position `sequence_end[b] - 1` and attends to the keys
    `sequence_start[b] <= k < sequence_end[b]` of its row; an empty range gives zeros, and so do no rows or
    `seq == 0`. Query head `h` reads kv head `h // (num_heads // num_kv_heads)`. `sliding_window`: an int `w`
    keeps the last `w` positions up to the query's own; a pair `(left, right)` keeps `q - left <= k <= q + right`
    (no key lies past the query, so `right` changes nothing). The sinks `softmax_aux` join the softmax
    denominator only.

    Layout: not paged. `key` and `value` are dense `[batch, seq, num_kv_heads, head_dim]` arrays, one row per
    sequence, where the paged ops read their keys through page tables.

    Quantised caches: float8 caches (e4m3fn, e5m2) are read as stored and converted to `query`'s dtype in the
    kernel; with `key_cache_scales` and `value_cache_scales` (float32, a cache's shape without its head dim)
    each cached row is `code * scale`, applied in the kernel (the logits' key columns, the probabilities
    before `p @ v`), never as a dequantised copy. int8 caches need the scales.

    Bounds: outside `jit`, a `sequence_end` outside `[0, seq]` or a `sequence_start` outside
    `[0, sequence_end]` raises a ValueError naming it. Under `jit` they are checked only with
    `EJKERNEL_CHECKS=1` (a bad one then stops the program with that message); otherwise `sequence_end` is
    clamped to `[0, seq]` and `sequence_start` to `[0, sequence_end]` (the clamped end: an empty range gives
    zeros).

    Sharding: with `mesh`, `in_specs` and `out_specs` (all three or none) the call runs under `shard_map`.
    Rows and heads may be split: every tensor's batch axis alike (the bounds too) and the heads alike; never
    the keys' sequence axis or the head dims.

    Args:
        query: `[batch, num_heads, head_dim]` or `[batch, 1, num_heads, head_dim]` float. Each row's query; the
            output has its rank.
        key: `[batch, seq, num_kv_heads, head_dim]`, `query`'s dtype or quantised (above). The keys; `num_heads` must be
            a multiple of `num_kv_heads`.
        value: `[batch, seq, num_kv_heads, head_dim]`, `key`'s dtype. The values.
        sequence_start: `[batch]` int. Each row's first valid key.
        sequence_end: `[batch]` int. The end (exclusive) of each row's valid keys.
        softmax_aux: `[sinks]` float or None, default None (positional only, as every tensor). Sink logits,
            in the softmax denominator only: `num_heads` of them give one per head; any other number is shared
            by every head.
        softmax_scale: `float | None`, default None (`head_dim ** -0.5`). Multiplies the logits `q·k`.
        sliding_window: `int | tuple[int, int] | None`, default None. A positive int, or a pair of ints >= 0
            (above).
        logits_soft_cap: `float | None`, default None. A positive `c` caps the scaled logits as
            `c * tanh(s / c)`.
        key_cache_scales: `[batch, seq, num_kv_heads]` float32 or None, default None (keyword only, beyond upstream's
            surface). Per-token-head scales of a quantised `key` (above); required for int8.
        value_cache_scales: `[batch, seq, num_kv_heads]` float32 or None, default None. The same for `value`; given
            with `key_cache_scales`.
        platform: `str | None`, default None ("auto": Triton on a GPU where it serves the call, else XLA).
            "xla" or "triton" (GPU) asks for that one.
        cfg: `RaggedDecodeAttentionConfig | None`, default None (chosen by the executor). The tiling; it never
            changes the result.
        mesh: `jax.sharding.Mesh | None`, default None. The mesh to shard the call over (see Sharding).
        in_specs: sequence of `PartitionSpec` or None, default None. One per tensor passed, or one per
            positional slot.
        out_specs: `PartitionSpec | None`, default None. The output's spec.

    Returns:
        jax.Array: the shape of `query` (`[batch, num_heads, head_dim]` or `[batch, 1, num_heads, head_dim]`),
        in its dtype: each row's attention output.

    Raises:
        TypeError: an array of the wrong rank, kind (float or int) or size against the others (one line naming it),
            `key` and `value` of different dtypes (or unquantised ones of another than `query`'s), an int8 `key` without
            scales, scales with a 16/32-bit cache or not float32, an option of the wrong type, or `cfg` not a
            `RaggedDecodeAttentionConfig`.
        ValueError: `num_heads` not a multiple of `num_kv_heads`; cache scales not of their cache's shape without
            its head dim, or only one of them; an empty `softmax_aux`; `softmax_scale` not
            finite; `logits_soft_cap` not positive; `sliding_window` neither a positive int nor a pair of
            ints >= 0; a `platform` not listed, contradicting `cfg.platform` or with no implementation on this
            device; `mesh`, `in_specs`, `out_specs` not given together, or specs that split a sequence axis or
            the head dims; outside `jit`, a bad bound.
        jax.errors.JaxRuntimeError: under `jit` with `EJKERNEL_CHECKS=1`, a bad bound, when the program runs
            (the message is the ValueError's).

    Example:
        >>> import jax.numpy as jnp
        >>> from ejkernel.modules import ragged_decode_attention
        >>> query = jnp.ones((2, 4, 8))  # 2 rows, 4 query heads, head_dim 8
        >>> key = value = jnp.ones((2, 16, 2, 8))  # 16 key slots per row, 2 kv heads
        >>> out = ragged_decode_attention(query, key, value, jnp.array([0, 3]), jnp.array([10, 3]))
        >>> out.shape, out.dtype, bool((out[1] == 0).all())  # row 1's range is empty
        ((2, 4, 8), dtype('float32'), True)
    """
    batch, seq_len, num_kv_heads, head_dim = key.shape
    num_heads = query.shape[-2]
    check_heads(num_heads, num_kv_heads)
    check_cache_dtypes("query", query, "key and value", key, value)
    check_scale_pair("key_cache_scales", key_cache_scales, "value_cache_scales", value_cache_scales)
    check_cache_scales("key", key, "key_cache_scales", key_cache_scales)
    check_cache_scales("value", value, "value_cache_scales", value_cache_scales)
    check_sinks("softmax_aux", softmax_aux, num_heads, per_head=False)
    check_shape("sequence_end", sequence_end, (batch,), "[batch]")
    options = dict(
        softmax_scale=resolve_scale(softmax_scale, head_dim),
        sliding_window=tuple(sliding_window) if isinstance(sliding_window, tuple | list) else sliding_window,
        logits_soft_cap=check_soft_cap(logits_soft_cap),
    )
    if key_cache_scales is not None:
        options.update(key_cache_scales=key_cache_scales, value_cache_scales=value_cache_scales)
    decode_window(sliding_window)
    check_sequence_values(
        page_tables=np.zeros((batch, 1), np.int32),
        kv_len=sequence_end,
        page_size=max(seq_len, 1),
        kv_capacity=seq_len,
        num_pages=batch,
        names={"page_tables": "rows", "kv_len": "sequence_end", "kv_start": "sequence_start"},
        kv_start=sequence_start,
        queries_fit=False,
    )
    if query.size == 0 or seq_len == 0:  # no rows or no keys: every output is 0
        return jnp.zeros(query.shape, query.dtype)
    return executor(
        RaggedDecodeAttention(),
        query,
        key,
        value,
        sequence_start,
        sequence_end,
        softmax_aux,
        platform=platform,
        cfg=cfg,
        mesh=mesh,
        in_specs=in_specs,
        out_specs=out_specs,
        **options,
    )
