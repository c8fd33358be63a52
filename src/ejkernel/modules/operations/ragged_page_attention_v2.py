"""`ragged_page_attention_v2`: packed ragged queries (prefill and decode mixed) over one interleaved K/V cache."""

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Float32, Int, Int8

from ejkernel.kernels._common.paged_attention.arguments import (
    check_cache_dtypes,
    check_cache_scales,
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
from ejkernel.registry import Backend, Platform, implementations

IMPLEMENTATIONS = implementations(
    "ragged_page_attention_v2",
    (Platform.TRITON, Backend.GPU, "ejkernel.kernels._triton.paged_attention:ragged_page_attention_v2"),
    (Platform.XLA, Backend.ANY, "ejkernel.kernels._xla.paged_attention:ragged_page_attention_v2"),
)


@dataclasses.dataclass(frozen=True)
class RaggedPageAttentionV2Config(PagedAttentionConfig):
    """Tiling of `ragged_page_attention_v2`: the fields and rules of `PagedAttentionConfig`."""


class RaggedPageAttentionV2(PagedAttentionKernel):
    """`ragged_page_attention_v2` as the executor runs it (config `RaggedPageAttentionV2Config`)."""

    op_id = "ragged_page_attention_v2"
    scale_slots: ClassVar[dict[str, int]] = {"kv_cache_scales": 1}
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
        return self.with_scale_roles(inputs, kwargs), ("tokens", "heads", None)

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
    kv_pages: Float[Array, "num_pages page_size combined_kv_heads head_dim"]
    | Int8[Array, "num_pages page_size combined_kv_heads head_dim"],
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
    kv_cache_scales: Float32[Array, "num_pages page_size combined_kv_heads"] | None = None,
    platform: str | None = None,
    cfg: RaggedPageAttentionV2Config | None = None,
    mesh: jax.sharding.Mesh | None = None,
    in_specs: Any = None,
    out_specs: Any = None,
) -> Float[Array, "tokens num_heads head_dim"]:
    """Ragged paged attention: many sequences' packed queries (prefill and decode mixed) over one K/V cache.

    Sequence `s < num_seqs` owns the queries `queries[query_start_loc[s]:query_start_loc[s + 1]]`, the last
    positions of its `context_lens[s]` keys, and they attend causally over its pages `block_tables[s]` (in
    order). Sequences from `num_seqs` on are ignored; tokens no processed sequence owns give zeros. Query head
    `h` reads kv head `h // (num_heads // num_kv_heads)`. The matmul operands are cast to `compute_dtype`
    (bfloat16 by default, float32 inputs included), with float32 accumulation. Masked keys are excluded exactly.

    Cache layout: one cache `[num_pages, page_size, 2 * num_kv_heads, head_dim]` with K and V interleaved on
    the head axis: combined head `2h` is key head `h`, `2h + 1` its value. `unified_attention` takes separate
    K and V caches `[num_pages, page_size, num_kv_heads, head_dim]` instead, and `ragged_page_attention_v3`
    packs this interleaving into 32-bit words (5-D, head dim padded to 128).

    Quantised caches: a float8 cache (e4m3fn, e5m2) is read as stored and converted to the compute dtype in
    the kernel; with `kv_cache_scales` (float32 `[num_pages, page_size, 2 * num_kv_heads]`) each cached row is
    `code * scale`, applied in the kernel (the logits' key columns, the probabilities before `p @ v`), never as
    a dequantised copy. An int8 cache needs the scales.

    Index values: outside `jit`, a bad one raises a ValueError naming it: `num_seqs` outside `[0, max_seqs]`,
    `query_start_loc` not rising from 0 to at most `tokens`, a `context_lens` entry outside
    `[q_len, pages_per_seq * page_size]`, or a `block_tables` entry it reaches outside `[0, num_pages)` (only the
    first `num_seqs` sequences are checked). Under `jit` they are checked only with `EJKERNEL_CHECKS=1` (a bad
    one then stops the program with that message); otherwise `num_seqs` is clamped to `[0, max_seqs]`;
    `query_start_loc` to `[0, tokens]` and made non-decreasing (a running max; tokens of no sequence give
    zeros); `context_lens` to `[0, pages_per_seq * page_size]` (queries it puts before position 0 give zeros);
    and a `block_tables` entry it reaches outside `[0, num_pages)` holds no keys (its positions are masked).

    Sharding: with `mesh`, `in_specs` and `out_specs` (all three or none) the call runs under `shard_map`.
    Only heads may be split: the query heads and the cache's combined heads alike, in whole K/V pairs; never
    tokens, pages, head dims or the index arrays. `num_seqs` becomes a `[1]` array, a tensor argument with a
    spec of its own. `out_specs` must split the output's heads as the inputs do.

    Args:
        queries: `[tokens, num_heads, head_dim]` float. Every sequence's queries, packed back to back.
        kv_pages: `[num_pages, page_size, 2 * num_kv_heads, head_dim]`, `queries`' dtype or quantised. The K/V
            cache (above); `num_heads` must be a multiple of `num_kv_heads`.
        context_lens: `[max_seqs]` int. Each sequence's number of keys, its queries included.
        block_tables: `[max_seqs, pages_per_seq]` int. Row `s` lists sequence `s`'s pages in order; entries
            past `ceil(context_lens[s] / page_size)` are not read.
        query_start_loc: `[max_seqs + 1]` int. The sequences' query bounds in `queries`, rising from 0.
        num_seqs: `int` or a 1-element int array. How many sequences (the first) are processed.
        softmax_aux: `[sinks]` float or None, default None (positional only, as every tensor). Sink logits,
            in the softmax denominator only: `num_heads` of them give one per head; any other number is shared
            by every head.
        softmax_scale: `float | None`, default None (`head_dim ** -0.5`). Multiplies the logits `q·k`.
        logits_soft_cap: `float | None`, default None. A positive `c` caps the scaled logits as
            `c * tanh(s / c)`.
        compute_dtype: float dtype or None, default `jnp.bfloat16`. The matmul operands' dtype; None: the
            queries' dtype.
        kv_cache_scales: `[num_pages, page_size, 2 * num_kv_heads]` float32 or None, default None (keyword only,
            beyond upstream's surface). Per-token-head scales of a quantised `kv_pages` (above); required for int8.
        optimized: `bool`, default False. Upstream's TPU switch: ignored.
        sliding_window: `int | None`, default None. A positive `w` keeps keys `q - w + 1 <= k <= q`.
        mask_value: `float | None`, default None. None or any value `<= -1e4`: masked keys are excluded exactly
            either way.
        vmem_limit_bytes: `int | None`, default None. Upstream's TPU memory limit: ignored.
        platform: `str | None`, default None ("auto": Triton on a GPU where it serves the call, else XLA).
            "xla" or "triton" (GPU) asks for that one.
        cfg: `RaggedPageAttentionV2Config | None`, default None (chosen by the executor). The tiling; it never
            changes the result.
        mesh: `jax.sharding.Mesh | None`, default None. The mesh to shard the call over (see Sharding).
        in_specs: sequence of `PartitionSpec` or None, default None. One per tensor passed (`num_seqs`
            included), or one per positional slot.
        out_specs: `PartitionSpec | None`, default None. The output's spec.

    Returns:
        jax.Array: `[tokens, num_heads, head_dim]` in `queries`' dtype, each query's attention output.

    Raises:
        TypeError: an array of the wrong rank, kind (float or int) or size against the others (one line naming it), an
            unquantised `kv_pages` of another dtype than `queries`, an int8 one without scales, scales with a 16/32-bit
            cache or not float32, a `compute_dtype` that is not a float dtype, an option of the wrong type, or `cfg` not
            a `RaggedPageAttentionV2Config`.
        ValueError: an odd combined-head axis; `num_heads` not a multiple of `num_kv_heads`; `kv_cache_scales`
            not `kv_pages`' shape without its head dim;
            `query_start_loc` not `[max_seqs + 1]`; an empty `softmax_aux`; `num_seqs` not one integer;
            `softmax_scale` not finite; `logits_soft_cap` not positive; `sliding_window` below 1; `mask_value`
            above -1e4; a `platform` not listed, contradicting `cfg.platform` or with no implementation on
            this device; `mesh`, `in_specs`, `out_specs` not given together, or specs that split anything but
            the heads; outside `jit`, a bad index value.
        jax.errors.JaxRuntimeError: under `jit` with `EJKERNEL_CHECKS=1`, a bad index value, when the program
            runs (the message is the ValueError's).

    Example:
        >>> import jax.numpy as jnp
        >>> from ejkernel.modules import ragged_page_attention_v2
        >>> queries = jnp.ones((5, 4, 8))  # a 4-token prefill, then a 1-token decode; 4 heads, head_dim 8
        >>> kv_pages = jnp.ones((4, 16, 2 * 2, 8))  # 4 pages of 16 slots, 2 kv heads as K, V pairs
        >>> context_lens, query_start_loc = jnp.array([4, 20]), jnp.array([0, 4, 5])
        >>> block_tables = jnp.array([[0, 1], [2, 3]])
        >>> out = ragged_page_attention_v2(queries, kv_pages, context_lens, block_tables, query_start_loc, 2)
        >>> out.shape, out.dtype
        ((5, 4, 8), dtype('float32'))
    """
    num_tokens, num_heads, head_dim = queries.shape
    num_pages, page_size, combined, _ = kv_pages.shape
    max_seqs = context_lens.shape[0]
    if combined % 2:
        raise ValueError(f"kv_pages must interleave K and V on its third axis (2 * kv_heads), got {combined}")
    check_heads(num_heads, combined // 2)
    check_cache_dtypes("queries", queries, "kv_pages", kv_pages)
    check_cache_scales("kv_pages", kv_pages, "kv_cache_scales", kv_cache_scales)
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
    if kv_cache_scales is not None:
        options["kv_cache_scales"] = kv_cache_scales
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
