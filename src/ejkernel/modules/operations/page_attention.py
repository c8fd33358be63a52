"""`page_attention`: decode attention (one query per sequence) over a paged K/V cache.

Also home of what the six serving ops share at the public boundary (`PagedAttentionConfig`,
`PagedAttentionKernel`, `check_tables`): they are one computation (see
`ejkernel.kernels._common.paged_attention`), differing only in layouts and options.
"""

import dataclasses
from typing import Any, ClassVar

import jax.numpy as jnp
from jax.sharding import PartitionSpec
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
from ejkernel.ops import FwdParams, Invocation, Kernel, KernelConfig
from ejkernel.registry import Backend, Platform, implementations

IMPLEMENTATIONS = implementations(
    "page_attention",
    (Platform.TRITON, Backend.GPU, "ejkernel.kernels._triton.paged_attention:page_attention"),
    (Platform.XLA, Backend.ANY, "ejkernel.kernels._xla.paged_attention:page_attention"),
    (Platform.PALLAS, Backend.TPU, "ejkernel.kernels._pallas.tpu.paged_attention:page_attention"),
)
"""Best first. The TPU kernel, checked only in Pallas' TPU interpret mode so far, comes after XLA
(`platform="pallas"` asks for it) until the suite has passed on a real TPU."""


@dataclasses.dataclass(frozen=True)
class PagedAttentionConfig(KernelConfig):
    """Tiling of the six serving ops' cores, and the base of each one's config.

    Knobs never change results; None leaves a knob to the kernel. Upstream's knobs are read where
    `fwd_params` leaves a size unset (`kernels._common.paged_attention.implementations.config_tiling`);
    any positive int is valid for them: block sizes and warps are rounded up to the powers of two the
    kernels tile by.

    Attributes:
        platform: `str`, default "auto". "auto", "xla", "triton", "pallas" or "cuda" (see the op's `platform`).
        fwd_params: `FwdParams | None`, default None. `block_q`: queries of one sequence per tile (XLA);
            `block_k`: key positions per step; `num_warps`, `num_stages` (Triton). Powers of two.
        bwd_params: `BwdParams | None`, default None. Not read: the serving ops have no backward kernel.
        backend: `str`, default "any". "any", "gpu", "tpu" or "cpu": the device kind the config is for;
            running it on another kind raises a ValueError.
        num_splits: `int | None`, default None. How many parts each tile's keys are cut in and merged by
            log-sum-exp (flash-decoding on GPU); None: the kernel decides.
        num_kv_pages_per_block: `int | None`, default None. Pages per key step (upstream's name).
        num_queries_per_block: `int | None`, default None. Queries per tile (upstream's name).
        num_warps: `int | None`, default None. Triton warps per program.
        num_stages: `int | None`, default None. Triton pipeline stages.

    Raises:
        ValueError: a knob that is neither a positive int nor None (a bool included), a `platform` or
            `backend` not listed above, or `fwd_params` / `bwd_params` of another type.

    Example:
        >>> from ejkernel.modules import PageAttentionConfig
        >>> from ejkernel.ops import FwdParams
        >>> cfg = PageAttentionConfig(platform="xla", fwd_params=FwdParams(block_k=256), num_splits=4)
        >>> cfg.fwd_params.block_k, cfg.num_splits
        (256, 4)
    """

    num_splits: int | None = None
    num_kv_pages_per_block: int | None = None
    num_queries_per_block: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None

    knob_fields: ClassVar[tuple[str, ...]] = (
        "num_splits",
        "num_kv_pages_per_block",
        "num_queries_per_block",
        "num_warps",
        "num_stages",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in self.knob_fields:
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{type(self).__name__}.{name} must be a positive int or None, got {value!r}")


class PagedAttentionKernel(Kernel):
    """A serving op as the executor sees it: its implementations take `cfg` as given (None fields: defaults).

    Autotuning tries the default config, then on Triton `block_k` 32, 64, 128 with 1, 4 or 16 splits, on
    XLA `block_k` 256 and 1024. On a mesh, a cache's per-token-head scales are split as the cache is.
    """

    scale_slots: ClassVar[dict[str, int]] = {}
    """Cache scales keyword -> the positional slot of the cache it scales."""

    def kwarg_specs(self, kwargs: dict[str, Any], in_specs) -> dict[str, Any]:
        """A cache's scales take the cache's spec without its last (head-dim) axis."""
        specs = super().kwarg_specs(kwargs, in_specs)
        for name, slot in self.scale_slots.items():
            if name in specs:
                specs[name] = PartitionSpec(*tuple(in_specs[slot])[: kwargs[name].ndim])
        return specs

    def with_scale_roles(self, inputs: dict, kwargs: dict[str, Any]) -> dict:
        """`inputs` (axis roles by position) with those of the cache scales given: their cache's, less the last."""
        for name, slot in self.scale_slots.items():
            if kwargs.get(name) is not None:
                inputs[name] = (name, inputs[slot][1][:-1])
        return inputs

    def platform_cfgs(self, platform: str, inv: Invocation):
        yield self.config_type(platform=platform)
        if platform == "triton":
            for block_k, warps in ((32, 4), (64, 4), (128, 8)):
                for splits in (1, 4, 16):
                    params = FwdParams(block_k=block_k, num_warps=warps, num_stages=2)
                    yield self.config_type(platform=platform, fwd_params=params, num_splits=splits)
        elif platform == "xla":
            for block_k in (256, 1024):
                yield self.config_type(platform=platform, fwd_params=FwdParams(block_k=block_k))


def busy_sequences(num_seqs: int, pages_per_seq: int, page_size: int, num_pages: int, tokens: int):
    """Autotuning stand-ins for a serving call's traced integers (`Kernel.busy_integers`).

    Every context fills its table row (pages dealt round the cache), and the tokens are shared evenly,
    each sequence's at the end of its context.

    Args:
        num_seqs: `int`. Sequences `N`.
        pages_per_seq: `int`. Entries of a page table row.
        page_size: `int`. Positions per page.
        num_pages: `int`. Pages of the cache.
        tokens: `int`. Query tokens to share among the sequences.

    Returns:
        tuple: `(context lengths [N], page tables [N, pages_per_seq], query starts [N + 1])`, int32 arrays.
    """
    tables = jnp.arange(num_seqs * pages_per_seq, dtype=jnp.int32).reshape(num_seqs, pages_per_seq) % num_pages
    lengths = jnp.full((num_seqs,), pages_per_seq * page_size, jnp.int32)
    shares = tokens // num_seqs + (jnp.arange(num_seqs) < tokens % num_seqs)
    starts = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(shares).astype(jnp.int32)])
    return lengths, tables, starts


def check_tables(name: str, tables, rows: int | None = None) -> None:
    """Checks that a page table is 2-D, `[rows, pages per sequence]`.

    Args:
        name: `str`. The argument's name, for the message.
        tables: the page table (an array).
        rows: `int | None`, default None. The rows it must have; None: any number.

    Raises:
        ValueError: `tables` is not 2-D or has another number of rows.
    """
    check_shape(name, tables, (rows, None), "[sequences, pages per sequence]")


@dataclasses.dataclass(frozen=True)
class PageAttentionConfig(PagedAttentionConfig):
    """Tiling of `page_attention`: the fields and rules of `PagedAttentionConfig`."""


class PageAttention(PagedAttentionKernel):
    """`page_attention` as the executor runs it (config `PageAttentionConfig`)."""

    op_id = "page_attention"
    config_type = PageAttentionConfig

    def busy_integers(self, args):
        query, key_cache, _, _, tables = args[:5]
        lengths, tables, _ = busy_sequences(query.shape[0], tables.shape[1], key_cache.shape[2], key_cache.shape[0], 0)
        return {3: lengths, 4: tables}


@typechecked
def page_attention(
    query: Float[Array, "num_seqs num_heads head_dim"],
    key_cache: Float[Array, "num_blocks num_kv_heads block_size head_dim"]
    | Int8[Array, "num_blocks num_kv_heads block_size head_dim"],
    value_cache: Float[Array, "num_blocks num_kv_heads block_size head_dim"]
    | Int8[Array, "num_blocks num_kv_heads block_size head_dim"],
    context_lens: Int[Array, " num_seqs"],
    block_tables: Int[Array, "num_seqs max_blocks"],
    /,
    *,
    attn_scale: float | None = None,
    max_context_len: int | None = None,
    num_splits: int = 0,
    mask_value: float = DEFAULT_MASK_VALUE,
    attn_logits_soft_cap: float | None = None,
    pages_per_compute_block: int | None = None,
    megacore_mode: str | None = None,
    inline_seq_dim: bool = True,
    sliding_window: int | None = None,
    key_cache_scales: Float32[Array, "num_blocks num_kv_heads block_size"] | None = None,
    value_cache_scales: Float32[Array, "num_blocks num_kv_heads block_size"] | None = None,
    platform: str | None = None,
    cfg: PageAttentionConfig | None = None,
) -> Float[Array, "num_seqs num_heads head_dim"]:
    """Decode attention: each sequence's one query over its pages of a paged K/V cache.

    Sequence `i`'s query sits at position `context_lens[i] - 1` and attends to keys `0 .. context_lens[i] - 1`,
    which live in the pages `block_tables[i]` lists, in order; only its first `ceil(context_lens[i] / page_size)`
    entries are read. A context of 0 gives zeros. Query head `h` reads kv head `h // (num_heads // num_kv_heads)`
    (grouped-query). Masked keys are excluded exactly, whatever `mask_value`.

    Cache layout: separate K and V caches `[num_pages, num_kv_heads, page_size, head_dim]`, kv heads before
    slots. The other serving ops differ: `prefill_page_attention` puts kv heads first
    (`[num_kv_heads, num_pages, page_size, head_dim]`); `unified_attention` (and `flash_attention` with
    `block_tables`) puts slots first (`[num_pages, page_size, num_kv_heads, head_dim]`);
    `ragged_page_attention_v2` keeps K and V interleaved in one cache `[num_pages, page_size, 2 * num_kv_heads,
    head_dim]`; `ragged_page_attention_v3` packs that interleaving 5-D; the MLA ops keep one packed latent cache.
    The scale is `attn_scale` here, `softmax_scale` elsewhere; all default to `head_dim ** -0.5` except
    `ragged_page_attention_v3` (1.0).

    Quantised caches: float8 caches (e4m3fn, e5m2) are read as stored and converted to `query`'s dtype in the
    kernel; with `key_cache_scales` and `value_cache_scales` (float32, a cache's shape without its head dim)
    each cached row is `code * scale`, applied in the kernel (the logits' key columns, the probabilities
    before `p @ v`), never as a dequantised copy. int8 caches need the scales.

    Index values: outside `jit`, a `context_lens` entry outside `[0, max_blocks * page_size]` (or above
    `max_context_len`) or a `block_tables` entry it reaches outside `[0, num_pages)` raises a ValueError naming it.
    Under `jit` they are checked only with `EJKERNEL_CHECKS=1` (a bad one then stops the program with that
    message); otherwise `context_lens` is clamped to `[0, max_blocks * page_size]` (and to `max_context_len`), and
    a `block_tables` entry it reaches outside `[0, num_pages)` holds no keys (its positions are masked).

    Args:
        query: `[num_seqs, num_heads, head_dim]` float. One query per sequence, the decode token.
        key_cache: `[num_pages, num_kv_heads, page_size, head_dim]`, `query`'s dtype, or a quantised cache
            (float8_e4m3fn, float8_e5m2; int8 with scales). The key pages; `num_heads` must be a multiple of
            `num_kv_heads`.
        value_cache: `[num_pages, num_kv_heads, page_size, head_dim]`, `key_cache`'s dtype. The value pages.
        context_lens: `[num_seqs]` int. Each sequence's number of keys, its query's position included.
        block_tables: `[num_seqs, max_blocks]` int. Row `i` lists sequence `i`'s pages in order.
        attn_scale: `float | None`, default None (`head_dim ** -0.5`). Multiplies the logits `q·k`.
        max_context_len: `int | None`, default None (the table's capacity). A promise, >= 1, that no context is
            longer: keys past it are not read.
        num_splits: `int`, default 0 (the kernel decides). Parts a context's keys are split in and merged
            (flash-decoding); a hint to the GPU schedule, the result does not change.
        mask_value: `float`, default `DEFAULT_MASK_VALUE` (about -2.4e38). Any value `<= -1e4` acts as -inf.
        attn_logits_soft_cap: `float | None`, default None. A positive `c` caps the scaled logits as
            `c * tanh(s / c)`.
        pages_per_compute_block: `int | None`, default None. Upstream's TPU block size: checked (>= 1), then
            ignored.
        megacore_mode: `str | None`, default None. Upstream's TPU option, None, "kv_head" or "batch": checked,
            then ignored.
        inline_seq_dim: `bool`, default True. Upstream's TPU option: ignored.
        sliding_window: `int | None`, default None. A positive `w` keeps the last `w` positions, the query's
            own included.
        key_cache_scales: `[num_pages, num_kv_heads, page_size]` float32 or None, default None (keyword only, beyond
            upstream's surface). Per-token-head scales of a quantised `key_cache`: key `(page, head, slot)` is
            `key_cache[page, head, slot] * key_cache_scales[page, head, slot]`. Required for int8.
        value_cache_scales: `[num_pages, num_kv_heads, page_size]` float32 or None, default None. The same for
            `value_cache`; given with `key_cache_scales`.
        platform: `str | None`, default None ("auto": the best implementation on this device: Triton on a
            GPU where it serves the call, else XLA). "xla", "triton" (GPU) or "pallas" (TPU) asks for that one.
        cfg: `PageAttentionConfig | None`, default None (chosen by the executor). The tiling; it never changes
            the result.

    Returns:
        jax.Array: `[num_seqs, num_heads, head_dim]` in `query`'s dtype, each sequence's attention output.

    Raises:
        TypeError: an array of the wrong rank, kind (float or int) or size against the others (one line
            naming it), the caches of different dtypes (or unquantised ones of another than `query`'s), an
            int8 cache without scales, scales with a 16/32-bit cache or not float32, an option of the wrong
            type, or `cfg` not a `PageAttentionConfig`.
        ValueError: `num_heads` not a multiple of `num_kv_heads`; scales not of their cache's shape without
            its head dim, or only one of them; `attn_scale` not finite;
            `attn_logits_soft_cap` not positive; `mask_value` above -1e4; `sliding_window`, `max_context_len`
            or `pages_per_compute_block` below 1; `num_splits` below 0; another `megacore_mode`; a `platform`
            not listed, contradicting `cfg.platform` or with no implementation on this device; outside
            `jit`, a bad index value.
        jax.errors.JaxRuntimeError: under `jit` with `EJKERNEL_CHECKS=1`, a bad index value, when the program
            runs (the message is the ValueError's).

    Example:
        >>> import jax.numpy as jnp
        >>> from ejkernel.modules import page_attention
        >>> query = jnp.ones((2, 4, 8))  # 2 sequences, 4 query heads, head_dim 8
        >>> key_cache = value_cache = jnp.ones((4, 2, 16, 8))  # 4 pages, 2 kv heads, 16 slots a page
        >>> context_lens = jnp.array([0, 20])  # sequence 1 spans two pages
        >>> block_tables = jnp.array([[3, 0], [1, 2]])
        >>> out = page_attention(query, key_cache, value_cache, context_lens, block_tables)
        >>> out.shape, out.dtype, bool((out[0] == 0).all())  # an empty context gives zeros
        ((2, 4, 8), dtype('float32'), True)
    """
    num_seqs, num_heads, head_dim = query.shape
    num_blocks, num_kv_heads, block_size, _ = key_cache.shape
    check_heads(num_heads, num_kv_heads)
    check_cache_dtypes("query", query, "key_cache and value_cache", key_cache, value_cache)
    check_shape("value_cache", value_cache, key_cache.shape, "[blocks, kv_heads, block_size, head_dim]")
    check_scale_pair("key_cache_scales", key_cache_scales, "value_cache_scales", value_cache_scales)
    check_cache_scales("key_cache", key_cache, "key_cache_scales", key_cache_scales)
    check_cache_scales("value_cache", value_cache, "value_cache_scales", value_cache_scales)
    check_tables("block_tables", block_tables, num_seqs)
    check_mask_value(mask_value)
    for name, value in (("max_context_len", max_context_len), ("pages_per_compute_block", pages_per_compute_block)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be a positive int or None, got {value}")
    if num_splits < 0:
        raise ValueError(f"num_splits must be >= 0 (0: chosen by the kernel), got {num_splits}")
    if megacore_mode not in (None, "kv_head", "batch"):
        raise ValueError(f"megacore_mode must be None, 'kv_head' or 'batch', got {megacore_mode!r}")
    options = dict(
        attn_scale=resolve_scale(attn_scale, head_dim, "attn_scale"),
        attn_logits_soft_cap=check_soft_cap(attn_logits_soft_cap, "attn_logits_soft_cap"),
        sliding_window=sliding_window,
        max_context_len=max_context_len,
        num_splits=num_splits,
    )
    if key_cache_scales is not None:
        options.update(key_cache_scales=key_cache_scales, value_cache_scales=value_cache_scales)
    last_positions_window(sliding_window)
    check_sequence_values(
        page_tables=block_tables,
        kv_len=context_lens,
        page_size=block_size,
        num_pages=num_blocks,
        names={"page_tables": "block_tables", "kv_len": "context_lens"},
        kv_capacity=max_context_len,
        queries_fit=False,
    )
    return executor(
        PageAttention(),
        query,
        key_cache,
        value_cache,
        context_lens,
        block_tables,
        platform=platform,
        cfg=cfg,
        **options,
    )
