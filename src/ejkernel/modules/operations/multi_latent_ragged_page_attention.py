"""`multi_latent_ragged_page_attention` and its `_v2`: MLA serving over a paged latent cache.

One serving step of multi-head latent attention (DeepSeek-V2/V3) in the weight-absorbed form: each new
token's latent row `c [L]` and RoPE key `r [R]` are written into a packed paged cache, then every query
token (absorbed into latent space, `q_nope [Hq, L]` and `q_pe [Hq, R]`) attends causally over its
sequence's cached rows, with the latent rows as values (MQA over one shared latent head). The output
stays latent: the caller applies `W_UV`. The two ops differ only in their configs (v2: block sizes per
decode / prefill / mixed case).
"""

import dataclasses
import math
import numbers
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from ejkernel.kernels._common.checks import require_float
from ejkernel.kernels._common.paged_attention.arguments import (
    check_cache_scales,
    check_distribution,
    check_sequence_values,
    last_positions_window,
    resolve_scale,
)
from ejkernel.kernels._common.paged_attention.kv_cache import kv_packing
from ejkernel.modules.operations._common import executor
from ejkernel.modules.operations.page_attention import busy_sequences
from ejkernel.ops import Invocation, Kernel, KernelConfig
from ejkernel.ops.config import (
    BOOL,
    POSITIVE_INT,
    POWER_OF_TWO,
    KernelTiling,
    Rule,
    int_at_least,
    power_of_two_at_least,
)
from ejkernel.registry import Backend, Platform, implementations

_TRITON_TARGET = "ejkernel.kernels._triton.multi_latent_ragged_page_attention:multi_latent_ragged_page_attention_triton"
_XLA_TARGET = "ejkernel.kernels._xla.multi_latent_ragged_page_attention:multi_latent_ragged_page_attention_xla"
_MOSAIC_TARGET = (
    "ejkernel.kernels._pallas.gpu.multi_latent_ragged_page_attention:multi_latent_ragged_page_attention_mosaic_gpu"
)
_ALL = (
    (Platform.PALLAS, Backend.GPU, _MOSAIC_TARGET),
    (Platform.TRITON, Backend.GPU, _TRITON_TARGET),
    (Platform.XLA, Backend.ANY, _XLA_TARGET),
)
IMPLEMENTATIONS = implementations("multi_latent_ragged_page_attention", *_ALL)
IMPLEMENTATIONS += implementations("multi_latent_ragged_page_attention_v2", *_ALL)
"""Both ops, the same implementations (v2 differs only in its config): Mosaic GPU on Hopper (16-bit caches, 64 query
rows a block: heads in multiples of 64, or a divisor of 64 with several queries a block), Triton on GPUs, XLA
everywhere."""


@dataclasses.dataclass(frozen=True)
class MultiLatentRaggedPageAttentionTritonTiling(KernelTiling):
    """The Triton platform's tiling of both MLA ops (`triton_tiling` of their configs); XLA does not read it.

    A field left None keeps the kernel's own choice (in brackets); none changes the result beyond float32
    summation order. A program takes `block_h` query rows (a query token's heads; with few heads, several
    tokens of one sequence) and walks its share of their key span in steps of `block_k` cache rows.

    Attributes:
        block_h: Query rows per program, a power of two of at least 16 [64 for latent widths up to 512, else
            32; fewer where the tile has fewer rows, or where shared memory asks].
        block_k: Cache rows per step, a power of two of at least 16 [64 for a 16-bit cache, 16 for float32].
        num_splits: Parts a tile's key span is cut in, merged by log-sum-exp (flash-decoding) [enough
            programs for every SM, each part at least 4 steps long].
        num_warps: Warps per program, a power of two [8 for a `[block_h, latent]` accumulator of 16K
            elements or more, else 4].
        num_stages: Software-pipelining stages of the cache reads, a positive int [2].

    Raises:
        ValueError: A field that breaks its rule above; one line naming it.

    Example:
        >>> from ejkernel.modules import MultiLatentRaggedPageAttentionConfig as Config
        >>> from ejkernel.modules import MultiLatentRaggedPageAttentionTritonTiling as Tiling
        >>> Config(platform="triton", triton_tiling=Tiling(block_k=64, num_splits=2)).triton_tiling.block_k
        64
    """

    block_h: int | None = None
    block_k: int | None = None
    num_splits: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None

    RULES: ClassVar[dict[str, Rule]] = {
        "block_h": power_of_two_at_least(16),
        "block_k": power_of_two_at_least(16),
        "num_splits": POSITIVE_INT,
        "num_warps": POWER_OF_TWO,
        "num_stages": POSITIVE_INT,
    }


@dataclasses.dataclass(frozen=True)
class MultiLatentRaggedPageAttentionMosaicTiling(KernelTiling):
    """The Mosaic GPU platform's tiling of both MLA ops (`mosaic_tiling` of their configs; platform "pallas").

    A field left None keeps the kernel's own choice (in brackets); none changes the result beyond float32
    summation order. A CTA takes 64 heads of one query token and walks its key span in blocks of 64 cache rows.

    Attributes:
        num_splits: Parts a token's key span is cut in, merged by log-sum-exp (flash-decoding), a positive int
            [enough CTAs for every SM, each part at least 4 blocks long].
        stages: Cache blocks in flight in shared memory, an int of at least 2 [2; 3 overflows shared memory at
            DeepSeek's widths, and the kernel declines it].
        shared_scores: Whether one warpgroup computes the scores and softmax and hands the probabilities to the
            other (else both compute them) [True].

    Raises:
        ValueError: A field that breaks its rule above; one line naming it.

    Example:
        >>> from ejkernel.modules import MultiLatentRaggedPageAttentionConfig as Config
        >>> from ejkernel.modules import MultiLatentRaggedPageAttentionMosaicTiling as Tiling
        >>> Config(platform="pallas", mosaic_tiling=Tiling(num_splits=2)).mosaic_tiling.overrides()
        {'num_splits': 2}
    """

    num_splits: int | None = None
    stages: int | None = None
    shared_scores: bool | None = None

    RULES: ClassVar[dict[str, Rule]] = {"num_splits": POSITIVE_INT, "stages": int_at_least(2), "shared_scores": BOOL}


def _positive_int(owner: str, name: str, value: Any) -> None:
    if not POSITIVE_INT[1](value):
        raise ValueError(f"{owner}.{name} must be a positive int, got {value!r}")


class _MlaConfigChecks:
    """What both MLA configs validate; `per_case` configs take `(decode, prefill, mixed)` block sizes."""

    per_case: ClassVar[bool] = False

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = type(self).__name__
        for name in ("fwd_params", "bwd_params"):
            if getattr(self, name) is not None:
                raise ValueError(
                    f"{owner}.{name} must be None (this op is tiled by num_queries_per_block and "
                    f"num_kv_pages_per_block), got {getattr(self, name)!r}"
                )
        for name in ("num_kv_pages_per_block", "num_queries_per_block"):
            value = getattr(self, name)
            if self.per_case and isinstance(value, list | tuple):
                if len(value) != 3:
                    raise ValueError(
                        f"{owner}.{name} must be an int or a (decode, prefill, mixed) triple, "
                        f"got {len(value)} entries: {value!r}"
                    )
                for entry in value:
                    _positive_int(owner, name, entry)
                object.__setattr__(self, name, tuple(value))
            elif value is not None:
                _positive_int(owner, name, value)
        for name in ("chunk_prefill_size", "vmem_limit_bytes"):
            if getattr(self, name) is not None:
                _positive_int(owner, name, getattr(self, name))
        for name in ("num_warps", "num_stages"):
            _positive_int(owner, name, getattr(self, name))
        for name, kind in (
            ("triton_tiling", MultiLatentRaggedPageAttentionTritonTiling),
            ("mosaic_tiling", MultiLatentRaggedPageAttentionMosaicTiling),
        ):
            tiling = getattr(self, name)
            if tiling is not None and not isinstance(tiling, kind):
                raise ValueError(f"{owner}.{name} must be a {kind.__name__}, got {tiling!r}")

    def get(self, name: str, default: Any = None) -> Any:
        """A field by name (`default` for an unknown name), as EasyDeL reads its operation configs."""
        return getattr(self, name, default)


@dataclasses.dataclass(frozen=True)
class MultiLatentRaggedPageAttentionConfig(_MlaConfigChecks, KernelConfig):
    """Tiling of `multi_latent_ragged_page_attention`; None leaves a size to the implementation.

    The XLA path reads the two block sizes only: it tiles at most `num_queries_per_block` queries, fewer when
    sequences average fewer, and rounds both sizes to powers of two. The Triton path reads `triton_tiling`
    only (its tiles follow the latent width and the head count, not these TPU-sized blocks), the Mosaic GPU path
    `mosaic_tiling` only. Sizes never change results.

    Attributes:
        platform: `str`, default "auto". "auto", "pallas" (Mosaic GPU, Hopper), "triton" (GPUs) or "xla" serve
            the op; the other names of `KernelConfig` are accepted here but have no implementation of it.
        fwd_params: must be None (this op is tiled by the fields below).
        bwd_params: must be None.
        backend: `str`, default "any". "any", "gpu", "tpu" or "cpu": the device kind the config is for;
            running it on another kind raises a ValueError.
        chunk_prefill_size: `int | None`, default None. Prefill tokens per kernel chunk (upstream's TPU
            kernel): not read.
        num_kv_pages_per_block: `int | None`, default None. Cache pages per key step (XLA).
        num_queries_per_block: `int | None`, default None. Query tokens per tile (XLA).
        vmem_limit_bytes: `int | None`, default None. TPU scoped memory: not read.
        num_warps: `int`, default 4. Upstream's GPU field: not read (the Triton kernel's warps are
            `triton_tiling.num_warps`).
        num_stages: `int`, default 1. Upstream's GPU field: not read (see `triton_tiling.num_stages`).
        triton_tiling: `MultiLatentRaggedPageAttentionTritonTiling | None`, default None. The Triton kernel's
            tiles, splits and warps; None: its own choices.
        mosaic_tiling: `MultiLatentRaggedPageAttentionMosaicTiling | None`, default None. The Mosaic GPU
            kernel's splits, stages and schedule; None: its own choices.

    Raises:
        ValueError: `fwd_params` or `bwd_params` not None; a size, `num_warps` or `num_stages` that is not a
            positive int (None allowed where it is the default); a `triton_tiling` or `mosaic_tiling` of another
            type; a
            `platform` or `backend` not listed.

    Example:
        >>> from ejkernel.modules import MultiLatentRaggedPageAttentionConfig
        >>> MultiLatentRaggedPageAttentionConfig(num_queries_per_block=16).num_queries_per_block
        16
    """

    chunk_prefill_size: int | None = None
    num_kv_pages_per_block: int | None = None
    num_queries_per_block: int | None = None
    vmem_limit_bytes: int | None = None
    num_warps: int = 4
    num_stages: int = 1
    triton_tiling: MultiLatentRaggedPageAttentionTritonTiling | None = None
    mosaic_tiling: MultiLatentRaggedPageAttentionMosaicTiling | None = None


@dataclasses.dataclass(frozen=True)
class MultiLatentRaggedPageAttentionV2Config(_MlaConfigChecks, KernelConfig):
    """Tiling of `multi_latent_ragged_page_attention_v2`: as `MultiLatentRaggedPageAttentionConfig`, with triples.

    `num_kv_pages_per_block` and `num_queries_per_block` may be `(decode, prefill, mixed)` triples (a list is
    kept as a tuple; an int means all three). The XLA path uses the mixed entry; the Triton path reads
    `triton_tiling` only, the Mosaic GPU path `mosaic_tiling` only.

    Attributes:
        num_kv_pages_per_block: `int | tuple[int, int, int] | None`, default None. Cache pages per key step.
        num_queries_per_block: `int | tuple[int, int, int] | None`, default None. Query tokens per tile.
        triton_tiling: `MultiLatentRaggedPageAttentionTritonTiling | None`, default None. The Triton
            kernel's tiling.
        mosaic_tiling: `MultiLatentRaggedPageAttentionMosaicTiling | None`, default None. The Mosaic GPU
            kernel's tiling.

    Raises:
        ValueError: as `MultiLatentRaggedPageAttentionConfig`, and a block-size sequence that is not three
            positive ints.

    Example:
        >>> from ejkernel.modules import MultiLatentRaggedPageAttentionV2Config
        >>> MultiLatentRaggedPageAttentionV2Config(num_queries_per_block=[8, 32, 16]).num_queries_per_block
        (8, 32, 16)
    """

    per_case: ClassVar[bool] = True

    chunk_prefill_size: int | None = None
    num_kv_pages_per_block: int | tuple[int, int, int] | None = None
    num_queries_per_block: int | tuple[int, int, int] | None = None
    vmem_limit_bytes: int | None = None
    num_warps: int = 4
    num_stages: int = 1
    triton_tiling: MultiLatentRaggedPageAttentionTritonTiling | None = None
    mosaic_tiling: MultiLatentRaggedPageAttentionMosaicTiling | None = None


TRITON_TILINGS = (
    MultiLatentRaggedPageAttentionTritonTiling(block_k=16),
    MultiLatentRaggedPageAttentionTritonTiling(block_k=64, num_stages=1),
    MultiLatentRaggedPageAttentionTritonTiling(num_stages=3),
    MultiLatentRaggedPageAttentionTritonTiling(block_h=32, num_warps=4),
)
"""Triton tilings autotuning times beside the kernel's own choice."""

MOSAIC_TILINGS = (
    MultiLatentRaggedPageAttentionMosaicTiling(num_splits=2),
    MultiLatentRaggedPageAttentionMosaicTiling(shared_scores=False),
)
"""Mosaic GPU tilings autotuning times beside the kernel's own choice."""


class MultiLatentRaggedPageAttention(Kernel):
    """`multi_latent_ragged_page_attention` as the executor runs it (config `MultiLatentRaggedPageAttentionConfig`).

    Autotuning tries 16 and 32 queries per block (upstream's candidates), on the Triton platform the kernel's
    own tiling and `TRITON_TILINGS`, on the Mosaic GPU one its own and `MOSAIC_TILINGS`.
    """

    op_id = "multi_latent_ragged_page_attention"
    config_type = MultiLatentRaggedPageAttentionConfig

    def platform_cfgs(self, platform: str, inv: Invocation):
        """XLA: 16 and 32 queries per block (upstream's candidates); Triton: its own tiling and `TRITON_TILINGS`;
        Mosaic GPU ("pallas"): its own tiling and `MOSAIC_TILINGS`."""
        if platform == "pallas":
            for tiling in (None, *MOSAIC_TILINGS):
                yield self.config_type(platform=platform, mosaic_tiling=tiling)
            return
        if platform == "triton":
            for tiling in (None, *TRITON_TILINGS):
                yield self.config_type(platform=platform, triton_tiling=tiling)
            return
        for queries in (16, 32):
            yield self.config_type(platform=platform, num_queries_per_block=queries)

    def axis_roles(self, args, kwargs):
        """Query heads only: every head reads the one shared latent cache, so the new latents, the cache and
        the per-sequence arrays stay whole on each shard (each writes the same rows into its copy)."""
        inputs = {0: ("queries_nope", ("tokens", "heads", "dim")), 1: ("queries_pe", ("tokens", "heads", "dim"))}
        inputs |= {2: ("keys_values", ("tokens", "dim")), 3: ("keys_pe", ("tokens", "dim"))}
        inputs |= {4: ("kv_cache", ("pages", None, None, "dim"))}
        for i, name in ((5, "kv_lens"), (6, "block_tables"), (7, "query_start_loc"), (8, "distribution")):
            inputs[i] = (name, ("tokens",))
        outputs = (("tokens", "heads", None), ("pages", None, None, None))
        if kwargs.get("kv_cache_scales") is not None:  # whole on every shard, as the cache
            inputs["kv_cache_scales"] = ("kv_cache_scales", ("pages", None, None))
            outputs += (("pages", None, None),)
        return inputs, outputs

    def busy_integers(self, args):
        queries, cache, lengths, tables = args[0], args[4], args[5], args[6]
        num_seqs = lengths.shape[0]
        page_size = cache.shape[1] * cache.shape[2]
        lengths, tables, starts = busy_sequences(
            num_seqs, tables.shape[0] // num_seqs, page_size, cache.shape[0], queries.shape[0]
        )
        return {5: lengths, 6: tables.reshape(-1), 7: starts, 8: jnp.asarray([0, 0, num_seqs], jnp.int32)}


class MultiLatentRaggedPageAttentionV2(MultiLatentRaggedPageAttention):
    """`multi_latent_ragged_page_attention_v2` as the executor runs it.

    Its config is `MultiLatentRaggedPageAttentionV2Config`; it autotunes as `MultiLatentRaggedPageAttention`.
    """

    op_id = "multi_latent_ragged_page_attention_v2"
    config_type = MultiLatentRaggedPageAttentionV2Config


def _shape(x) -> tuple:
    return tuple(getattr(x, "shape", ()))


def _check_rank(name: str, x, rank: int, layout: str) -> None:
    if getattr(x, "ndim", None) != rank:
        raise ValueError(f"{name} must be {rank}-D {layout}, got shape {_shape(x)}")


def _single_head(name: str, x, layout: str):
    """`[T, D]`, or `[T, 1, D]` squeezed to it (one kv head: the latent head)."""
    if getattr(x, "ndim", None) == 3 and x.shape[1] == 1:
        return x[:, 0]
    _check_rank(name, x, 2, f"{layout} (or [T, 1, ...] with one head)")
    return x


def _check_index(name: str, x, layout: str) -> None:
    dtype = jnp.result_type(x)
    if dtype != jnp.int32:
        raise ValueError(f"{name} must be int32, got {dtype}")
    _check_rank(name, x, 1, layout)


def _check_scale(name: str, value, *, positive: bool) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number or None, got {value!r}")
    if positive and not value > 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return float(value)


def _checked_call(
    kernel: MultiLatentRaggedPageAttention,
    queries_nope, queries_pe, keys_values, keys_pe, kv_cache, kv_lens, block_tables, query_start_loc, distribution,
    *, softmax_scale, sliding_window, logits_soft_cap, mask_value, q_scale, k_scale, v_scale, kv_cache_scales,
    platform, cfg, mesh, in_specs, out_specs,
):  # fmt: skip
    """Checks one call of either op (ValueError naming the argument), canonicalises it and runs `kernel`."""
    _check_rank("queries_nope", queries_nope, 3, "[T, Hq, L]")
    _check_rank("queries_pe", queries_pe, 3, "[T, Hq, R]")
    keys_values = _single_head("keys_values", keys_values, "[T, L]")
    keys_pe = _single_head("keys_pe", keys_pe, "[T, R]")
    _check_rank("kv_cache", kv_cache, 4, "[pages, rows, packing, a128(L) + a128(R)]")
    floats = dict(queries_nope=queries_nope, queries_pe=queries_pe, keys_values=keys_values, keys_pe=keys_pe)
    for name, x in floats.items():
        require_float(name, x)
    check_cache_scales("kv_cache", kv_cache, "kv_cache_scales", kv_cache_scales)
    if jnp.dtype(kv_cache.dtype) != jnp.int8:
        require_float("kv_cache", kv_cache)
    num_tokens, num_heads, latent = queries_nope.shape
    for name, x in (("queries_pe", queries_pe), ("keys_values", keys_values), ("keys_pe", keys_pe)):
        if x.shape[0] != num_tokens:
            raise ValueError(f"{name} must have queries_nope's {num_tokens} tokens, got shape {_shape(x)}")
    if queries_pe.shape[1] != num_heads:
        raise ValueError(f"queries_pe must have queries_nope's {num_heads} heads, got shape {_shape(queries_pe)}")
    if keys_values.shape[-1] != latent:
        raise ValueError(f"keys_values' last dim must equal queries_nope's (L = {latent}), got {keys_values.shape[-1]}")
    rope = queries_pe.shape[-1]
    if keys_pe.shape[-1] != rope:
        raise ValueError(f"keys_pe's last dim must equal queries_pe's (R = {rope}), got {keys_pe.shape[-1]}")
    width = -(-latent // 128) * 128 + -(-rope // 128) * 128
    if kv_cache.shape[3] != width:
        raise ValueError(
            f"kv_cache's last dim must be a128(L) + a128(R) = {width} (L={latent}, R={rope}), got {kv_cache.shape[3]}"
        )
    packing = kv_packing(kv_cache.dtype)
    if kv_cache.shape[2] != packing:
        raise ValueError(
            f"kv_cache's packing axis (2) must be 32 / bits({kv_cache.dtype}) = {packing}, got {kv_cache.shape[2]}"
        )

    _check_index("kv_lens", kv_lens, "[N]")
    num_seqs = kv_lens.shape[0]
    if num_seqs == 0:
        raise ValueError("kv_lens must hold at least one sequence (N >= 1), got shape (0,)")
    if getattr(block_tables, "ndim", None) == 2:
        if block_tables.shape[0] != num_seqs:
            raise ValueError(f"block_tables as [N, P] must have N = {num_seqs} rows, got shape {_shape(block_tables)}")
        block_tables = block_tables.reshape(-1)
    _check_index("block_tables", block_tables, "[N * P] (or [N, P])")
    _check_index("query_start_loc", query_start_loc, "[N + 1]")
    if jnp.result_type(distribution) != jnp.int32:
        raise ValueError(f"distribution must be int32, got {jnp.result_type(distribution)}")
    if _shape(distribution) != (3,):
        raise ValueError(f"distribution must have shape (3,) ([i, j, k]), got {_shape(distribution)}")
    if block_tables.shape[0] % num_seqs:
        raise ValueError(
            f"len(block_tables) must be a multiple of N = {num_seqs} (N * pages per seq), got {block_tables.shape[0]}"
        )
    if query_start_loc.shape[0] != num_seqs + 1:
        raise ValueError(f"query_start_loc must have N + 1 = {num_seqs + 1} entries, got {query_start_loc.shape[0]}")
    distribution_ok = check_distribution(distribution, query_start_loc, num_seqs, decode_counts=False)
    check_sequence_values(
        page_tables=block_tables,
        kv_len=kv_lens,
        page_size=kv_cache.shape[1] * packing,
        num_pages=kv_cache.shape[0],
        names={
            "page_tables": "block_tables",
            "kv_len": "kv_lens",
            "query_start_loc": "query_start_loc",
            "active": "distribution[2]",
        },
        query_start_loc=query_start_loc,
        num_tokens=num_tokens,
        active=distribution[2],
        prior_ok=distribution_ok,
        starts_at_zero=False,
    )

    last_positions_window(sliding_window)
    if logits_soft_cap is not None and (
        isinstance(logits_soft_cap, bool) or not isinstance(logits_soft_cap, numbers.Real) or logits_soft_cap == 0
    ):
        raise ValueError(f"logits_soft_cap must be a non-zero number or None, got {logits_soft_cap!r}")
    options = dict(
        softmax_scale=resolve_scale(softmax_scale, latent + rope),
        sliding_window=None if sliding_window is None else int(sliding_window),
        logits_soft_cap=None if logits_soft_cap is None else float(logits_soft_cap),
        mask_value=None if mask_value is None else float(mask_value),
        q_scale=_check_scale("q_scale", q_scale, positive=True),
        k_scale=_check_scale("k_scale", k_scale, positive=False),
        v_scale=_check_scale("v_scale", v_scale, positive=False),
    )
    if kv_cache_scales is not None:
        options["kv_cache_scales"] = kv_cache_scales
    args = (queries_nope, queries_pe, keys_values, keys_pe, kv_cache, kv_lens, block_tables, query_start_loc)
    sharding = dict(mesh=mesh, in_specs=in_specs, out_specs=out_specs)
    return executor(kernel, *args, distribution, platform=platform, cfg=cfg, **sharding, **options)


def multi_latent_ragged_page_attention(
    queries_nope: jax.Array,
    queries_pe: jax.Array,
    keys_values: jax.Array,
    keys_pe: jax.Array,
    kv_cache: jax.Array,
    kv_lens: jax.Array,
    block_tables: jax.Array,
    query_start_loc: jax.Array,
    distribution: jax.Array,
    /,
    *,
    softmax_scale: float | None = None,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    mask_value: float | None = None,
    q_scale: float | None = None,
    k_scale: float | None = None,
    v_scale: float | None = None,
    kv_cache_scales: jax.Array | None = None,
    platform: str | None = None,
    cfg: MultiLatentRaggedPageAttentionConfig | None = None,
    mesh: jax.sharding.Mesh | None = None,
    in_specs: Any = None,
    out_specs: Any = None,
) -> tuple:
    """One MLA serving step: writes the new latent rows into the paged cache, then attends. `(out, kv_cache)`.

    Multi-head latent attention (DeepSeek-V2/V3) in the weight-absorbed form: each cached position holds a
    latent row `c [L]` and a RoPE key `r [R]`, which serve as its key and, `c` alone, as its value: multi-query
    attention over one shared latent head. The queries come absorbed into latent space (`q_nope [Hq, L]`,
    `q_pe [Hq, R]`), and the output stays latent: the caller applies `W_UV`.

    Sequence `s < distribution[2]` owns the tokens `query_start_loc[s]:query_start_loc[s + 1]` (the offsets need
    not start at 0), at positions `kv_lens[s] - q_len .. kv_lens[s] - 1`. Their `c = keys_values[t]` and
    `r = keys_pe[t]` are written first (cast to the cache dtype); then each query at position `p` attends over
    the positions `i <= p` (and `i >= p - sliding_window + 1`) of its sequence: logits
    `softmax_scale * (q_nope·c_i + q_pe·r_i)`, times `k_scale`, then `cap * tanh(l / cap)` with
    `logits_soft_cap`; `out = sum_i softmax_i * c_i` in float32 sums, times `v_scale`. With `q_scale` the
    queries are first quantised like the cache (`q / q_scale` rounded to its dtype, saturating) and the logits
    scaled back by `q_scale`. Tokens of no processed sequence give zeros; sequences from `distribution[2]` on
    are ignored. `distribution[0:2]` are checked but do not change the result (any `0 <= i <= j <= k` gives the
    same).

    Cache layout: one packed latent cache `[num_pages, page_size // packing, packing, a128(L) + a128(R)]`,
    `packing = 32 // bits(dtype)` and `a128(n)` meaning `n` rounded up to a multiple of 128. Position `p` of
    sequence `s` lives in page `block_tables[s * P + p // page_size]` at
    `[(p % page_size) // packing, (p % page_size) % packing]` as the row `[c, 0..., r, 0...]`. Unlike
    `ragged_page_attention_v3`, whose packing folds K/V heads into words, this packs consecutive positions and
    has no heads. Nothing else of the cache changes, and table entries past the pages covering `kv_len` are
    never read or written. The update is functional: under `jax.jit(..., donate_argnums=4)` XLA makes it in
    place.

    Quantised caches: a float8 cache (e4m3fn, e5m2) is read as stored and converted in the kernel. With
    `kv_cache_scales` (float32 `[num_pages, page_size // packing, packing]`, one scale per cached row) each row
    is `code * scale`, applied in the kernel (the logits' columns, the probabilities before `p @ v`), never as
    a dequantised copy; each new row `[c, 0..., r, 0...]` is quantised as it is written: `scale = max|row| / M`
    (`M` = 448 for e4m3fn, 57344 for e5m2, 127 for int8; a zero row gets 1) and `code = row / scale` cast
    (int8: rounded, clipped to [-127, 127]); the updated scales are a third output. An int8 cache needs the
    scales. `q_scale`, `k_scale` and `v_scale` multiply on top.

    Index values: outside `jit`, a bad one raises a ValueError naming it: `distribution` not
    `0 <= i <= j <= k <= N`, `query_start_loc` not rising within `[0, T]`, a `kv_lens` entry outside
    `[q_len, P * page_size]`, or a `block_tables` entry it reaches outside `[0, num_pages)`. Under `jit` they are
    checked only with `EJKERNEL_CHECKS=1` (a bad one then stops the program with that message); otherwise
    `distribution[2]` is clamped to `[0, N]`; `query_start_loc` to `[0, T]` and made non-decreasing (a running
    max); `kv_lens` to `[0, P * page_size]` (new tokens it puts before position 0 are not written and give
    zeros); a `block_tables` entry it reaches outside `[0, num_pages)` holds no keys (its positions are masked)
    and is not written; of new tokens naming one cache row, the last wins.

    Sharding: with `mesh`, `in_specs` (one per tensor, or one per slot) and `out_specs` (all three or none),
    only the query heads may be split: every head reads the one shared latent cache, so the new latents, the cache and
    the index arrays stay whole on every shard (each writes the same rows into its copy), and `out_specs` is `(heads
    split, P())` (`(heads split, P(), P())` with scales). Not meant to be differentiated, but `jax.grad` through it
    (with respect to the queries) works.

    Args:
        queries_nope: `[T, Hq, L]` float. The queries' non-RoPE part, absorbed into latent space.
        queries_pe: `[T, Hq, R]` float. The queries' RoPE part.
        keys_values: `[T, L]` (or `[T, 1, L]`) float. Each token's new latent row `c`.
        keys_pe: `[T, R]` (or `[T, 1, R]`) float. Each token's new RoPE key `r`.
        kv_cache: `[num_pages, page_size // packing, packing, a128(L) + a128(R)]` float, or int8 with scales.
            The packed latent cache (above).
        kv_lens: `[N]` int32, `N >= 1`. Each sequence's length, its new tokens included.
        block_tables: `[N * P]` (or `[N, P]`) int32. Sequence `s`'s pages in order at `[s * P:(s + 1) * P]`.
        query_start_loc: `[N + 1]` int32. The sequences' token bounds, rising within `[0, T]`.
        distribution: `[3]` int32. `[i, j, k]`: the first `k` sequences are processed (`i`, `j`: upstream's
            decode / prefill split).
        softmax_scale: `float | None`, default None (`(L + R) ** -0.5`, the latent widths: pass the model's).
            Multiplies the logits.
        sliding_window: `int | None`, default None. A positive `w` keeps positions `p - w + 1 <= i <= p`.
        logits_soft_cap: `float | None`, default None. A non-zero `cap` (its sign does not matter) caps the
            scaled logits as `cap * tanh(l / cap)`.
        mask_value: `float | None`, default None. Accepted and unused: masked positions are excluded exactly.
        q_scale: `float | None`, default None. Positive, finite: quantise the queries (above).
        k_scale: `float | None`, default None. Finite: multiplies the logits.
        v_scale: `float | None`, default None. Finite: multiplies the output.
        kv_cache_scales: `[num_pages, page_size // packing, packing]` float32 or None, default None (keyword
            only, beyond upstream's surface). Per-row scales of a quantised `kv_cache` (above); required for int8.
        platform: `str | None`, default None ("auto"). "pallas" (a Mosaic GPU kernel on Hopper GPUs: 16-bit
            queries and cache, heads a multiple or a divisor of 64, pages of multiples of 64 positions), "triton"
            (GPUs) or "xla"; under "auto" a call one cannot serve falls back to the next.
        cfg: `MultiLatentRaggedPageAttentionConfig | None`, default None (chosen by the executor). The tiling;
            it never changes the result.
        mesh: `jax.sharding.Mesh | None`, default None. The mesh to shard the call over (see Sharding).
        in_specs: sequence of `PartitionSpec` or None, default None. One per tensor passed, or one per
            positional slot.
        out_specs: pair of `PartitionSpec` or None, default None. The output's and the cache's specs.

    Returns:
        tuple: `(out, kv_cache)`, or `(out, kv_cache, kv_cache_scales)` with scales. `out` is `[T, Hq, L]` in
        `queries_nope`'s dtype (rows of tokens no processed sequence owns are 0); `kv_cache` the updated cache,
        of the input's shape and dtype; `kv_cache_scales` the updated scales.

    Raises:
        TypeError: `queries_nope`, `queries_pe`, `keys_values`, `keys_pe` or `kv_cache` not floating-point
            (the cache: nor int8 with scales), scales with a 16/32-bit cache or not float32, or `cfg` not a
            `MultiLatentRaggedPageAttentionConfig`.
        ValueError: an array of the wrong rank, or whose tokens, heads, `L` or `R` disagree with `queries_nope` and
            `queries_pe`; a cache whose last axis is not `a128(L) + a128(R)` or whose axis 2 is not its dtype's
            `packing`; `kv_cache_scales` not the cache's shape without its last axis; index arrays not int32 or of the
            wrong shape (`kv_lens` empty, `block_tables` not `N` rows or a multiple of `N` entries, `query_start_loc`
            not `N + 1`, `distribution` not `(3,)`); `softmax_scale`, `q_scale`, `k_scale` or `v_scale` not a finite
            number (`q_scale` not positive); `logits_soft_cap` zero or not a number; `sliding_window` below 1; a
            `platform` not listed, contradicting `cfg.platform` or with no implementation on this device; `mesh`,
            `in_specs`, `out_specs` not given together, or specs that split anything but the query heads; outside `jit`,
            a bad index value.
        jax.errors.JaxRuntimeError: under `jit` with `EJKERNEL_CHECKS=1`, a bad index value, when the program
            runs (the message is the ValueError's).

    Example:
        >>> import jax.numpy as jnp
        >>> from ejkernel.modules import multi_latent_ragged_page_attention
        >>> T, Hq, L, R = 3, 2, 16, 8  # tokens, query heads, latent and RoPE widths
        >>> kv_cache = jnp.zeros((4, 4, 1, 256))  # 4 pages of 4 positions; float32: packing 1; 128 + 128
        >>> kv_lens, block_tables = jnp.array([2, 5], jnp.int32), jnp.array([0, 1, 2, 3], jnp.int32)
        >>> query_start_loc, distribution = jnp.array([0, 1, 3], jnp.int32), jnp.array([1, 1, 2], jnp.int32)
        >>> out, kv_cache = multi_latent_ragged_page_attention(
        ...     jnp.ones((T, Hq, L)), jnp.ones((T, Hq, R)), jnp.ones((T, L)), jnp.ones((T, R)), kv_cache,
        ...     kv_lens, block_tables, query_start_loc, distribution)
        >>> out.shape, out.dtype
        ((3, 2, 16), dtype('float32'))
        >>> bool((kv_cache[0, 1, 0, :16] == 1).all())  # token 0, position 1 of sequence 0: c in its row
        True
    """
    return _checked_call(
        MultiLatentRaggedPageAttention(),
        queries_nope, queries_pe, keys_values, keys_pe, kv_cache, kv_lens, block_tables, query_start_loc, distribution,
        softmax_scale=softmax_scale, sliding_window=sliding_window, logits_soft_cap=logits_soft_cap,
        mask_value=mask_value, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale, kv_cache_scales=kv_cache_scales,
        platform=platform, cfg=cfg, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
    )  # fmt: skip


def multi_latent_ragged_page_attention_v2(
    queries_nope: jax.Array,
    queries_pe: jax.Array,
    keys_values: jax.Array,
    keys_pe: jax.Array,
    kv_cache: jax.Array,
    kv_lens: jax.Array,
    block_tables: jax.Array,
    query_start_loc: jax.Array,
    distribution: jax.Array,
    /,
    *,
    softmax_scale: float | None = None,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    mask_value: float | None = None,
    q_scale: float | None = None,
    k_scale: float | None = None,
    v_scale: float | None = None,
    kv_cache_scales: jax.Array | None = None,
    platform: str | None = None,
    cfg: MultiLatentRaggedPageAttentionV2Config | None = None,
    mesh: jax.sharding.Mesh | None = None,
    in_specs: Any = None,
    out_specs: Any = None,
) -> tuple:
    """`multi_latent_ragged_page_attention` with a config whose block sizes may be given per case.

    Arguments, result, errors and semantics are those of `multi_latent_ragged_page_attention`; only `cfg`
    differs (`MultiLatentRaggedPageAttentionV2Config`: `(decode, prefill, mixed)` block sizes).

    Args:
        queries_nope: `[T, Hq, L]` float. The queries' non-RoPE part, absorbed into latent space.
        queries_pe: `[T, Hq, R]` float. The queries' RoPE part.
        keys_values: `[T, L]` (or `[T, 1, L]`) float. Each token's new latent row.
        keys_pe: `[T, R]` (or `[T, 1, R]`) float. Each token's new RoPE key.
        kv_cache: `[num_pages, page_size // packing, packing, a128(L) + a128(R)]` float, or int8 with scales.
            The packed latent cache.
        kv_lens: `[N]` int32, `N >= 1`. Each sequence's length, its new tokens included.
        block_tables: `[N * P]` (or `[N, P]`) int32. Each sequence's pages in order.
        query_start_loc: `[N + 1]` int32. The sequences' token bounds, rising within `[0, T]`.
        distribution: `[3]` int32. `[i, j, k]`: the first `k` sequences are processed.
        softmax_scale: `float | None`, default None (`(L + R) ** -0.5`). Multiplies the logits.
        sliding_window: `int | None`, default None. A positive `w` keeps the last `w` positions.
        logits_soft_cap: `float | None`, default None. A non-zero cap of the scaled logits.
        mask_value: `float | None`, default None. Accepted and unused.
        q_scale: `float | None`, default None. Positive, finite: quantise the queries like the cache.
        k_scale: `float | None`, default None. Finite: multiplies the logits.
        v_scale: `float | None`, default None. Finite: multiplies the output.
        kv_cache_scales: `[num_pages, page_size // packing, packing]` float32 or None, default None. Per-row
            scales of a quantised cache, as in `multi_latent_ragged_page_attention`.
        platform: `str | None`, default None ("auto"). "pallas" (a Mosaic GPU kernel on Hopper GPUs: 16-bit
            queries and cache, heads a multiple or a divisor of 64, pages of multiples of 64 positions), "triton"
            (GPUs) or "xla"; under "auto" a call one cannot serve falls back to the next.
        cfg: `MultiLatentRaggedPageAttentionV2Config | None`, default None (chosen by the executor). The
            tiling; it never changes the result.
        mesh: `jax.sharding.Mesh | None`, default None. The mesh to shard the call over (query heads only).
        in_specs: sequence of `PartitionSpec` or None, default None. One per tensor passed, or one per slot.
        out_specs: pair of `PartitionSpec` or None, default None. The output's and the cache's specs.

    Returns:
        tuple: `(out, kv_cache)`: `out` `[T, Hq, L]` in `queries_nope`'s dtype and the updated cache; with
        `kv_cache_scales`, `(out, kv_cache, kv_cache_scales)`.

    Raises:
        TypeError: a non-float array where a float one is due, or `cfg` not a
            `MultiLatentRaggedPageAttentionV2Config`.
        ValueError: as `multi_latent_ragged_page_attention` (shapes, index dtypes and values, options,
            platform, sharding).
        jax.errors.JaxRuntimeError: under `jit` with `EJKERNEL_CHECKS=1`, a bad index value, when the program
            runs.

    Example:
        >>> import jax.numpy as jnp
        >>> from ejkernel.modules import MultiLatentRaggedPageAttentionV2Config, multi_latent_ragged_page_attention_v2
        >>> T, Hq, L, R = 3, 2, 16, 8
        >>> cfg = MultiLatentRaggedPageAttentionV2Config(num_queries_per_block=(8, 16, 16))
        >>> out, kv_cache = multi_latent_ragged_page_attention_v2(
        ...     jnp.ones((T, Hq, L)), jnp.ones((T, Hq, R)), jnp.ones((T, L)), jnp.ones((T, R)),
        ...     jnp.zeros((4, 4, 1, 256)), jnp.array([2, 5], jnp.int32), jnp.array([0, 1, 2, 3], jnp.int32),
        ...     jnp.array([0, 1, 3], jnp.int32), jnp.array([1, 1, 2], jnp.int32), cfg=cfg)
        >>> out.shape, kv_cache.shape
        ((3, 2, 16), (4, 4, 1, 256))
    """
    return _checked_call(
        MultiLatentRaggedPageAttentionV2(),
        queries_nope, queries_pe, keys_values, keys_pe, kv_cache, kv_lens, block_tables, query_start_loc, distribution,
        softmax_scale=softmax_scale, sliding_window=sliding_window, logits_soft_cap=logits_soft_cap,
        mask_value=mask_value, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale, kv_cache_scales=kv_cache_scales,
        platform=platform, cfg=cfg, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
    )  # fmt: skip
