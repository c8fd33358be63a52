"""`ragged_decode_attention`: one query per batch row over that row's keys `[start, end)` of dense K/V."""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from ejkernel.kernels._common.paged_attention import (
    check_heads,
    check_same_dtype,
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


@dataclasses.dataclass(frozen=True)
class RaggedDecodeAttentionConfig(PagedAttentionConfig):
    """Tiling of `ragged_decode_attention` (see `PagedAttentionConfig`)."""


class RaggedDecodeAttention(PagedAttentionKernel):
    op_id = "ragged_decode_attention"
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
        return inputs, (*rows[:-1], None)

    def busy_integers(self, args):
        key, _, end = args[1], args[3], args[4]
        return {4: jnp.full(end.shape, key.shape[1], end.dtype)}  # every sequence's whole key range


@typechecked
def ragged_decode_attention(
    query: Float[Array, "batch num_heads head_dim"] | Float[Array, "batch 1 num_heads head_dim"],
    key: Float[Array, "batch seq num_kv_heads head_dim"],
    value: Float[Array, "batch seq num_kv_heads head_dim"],
    sequence_start: Int[Array, " batch"],
    sequence_end: Int[Array, " batch"],
    softmax_aux: Float[Array, " sinks"] | None = None,
    /,
    *,
    softmax_scale: float | None = None,
    sliding_window: int | tuple[int, int] | None = None,
    logits_soft_cap: float | None = None,
    platform: str | None = None,
    cfg: RaggedDecodeAttentionConfig | None = None,
    mesh: jax.sharding.Mesh | None = None,
    in_specs: Any = None,
    out_specs: Any = None,
) -> Float[Array, "batch num_heads head_dim"] | Float[Array, "batch 1 num_heads head_dim"]:
    """Decode step of a padded batch: row b's query (at position `end - 1`) over keys `[start, end)`.

    `query` is `[B, Hq, D]` or `[B, 1, Hq, D]` (the output has its rank); `key`/`value` `[B, S, Hkv, D]`
    with Hq a multiple of Hkv. `sequence_start[b] <= sequence_end[b] <= S` bound the valid keys (an
    empty range gives 0). `softmax_scale` defaults to `D**-0.5`; soft cap `c·tanh(s/c)`;
    `sliding_window`: an int `w` keeps the last `w` positions up to the query's own, a pair
    `(left, right)` keeps `q - left <= k <= q + right`; `softmax_aux` are sink logits (length Hq: one
    per head, else shared) in the denominator only.

    Bounds: a bad one raises a ValueError outside `jit` (under `jit` too with `EJKERNEL_CHECKS=1`);
    otherwise under `jit`, `sequence_end` is clamped to `[0, S]` and `sequence_start` to
    `[0, sequence_end]` (the clamped end: an empty range gives 0).
    """
    batch, seq_len, num_kv_heads, head_dim = key.shape
    num_heads = query.shape[-2]
    check_heads(num_heads, num_kv_heads)
    check_same_dtype("query, key and value", query, key, value)
    check_sinks("softmax_aux", softmax_aux, num_heads, per_head=False)
    check_shape("sequence_end", sequence_end, (batch,), "[batch]")
    options = dict(
        softmax_scale=resolve_scale(softmax_scale, head_dim),
        sliding_window=tuple(sliding_window) if isinstance(sliding_window, tuple | list) else sliding_window,
        logits_soft_cap=check_soft_cap(logits_soft_cap),
    )
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
