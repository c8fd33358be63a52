"""`unified_attention`: vLLM-style mixed prefill/decode attention over separate paged K and V caches."""

import dataclasses
from typing import Any, ClassVar

import jax
from jaxtyping import Array, Float, Int

from ejkernel.kernels._common.paged_attention import (
    check_float,
    check_heads,
    check_same_dtype,
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


@dataclasses.dataclass(frozen=True)
class UnifiedAttentionConfig(PagedAttentionConfig):
    """Tiling of `unified_attention` (see `PagedAttentionConfig`), with upstream's names for the split-key
    decode: `num_par_softmax_segments` (our `num_splits` where that is unset) and `seq_threshold_3d` (the
    call's own `seq_threshold_3d` wins); both steer GPU schedules only."""

    seq_threshold_3d: int | None = None
    num_par_softmax_segments: int | None = None

    knob_fields: ClassVar[tuple[str, ...]] = (
        *PagedAttentionConfig.knob_fields,
        "seq_threshold_3d",
        "num_par_softmax_segments",
    )


class UnifiedAttention(PagedAttentionKernel):
    op_id = "unified_attention"
    config_type = UnifiedAttentionConfig

    def axis_roles(self, args, kwargs):
        """Heads only: queries, caches, ALiBi slopes and sinks alike; tokens, blocks, the per-sequence
        tables and the query-query bias never."""
        inputs = {0: ("queries", ("tokens", "heads", "dim")), 1: ("key_cache", ("pages", None, "heads", "dim"))}
        inputs[2] = ("value_cache", ("pages", None, "heads", "dim"))
        for i, name in ((3, "kv_lens"), (4, "block_tables"), (5, "query_start_loc")):
            inputs[i] = (name, ("tokens",))
        inputs |= {
            6: ("alibi_slopes", ("heads",)),
            7: ("qq_bias", ("tokens", "tokens")),
            8: ("softmax_aux", ("heads",)),
        }
        return inputs, ("tokens", "heads", None)

    def busy_integers(self, args):
        queries, key_cache, _, lengths, tables = args[:5]
        lengths, tables, starts = busy_sequences(
            lengths.shape[0], tables.shape[1], key_cache.shape[1], key_cache.shape[0], queries.shape[0]
        )
        return {3: lengths, 4: tables, 5: starts}


@typechecked
def unified_attention(
    queries: Float[Array, "tokens num_heads head_dim"],
    key_cache: Float[Array, "num_blocks block_size num_kv_heads head_dim"],
    value_cache: Float[Array, "num_blocks block_size num_kv_heads head_dim"],
    kv_lens: Int[Array, " num_seqs"],
    block_tables: Int[Array, "num_seqs max_blocks"],
    query_start_loc: Int[Array, " num_seqs_plus_1"],
    alibi_slopes: Float[Array, " num_heads"] | None = None,
    qq_bias: Float[Array, "qq qq"] | None = None,
    softmax_aux: Float[Array, " num_heads"] | None = None,
    /,
    *,
    softmax_scale: float | None = None,
    causal: bool = True,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    seq_threshold_3d: int | None = None,
    platform: str | None = None,
    mesh: jax.sharding.Mesh | None = None,
    in_specs: Any = None,
    out_specs: Any = None,
    cfg: UnifiedAttentionConfig | None = None,
) -> Float[Array, "tokens num_heads head_dim"]:
    """Each sequence's packed queries over its pages, prefill chunks and decode steps in one call.

    Sequence `s` has queries `queries[query_start_loc[s] : query_start_loc[s + 1]]`, the last positions
    of its `kv_lens[s]` keys, in blocks `block_tables[s]` of the caches `[blocks, block_size, Hkv, D]`.
    With `causal` (the default) query position p sees keys `k <= p`; without, every key of its sequence.
    `softmax_scale` defaults to `D**-0.5`; the logits are soft capped (`c·tanh(s/c)`), then get the
    ALiBi bias `alibi_slopes[h] · (k - (kv_len - q_len))` and the query-query bias
    `qq_bias[j, k - (kv_len - q_len)]` (query j of its sequence, keys among its own queries), as in
    vLLM. `sliding_window=w` keeps keys `q - w + 1 <= k <= q`; `softmax_aux [Hq]` are per-head sink
    logits in the denominator only. `seq_threshold_3d` steers GPU schedules only.

    Index values: a bad one raises a ValueError outside `jit` (under `jit` too with `EJKERNEL_CHECKS=1`);
    otherwise under `jit`, `query_start_loc` is clamped to `[0, tokens]` and made non-decreasing (a
    running max; tokens of no sequence give zeros); `kv_lens` to `[0, max_blocks·block_size]` (queries
    it puts before position 0 see no key causally: zeros); and a `block_tables` entry it reaches
    outside `[0, num_blocks)` holds no keys (its positions are masked).
    """
    num_tokens, num_heads, head_dim = queries.shape
    num_blocks, block_size, num_kv_heads, _ = key_cache.shape
    num_seqs = kv_lens.shape[0]
    check_heads(num_heads, num_kv_heads)
    check_same_dtype("queries, key_cache and value_cache", queries, key_cache, value_cache)
    check_shape("value_cache", value_cache, key_cache.shape, "[blocks, block_size, kv_heads, head_dim]")
    check_tables("block_tables", block_tables, num_seqs)
    check_shape("query_start_loc", query_start_loc, (num_seqs + 1,), "[num_seqs + 1]")
    check_sinks("softmax_aux", softmax_aux, num_heads, per_head=True)
    for name, bias in (("alibi_slopes", alibi_slopes), ("qq_bias", qq_bias)):
        if bias is not None:
            check_float(name, bias)
    options = dict(
        softmax_scale=resolve_scale(softmax_scale, head_dim),
        causal=bool(causal),
        sliding_window=sliding_window,
        logits_soft_cap=check_soft_cap(logits_soft_cap),
    )
    last_positions_window(sliding_window)
    check_sequence_values(
        page_tables=block_tables,
        kv_len=kv_lens,
        page_size=block_size,
        num_pages=num_blocks,
        names={"page_tables": "block_tables", "kv_len": "kv_lens", "query_start_loc": "query_start_loc"},
        query_start_loc=query_start_loc,
        num_tokens=num_tokens,
    )
    return executor(
        UnifiedAttention(),
        queries,
        key_cache,
        value_cache,
        kv_lens,
        block_tables,
        query_start_loc,
        alibi_slopes,
        qq_bias,
        softmax_aux,
        platform=platform,
        cfg=cfg,
        mesh=mesh,
        in_specs=in_specs,
        out_specs=out_specs,
        **options,
    )
