"""`unified_attention`: vLLM-style mixed prefill/decode attention over separate paged K and V caches."""

import dataclasses
from typing import Any, ClassVar

import jax
from jaxtyping import Array, Float, Float32, Int, Int8

from ejkernel.kernels._common.checks import require_float
from ejkernel.kernels._common.paged_attention.arguments import (
    check_cache_dtypes,
    check_cache_scales,
    check_heads,
    check_scale_pair,
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
from ejkernel.registry import Backend, Platform, implementations

IMPLEMENTATIONS = implementations(
    "unified_attention",
    (Platform.PALLAS, Backend.GPU, "ejkernel.kernels._pallas.gpu.paged_attention:unified_attention"),
    (Platform.TRITON, Backend.GPU, "ejkernel.kernels._triton.paged_attention:unified_attention"),
    (Platform.XLA, Backend.ANY, "ejkernel.kernels._xla.paged_attention:unified_attention"),
)
"""Best first: on Hopper GPUs the prefill chunks in Mosaic GPU flash attention tiles beside the Triton core's
short-sequence pass (declining what `ragged_page_attention_v3`'s entry declines), then the Triton core, XLA."""


@dataclasses.dataclass(frozen=True)
class UnifiedAttentionConfig(PagedAttentionConfig):
    """Tiling of `unified_attention`: the fields and rules of `PagedAttentionConfig`, and upstream's two more.

    Attributes:
        seq_threshold_3d: `int | None`, default None. Upstream's threshold for its split-key decode: checked
            like the other knobs, then ignored.
        num_par_softmax_segments: `int | None`, default None. Upstream's name for the split count: read as
            `num_splits` where that is unset (GPU schedules only).
    """

    seq_threshold_3d: int | None = None
    num_par_softmax_segments: int | None = None

    knob_fields: ClassVar[tuple[str, ...]] = (
        *PagedAttentionConfig.knob_fields,
        "seq_threshold_3d",
        "num_par_softmax_segments",
    )


class UnifiedAttention(PagedAttentionKernel):
    """`unified_attention` as the executor runs it (config `UnifiedAttentionConfig`)."""

    op_id = "unified_attention"
    scale_slots: ClassVar[dict[str, int]] = {"key_cache_scales": 1, "value_cache_scales": 2}
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
        inputs = self.with_scale_roles(inputs, kwargs)
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
    key_cache: Float[Array, "num_blocks block_size num_kv_heads head_dim"]
    | Int8[Array, "num_blocks block_size num_kv_heads head_dim"],
    value_cache: Float[Array, "num_blocks block_size num_kv_heads head_dim"]
    | Int8[Array, "num_blocks block_size num_kv_heads head_dim"],
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
    key_cache_scales: Float32[Array, "num_blocks block_size num_kv_heads"] | None = None,
    value_cache_scales: Float32[Array, "num_blocks block_size num_kv_heads"] | None = None,
    platform: str | None = None,
    mesh: jax.sharding.Mesh | None = None,
    in_specs: Any = None,
    out_specs: Any = None,
    cfg: UnifiedAttentionConfig | None = None,
) -> Float[Array, "tokens num_heads head_dim"]:
    """vLLM-style unified attention: each sequence's packed queries over its pages, prefill and decode at once.

    Sequence `s` owns the queries `queries[query_start_loc[s]:query_start_loc[s + 1]]`, the last positions of
    its `kv_lens[s]` keys, which live in the blocks `block_tables[s]` lists, in order. With `causal` (the
    default) a query at position `p` sees the keys `k <= p`; without, every key of its sequence.
    `sliding_window=w` keeps keys `p - w + 1 <= k <= p`, with or without `causal`. The logits are
    `softmax_scale * q·k`, soft capped (`c * tanh(s / c)`), then plus the ALiBi bias
    `alibi_slopes[h] * (k - (kv_len - q_len))` and the query-query bias `qq_bias[j, k - (kv_len - q_len)]`
    (query `j` of its sequence, keys among its own queries; 0 outside the bias), as in vLLM. `softmax_aux` are
    per-head sink logits, in the denominator only. Query head `h` reads kv head
    `h // (num_heads // num_kv_heads)`; tokens no sequence owns give zeros.

    Cache layout: separate K and V caches `[num_blocks, block_size, num_kv_heads, head_dim]`, slots before
    heads as in `flash_attention`'s paged caches, where `page_attention` takes
    `[num_pages, num_kv_heads, page_size, head_dim]` and the ragged ops one interleaved K/V cache
    (`ragged_page_attention_v2` 4-D, `ragged_page_attention_v3` packed 5-D).

    Quantised caches: float8 caches (e4m3fn, e5m2) are read as stored and converted to `queries`'s dtype in the
    kernel; with `key_cache_scales` and `value_cache_scales` (float32, a cache's shape without its head dim)
    each cached row is `code * scale`, applied in the kernel (the logits' key columns, the probabilities
    before `p @ v`), never as a dequantised copy. int8 caches need the scales.

    Index values: outside `jit`, a bad one raises a ValueError naming it: `query_start_loc` not rising from 0
    to at most `tokens`, a `kv_lens` entry outside `[q_len, max_blocks * block_size]`, or a `block_tables`
    entry it reaches outside `[0, num_blocks)`. Under `jit` they are checked only with `EJKERNEL_CHECKS=1` (a
    bad one then stops the program with that message); otherwise `query_start_loc` is clamped to
    `[0, tokens]` and made non-decreasing (a running max; tokens of no sequence give zeros); `kv_lens` to
    `[0, max_blocks * block_size]` (with `causal`, queries it puts before position 0 see no key: zeros); and a
    `block_tables` entry it reaches outside `[0, num_blocks)` holds no keys (its positions are masked).

    Sharding: with `mesh`, `in_specs` and `out_specs` (all three or none) the call runs under `shard_map`.
    Only heads may be split: queries, caches, `alibi_slopes` and `softmax_aux` alike; never tokens, blocks,
    head dims, the index arrays or `qq_bias`. `out_specs` must split the output's heads as the inputs do.

    Args:
        queries: `[tokens, num_heads, head_dim]` float. Every sequence's queries, packed back to back.
        key_cache: `[num_blocks, block_size, num_kv_heads, head_dim]`, `queries`' dtype or quantised (above). The
            key blocks; `num_heads` must be a multiple of `num_kv_heads`.
        value_cache: `[num_blocks, block_size, num_kv_heads, head_dim]`, `key_cache`'s dtype. The value blocks.
        kv_lens: `[num_seqs]` int. Each sequence's number of keys, its queries included.
        block_tables: `[num_seqs, max_blocks]` int. Row `s` lists sequence `s`'s blocks in order; entries past
            `ceil(kv_lens[s] / block_size)` are not read.
        query_start_loc: `[num_seqs + 1]` int. The sequences' query bounds in `queries`, rising from 0.
        alibi_slopes: `[num_heads]` float or None, default None (positional only, as every tensor). Per-head
            ALiBi slopes (above).
        qq_bias: `[qq, qq]` float or None, default None (positional only). Bias between a sequence's own
            queries (above).
        softmax_aux: `[num_heads]` float or None, default None (positional only). Per-head sink logits.
        softmax_scale: `float | None`, default None (`head_dim ** -0.5`). Multiplies the logits `q·k`.
        causal: `bool`, default True. Whether a query sees only the keys up to its own position.
        sliding_window: `int | None`, default None. A positive `w` keeps keys `p - w + 1 <= k <= p`.
        logits_soft_cap: `float | None`, default None. A positive `c` caps the scaled logits as
            `c * tanh(s / c)`.
        seq_threshold_3d: `int | None`, default None. Upstream's GPU schedule threshold: ignored.
        key_cache_scales: `[num_blocks, block_size, num_kv_heads]` float32 or None, default None (keyword only, beyond
            upstream's surface). Per-token-head scales of a quantised `key_cache` (above); required for int8.
        value_cache_scales: `[num_blocks, block_size, num_kv_heads]` float32 or None, default None. The same for
            `value_cache`; given with `key_cache_scales`.
        platform: `str | None`, default None ("auto": Triton on a GPU where it serves the call, else XLA).
            "xla" or "triton" (GPU) asks for that one.
        mesh: `jax.sharding.Mesh | None`, default None. The mesh to shard the call over (see Sharding).
        in_specs: sequence of `PartitionSpec` or None, default None. One per tensor passed, or one per
            positional slot.
        out_specs: `PartitionSpec | None`, default None. The output's spec.
        cfg: `UnifiedAttentionConfig | None`, default None (chosen by the executor). The tiling; it never
            changes the result.

    Returns:
        jax.Array: `[tokens, num_heads, head_dim]` in `queries`' dtype, each query's attention output.

    Raises:
        TypeError: an array of the wrong rank, kind (float or int) or size against the others (one line
            naming it), caches of different dtypes (or unquantised ones of another than `queries`'), an int8
            cache without scales, scales with a 16/32-bit cache or not float32, an option of the wrong type, or `cfg`
            not a `UnifiedAttentionConfig`.
        ValueError: `num_heads` not a multiple of `num_kv_heads`; cache scales not of their cache's shape without
            its head dim, or only one of them; `query_start_loc` not `[num_seqs + 1]`;
            `softmax_scale` not finite; `logits_soft_cap` not positive; `sliding_window` below 1; a `platform`
            not listed, contradicting `cfg.platform` or with no implementation on this device; `mesh`,
            `in_specs`, `out_specs` not given together, or specs that split anything but the heads; outside
            `jit`, a bad index value.
        jax.errors.JaxRuntimeError: under `jit` with `EJKERNEL_CHECKS=1`, a bad index value, when the program
            runs (the message is the ValueError's).

    Example:
        >>> import jax.numpy as jnp
        >>> from ejkernel.modules import unified_attention
        >>> queries = jnp.ones((5, 4, 8))  # a 4-token prefill, then a 1-token decode; 4 heads, head_dim 8
        >>> key_cache = value_cache = jnp.ones((4, 16, 2, 8))  # 4 blocks of 16 slots, 2 kv heads
        >>> kv_lens, query_start_loc = jnp.array([4, 20]), jnp.array([0, 4, 5])
        >>> block_tables = jnp.array([[0, 1], [2, 3]])
        >>> out = unified_attention(queries, key_cache, value_cache, kv_lens, block_tables, query_start_loc)
        >>> out.shape, out.dtype
        ((5, 4, 8), dtype('float32'))
    """
    num_tokens, num_heads, head_dim = queries.shape
    num_blocks, block_size, num_kv_heads, _ = key_cache.shape
    num_seqs = kv_lens.shape[0]
    check_heads(num_heads, num_kv_heads)
    check_cache_dtypes("queries", queries, "key_cache and value_cache", key_cache, value_cache)
    check_scale_pair("key_cache_scales", key_cache_scales, "value_cache_scales", value_cache_scales)
    check_cache_scales("key_cache", key_cache, "key_cache_scales", key_cache_scales)
    check_cache_scales("value_cache", value_cache, "value_cache_scales", value_cache_scales)
    check_shape("value_cache", value_cache, key_cache.shape, "[blocks, block_size, kv_heads, head_dim]")
    check_tables("block_tables", block_tables, num_seqs)
    check_shape("query_start_loc", query_start_loc, (num_seqs + 1,), "[num_seqs + 1]")
    check_sinks("softmax_aux", softmax_aux, num_heads, per_head=True)
    for name, bias in (("alibi_slopes", alibi_slopes), ("qq_bias", qq_bias)):
        if bias is not None:
            require_float(name, bias)
    options = dict(
        softmax_scale=resolve_scale(softmax_scale, head_dim),
        causal=bool(causal),
        sliding_window=sliding_window,
        logits_soft_cap=check_soft_cap(logits_soft_cap),
    )
    if key_cache_scales is not None:
        options.update(key_cache_scales=key_cache_scales, value_cache_scales=value_cache_scales)
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
