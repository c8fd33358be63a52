"""`ragged_page_attention_v2`: packed ragged queries (prefill and decode mixed) over one interleaved K/V cache."""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from ejkernel.kernels._common.paged_attention import (
    check_heads,
    check_mask_value,
    check_sequence_values,
    check_shape,
    check_sinks,
    check_soft_cap,
    last_positions_window,
    resolve_scale,
)
from ejkernel.modules.operations._common import executor, typechecked
from ejkernel.modules.operations.page_attention import (
    PagedAttentionConfig,
    PagedAttentionKernel,
    busy_sequences,
    check_tables,
)
from ejkernel.ops.axis_roles import sink_roles


@dataclasses.dataclass(frozen=True)
class RaggedPageAttentionV2Config(PagedAttentionConfig):
    """Tiling of `ragged_page_attention_v2` (see `PagedAttentionConfig`)."""


class RaggedPageAttentionV2(PagedAttentionKernel):
    op_id = "ragged_page_attention_v2"
    config_type = RaggedPageAttentionV2Config

    def axis_roles(self, args, kwargs):
        """Heads only: the query heads and the pages' interleaved K/V heads alike (whole K/V pairs per
        shard); tokens, pages and the per-sequence tables never."""
        queries, sinks = args[0], args[6]
        inputs = {0: ("queries", ("tokens", "heads", "dim")), 1: ("kv_pages", ("pages", None, "heads/2", "dim"))}
        for i, name in ((2, "context_lens"), (3, "block_tables"), (4, "query_start_loc")):
            inputs[i] = (name, ("tokens",))
        if sinks is not None:
            inputs[6] = ("softmax_aux", sink_roles(sinks, queries.shape[1]))
        return inputs, ("tokens", "heads", None)

    def busy_integers(self, args):
        queries, kv_pages, lengths, tables = args[:4]
        num_seqs = lengths.shape[0]
        lengths, tables, starts = busy_sequences(
            num_seqs, tables.shape[1], kv_pages.shape[1], kv_pages.shape[0], queries.shape[0]
        )
        return {2: lengths, 3: tables, 4: starts, 5: jnp.full((1,), num_seqs, jnp.int32)}


@typechecked
def ragged_page_attention_v2(
    queries: Float[Array, "tokens num_heads head_dim"],
    kv_pages: Float[Array, "num_pages page_size combined_kv_heads head_dim"],
    context_lens: Int[Array, " num_seqs"],
    block_tables: Int[Array, "num_seqs pages_per_seq"],
    query_start_loc: Int[Array, " num_seqs_plus_1"],
    num_seqs: int | Int[Array, "..."],
    softmax_aux: Float[Array, " sinks"] | None = None,
    /,
    *,
    softmax_scale: float | None = None,
    logits_soft_cap: float | None = None,
    compute_dtype: Any = jnp.bfloat16,
    optimized: bool = False,
    sliding_window: int | None = None,
    mask_value: float | None = None,
    vmem_limit_bytes: int | None = None,
    platform: str | None = None,
    cfg: RaggedPageAttentionV2Config | None = None,
    mesh: jax.sharding.Mesh | None = None,
    in_specs: Any = None,
    out_specs: Any = None,
) -> Float[Array, "tokens num_heads head_dim"]:
    """Each sequence's queries, packed back to back, over the pages it owns.

    Sequence `s < num_seqs` has queries `queries[query_start_loc[s] : query_start_loc[s + 1]]`, the
    last positions of its `context_lens[s]` keys (causal), which live in pages `block_tables[s]` of
    `kv_pages [pages, page_size, 2 Hkv, D]`: combined head `2h` holds key head h, `2h + 1` its value.
    Sequences from `num_seqs` on are ignored (their query rows are 0). `compute_dtype` is the dtype of
    the matmul operands (float32 accumulation); `softmax_scale` defaults to `D**-0.5`; soft cap
    `c·tanh(s/c)`; `sliding_window=w` keeps keys `q - w + 1 <= k <= q`; `softmax_aux` are sink logits
    (length Hq: one per head, else shared) in the denominator only. Masked keys are excluded exactly
    (`mask_value` None or <= -1e4); `optimized` and `vmem_limit_bytes` steer schedules only.

    `num_seqs` (an int or a 1-element array) is a tensor argument: with `mesh=`, `in_specs` has a spec
    for it.

    Index values: a bad one raises a ValueError outside `jit` (under `jit` too with `EJKERNEL_CHECKS=1`);
    otherwise under `jit`, `num_seqs` is clamped to `[0, N]`; `query_start_loc` to `[0, tokens]` and
    made non-decreasing (a running max; tokens of no sequence give zeros); `context_lens` to
    `[0, pages_per_seq·page_size]` (queries it puts before position 0 give zeros); and a
    `block_tables` entry it reaches outside `[0, num_pages)` holds no keys (its positions are masked).
    """
    num_tokens, num_heads, head_dim = queries.shape
    num_pages, page_size, combined, _ = kv_pages.shape
    max_seqs = context_lens.shape[0]
    if combined % 2:
        raise ValueError(f"kv_pages must interleave K and V on its third axis (2 * kv_heads), got {combined}")
    check_heads(num_heads, combined // 2)
    if kv_pages.dtype != queries.dtype:
        raise TypeError(f"queries and kv_pages must share a dtype, got {queries.dtype} and {kv_pages.dtype}")
    check_tables("block_tables", block_tables, max_seqs)
    check_shape("query_start_loc", query_start_loc, (max_seqs + 1,), "[num_seqs + 1]")
    check_sinks("softmax_aux", softmax_aux, num_heads, per_head=False)
    check_mask_value(mask_value)
    if compute_dtype is not None and not jnp.issubdtype(jnp.dtype(compute_dtype), jnp.floating):
        raise TypeError(f"compute_dtype must be a float dtype or None (the queries' dtype), got {compute_dtype}")
    if jnp.size(num_seqs) != 1 or not jnp.issubdtype(jnp.result_type(num_seqs), jnp.integer):
        raise ValueError(f"num_seqs must be one integer (an int or a [1] array), got {num_seqs!r}")
    num_seqs = jnp.asarray(num_seqs, jnp.int32).reshape(1)
    options = dict(
        softmax_scale=resolve_scale(softmax_scale, head_dim),
        logits_soft_cap=check_soft_cap(logits_soft_cap),
        compute_dtype=None if compute_dtype is None else jnp.dtype(compute_dtype),
        sliding_window=sliding_window,
    )
    last_positions_window(sliding_window)
    check_sequence_values(
        page_tables=block_tables,
        kv_len=context_lens,
        page_size=page_size,
        num_pages=num_pages,
        names={
            "page_tables": "block_tables",
            "kv_len": "context_lens",
            "query_start_loc": "query_start_loc",
            "active": "num_seqs",
        },
        query_start_loc=query_start_loc,
        num_tokens=num_tokens,
        active=num_seqs,
    )
    return executor(
        RaggedPageAttentionV2(),
        queries,
        kv_pages,
        context_lens,
        block_tables,
        query_start_loc,
        num_seqs,
        softmax_aux,
        platform=platform,
        cfg=cfg,
        mesh=mesh,
        in_specs=in_specs,
        out_specs=out_specs,
        **options,
    )
