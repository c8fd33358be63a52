"""`prefill_page_attention`: a chunk of one sequence's last queries over its pages, causally."""

import dataclasses

import numpy as np
from jaxtyping import Array, Float, Float32, Int, Int8

from ejkernel.kernels._common.paged_attention.arguments import (
    DEFAULT_MASK_VALUE,
    check_cache_dtypes,
    check_cache_scales,
    check_heads,
    check_mask_value,
    check_scale_pair,
    check_sequence_values,
    check_shape,
    check_soft_cap,
    last_positions_window,
    resolve_scale,
)
from ejkernel.modules.operations._common import executor, typechecked
from ejkernel.modules.operations.page_attention import PagedAttentionConfig, PagedAttentionKernel, busy_sequences
from ejkernel.registry import Backend, Platform, implementations

IMPLEMENTATIONS = implementations(
    "prefill_page_attention",
    (Platform.TRITON, Backend.GPU, "ejkernel.kernels._triton.paged_attention:prefill_page_attention"),
    (Platform.XLA, Backend.ANY, "ejkernel.kernels._xla.paged_attention:prefill_page_attention"),
)


@dataclasses.dataclass(frozen=True)
class PrefillPageAttentionConfig(PagedAttentionConfig):
    """Tiling of `prefill_page_attention`: the fields and rules of `PagedAttentionConfig`."""


class PrefillPageAttention(PagedAttentionKernel):
    """`prefill_page_attention` as the executor runs it (config `PrefillPageAttentionConfig`)."""

    op_id = "prefill_page_attention"
    config_type = PrefillPageAttentionConfig

    def busy_integers(self, args):
        _, key_cache, _, _, pages = args[:5]
        lengths, tables, _ = busy_sequences(1, pages.shape[0], key_cache.shape[2], key_cache.shape[1], 0)
        return {3: lengths, 4: tables[0]}


@typechecked
def prefill_page_attention(
    query: Float[Array, "chunk num_heads head_dim"],
    key_cache: Float[Array, "num_kv_heads num_pages page_size head_dim"]
    | Int8[Array, "num_kv_heads num_pages page_size head_dim"],
    value_cache: Float[Array, "num_kv_heads num_pages page_size head_dim"]
    | Int8[Array, "num_kv_heads num_pages page_size head_dim"],
    context_len: Int[Array, " 1"],
    page_indices: Int[Array, " pages_per_seq"],
    /,
    *,
    softmax_scale: float | None = None,
    mask_value: float = DEFAULT_MASK_VALUE,
    attn_logits_soft_cap: float | None = None,
    sliding_window: int | None = None,
    key_cache_scales: Float32[Array, "num_kv_heads num_pages page_size"] | None = None,
    value_cache_scales: Float32[Array, "num_kv_heads num_pages page_size"] | None = None,
    platform: str | None = None,
    cfg: PrefillPageAttentionConfig | None = None,
) -> Float[Array, "chunk num_heads head_dim"]:
    """Causal attention of the last `chunk` positions of one sequence over its pages (a prefill chunk).

    The sequence's `context_len[0]` keys live in the pages `page_indices` lists, in order. Query `i` sits at
    position `context_len[0] - chunk + i` and sees the keys up to its own position, so the chunk must not be
    longer than the context. Query head `h` reads kv head `h // (num_heads // num_kv_heads)`. Masked keys are
    excluded exactly, whatever `mask_value`.

    Cache layout: separate K and V caches `[num_kv_heads, num_pages, page_size, head_dim]`, kv heads first,
    unlike `page_attention` (`[num_pages, num_kv_heads, page_size, head_dim]`) and `unified_attention`
    (`[num_pages, page_size, num_kv_heads, head_dim]`).

    Quantised caches: float8 caches (e4m3fn, e5m2) are read as stored and converted to `query`'s dtype in the
    kernel; with `key_cache_scales` and `value_cache_scales` (float32, a cache's shape without its head dim)
    each cached row is `code * scale`, applied in the kernel (the logits' key columns, the probabilities
    before `p @ v`), never as a dequantised copy. int8 caches need the scales.

    Index values: outside `jit`, a `context_len` outside `[chunk, pages_per_seq * page_size]` or a
    `page_indices` entry it reaches outside `[0, num_pages)` raises a ValueError naming it. Under `jit` they are
    checked only with `EJKERNEL_CHECKS=1` (a bad one then stops the program with that message); otherwise
    `context_len` is clamped to `[0, pages_per_seq * page_size]` (queries it puts before position 0, when the
    chunk is longer, give zeros), and a `page_indices` entry it reaches outside `[0, num_pages)` holds no keys
    (its positions are masked).

    Args:
        query: `[chunk, num_heads, head_dim]` float. The chunk's queries, the context's last `chunk` positions.
        key_cache: `[num_kv_heads, num_pages, page_size, head_dim]`, `query`'s dtype or quantised (above). The key
            pages; `num_heads` must be a multiple of `num_kv_heads`.
        value_cache: `[num_kv_heads, num_pages, page_size, head_dim]`, `key_cache`'s dtype. The value pages.
        context_len: `[1]` int. The sequence's number of keys, the chunk included.
        page_indices: `[pages_per_seq]` int. The sequence's pages in order; entries past
            `ceil(context_len / page_size)` are not read.
        softmax_scale: `float | None`, default None (`head_dim ** -0.5`). Multiplies the logits `q·k`.
        mask_value: `float`, default `DEFAULT_MASK_VALUE` (about -2.4e38). Any value `<= -1e4` acts as -inf.
        attn_logits_soft_cap: `float | None`, default None. A positive `c` caps the scaled logits as
            `c * tanh(s / c)`.
        sliding_window: `int | None`, default None. A positive `w` keeps the last `w` positions up to the
            query's own.
        key_cache_scales: `[num_kv_heads, num_pages, page_size]` float32 or None, default None (keyword only, beyond
            upstream's surface). Per-token-head scales of a quantised `key_cache` (above); required for int8.
        value_cache_scales: `[num_kv_heads, num_pages, page_size]` float32 or None, default None. The same for
            `value_cache`; given with `key_cache_scales`.
        platform: `str | None`, default None ("auto": Triton on a GPU where it serves the call, else XLA).
            "xla" or "triton" (GPU) asks for that one.
        cfg: `PrefillPageAttentionConfig | None`, default None (chosen by the executor). The tiling; it never
            changes the result.

    Returns:
        jax.Array: `[chunk, num_heads, head_dim]` in `query`'s dtype, the chunk's attention output.

    Raises:
        TypeError: an array of the wrong rank, kind (float or int) or size against the others (one line
            naming it), caches of different dtypes (or unquantised ones of another than `query`'s), an int8
            cache without scales, scales with a 16/32-bit cache or not float32, an option of the wrong type, or `cfg`
            not a `PrefillPageAttentionConfig`.
        ValueError: `num_heads` not a multiple of `num_kv_heads`; cache scales not of their cache's shape without
            its head dim, or only one of them; `softmax_scale` not finite;
            `attn_logits_soft_cap` not positive; `mask_value` above -1e4; `sliding_window` below 1; a
            `platform` not listed, contradicting `cfg.platform` or with no implementation on this device;
            outside `jit`, a bad index value.
        jax.errors.JaxRuntimeError: under `jit` with `EJKERNEL_CHECKS=1`, a bad index value, when the program
            runs (the message is the ValueError's).

    Example:
        >>> import jax.numpy as jnp
        >>> from ejkernel.modules import prefill_page_attention
        >>> query = jnp.ones((3, 4, 8))  # a chunk of 3 queries, 4 heads, head_dim 8
        >>> key_cache = value_cache = jnp.ones((2, 4, 16, 8))  # 2 kv heads, 4 pages of 16 slots
        >>> out = prefill_page_attention(query, key_cache, value_cache, jnp.array([20]), jnp.array([2, 0]))
        >>> out.shape, out.dtype
        ((3, 4, 8), dtype('float32'))
    """
    chunk, num_heads, head_dim = query.shape
    num_kv_heads, num_pages, page_size, _ = key_cache.shape
    check_heads(num_heads, num_kv_heads)
    check_cache_dtypes("query", query, "key_cache and value_cache", key_cache, value_cache)
    check_scale_pair("key_cache_scales", key_cache_scales, "value_cache_scales", value_cache_scales)
    check_cache_scales("key_cache", key_cache, "key_cache_scales", key_cache_scales)
    check_cache_scales("value_cache", value_cache, "value_cache_scales", value_cache_scales)
    check_shape("value_cache", value_cache, key_cache.shape, "[kv_heads, pages, page_size, head_dim]")
    check_mask_value(mask_value)
    options = dict(
        softmax_scale=resolve_scale(softmax_scale, head_dim),
        attn_logits_soft_cap=check_soft_cap(attn_logits_soft_cap, "attn_logits_soft_cap"),
        sliding_window=sliding_window,
    )
    if key_cache_scales is not None:
        options.update(key_cache_scales=key_cache_scales, value_cache_scales=value_cache_scales)
    last_positions_window(sliding_window)
    check_sequence_values(
        page_tables=page_indices,
        kv_len=context_len,
        page_size=page_size,
        num_pages=num_pages,
        names={"page_tables": "page_indices", "kv_len": "context_len", "query_start_loc": "query"},
        query_start_loc=np.array([0, chunk]),
        num_tokens=chunk,
    )
    return executor(
        PrefillPageAttention(),
        query,
        key_cache,
        value_cache,
        context_len,
        page_indices,
        platform=platform,
        cfg=cfg,
        **options,
    )
