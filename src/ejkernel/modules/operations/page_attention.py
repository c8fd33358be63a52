"""`page_attention`: decode attention (one query per sequence) over a paged K/V cache.

Also home of what the six serving ops share at the public boundary (`PagedAttentionConfig`,
`PagedAttentionKernel`, `check_tables`): they are one computation (see
`ejkernel.kernels._common.paged_attention`), differing only in layouts and options.
"""

import dataclasses
from typing import ClassVar

import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from ejkernel.kernels._common.paged_attention import (
    DEFAULT_MASK_VALUE,
    check_heads,
    check_mask_value,
    check_same_dtype,
    check_sequence_values,
    check_shape,
    check_soft_cap,
    last_positions_window,
    resolve_scale,
)
from ejkernel.modules.operations._common import executor, typechecked
from ejkernel.ops import FwdParams, Invocation, Kernel, KernelConfig


@dataclasses.dataclass(frozen=True)
class PagedAttentionConfig(KernelConfig):
    """Tiling of the serving ops' cores.

    `fwd_params.block_q`: queries of one sequence per tile (XLA); `block_k`: key positions per step;
    `num_warps`, `num_stages` (Triton). `num_splits`: how many parts each tile's keys are cut in and
    merged by log-sum-exp (flash-decoding on GPU; None: the kernel decides).

    Upstream's knobs are fields too, read where `fwd_params` leaves a size unset
    (`kernels._common.paged_attention.config_tiling`): `num_kv_pages_per_block` (pages per key step),
    `num_queries_per_block`, `num_warps`, `num_stages`. Any positive int is valid: sizes are rounded up
    to the powers of two the kernels tile by. Knobs never change results; None: the kernel decides.
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
    """A serving op as the executor sees it: its implementations take `cfg` as given (None fields: defaults)."""

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
    """Autotuning stand-ins for a serving call's traced integers (`Kernel.busy_integers`): every context fills
    its table row (pages dealt round the cache), and the tokens are shared evenly, each sequence's at the
    end of its context. Returns `(context lengths [N], page tables [N, pages_per_seq], query starts [N+1])`."""
    tables = jnp.arange(num_seqs * pages_per_seq, dtype=jnp.int32).reshape(num_seqs, pages_per_seq) % num_pages
    lengths = jnp.full((num_seqs,), pages_per_seq * page_size, jnp.int32)
    shares = tokens // num_seqs + (jnp.arange(num_seqs) < tokens % num_seqs)
    starts = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(shares).astype(jnp.int32)])
    return lengths, tables, starts


def check_tables(name: str, tables, rows: int | None = None) -> None:
    """A page table: 2-D integer `[rows, pages per sequence]`."""
    check_shape(name, tables, (rows, None), "[sequences, pages per sequence]")


@dataclasses.dataclass(frozen=True)
class PageAttentionConfig(PagedAttentionConfig):
    """Tiling of `page_attention` (see `PagedAttentionConfig`)."""


class PageAttention(PagedAttentionKernel):
    op_id = "page_attention"
    config_type = PageAttentionConfig

    def busy_integers(self, args):
        query, key_cache, _, _, tables = args[:5]
        lengths, tables, _ = busy_sequences(query.shape[0], tables.shape[1], key_cache.shape[2], key_cache.shape[0], 0)
        return {3: lengths, 4: tables}


@typechecked
def page_attention(
    query: Float[Array, "num_seqs num_heads head_dim"],
    key_cache: Float[Array, "num_blocks num_kv_heads block_size head_dim"],
    value_cache: Float[Array, "num_blocks num_kv_heads block_size head_dim"],
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
    platform: str | None = None,
    cfg: PageAttentionConfig | None = None,
) -> Float[Array, "num_seqs num_heads head_dim"]:
    """Decode attention: sequence `i`'s query (at position `context_lens[i] - 1`) over its cache pages.

    Caches are `[blocks, Hkv, block_size, D]`; `block_tables[i]` lists sequence i's blocks in order,
    and only the first `ceil(context_lens[i] / block_size)` entries are read. Query heads are a
    multiple of Hkv (grouped-query). `attn_scale` defaults to `D**-0.5`; `attn_logits_soft_cap` caps
    logits as `c·tanh(s/c)`; `sliding_window=w` keeps the last `w` positions. A context of 0 gives
    zeros. `max_context_len` promises every context is at most that long (keys past it are not read).

    Masked keys are excluded exactly: `mask_value` may be any value <= -1e4 (it acts as -inf).
    `num_splits`, `pages_per_compute_block`, `megacore_mode` and `inline_seq_dim` steer schedules only
    (the result does not change).

    Index values: a bad one raises a ValueError outside `jit` (under `jit` too with `EJKERNEL_CHECKS=1`);
    otherwise under `jit`, `context_lens` is clamped to `[0, max_blocks·block_size]` (and to
    `max_context_len`), and a `block_tables` entry it reaches outside `[0, num_blocks)` holds no keys
    (its positions are masked).
    """
    num_seqs, num_heads, head_dim = query.shape
    num_blocks, num_kv_heads, block_size, _ = key_cache.shape
    check_heads(num_heads, num_kv_heads)
    check_same_dtype("query, key_cache and value_cache", query, key_cache, value_cache)
    check_shape("value_cache", value_cache, key_cache.shape, "[blocks, kv_heads, block_size, head_dim]")
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
