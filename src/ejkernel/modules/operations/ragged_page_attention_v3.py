"""`ragged_page_attention_v3`: writes the new tokens' keys/values into a packed paged cache, then attends.

The cache `[pages, page_size, ceil(2 Hkv / packing), packing, D rounded up to 128]` packs `packing`
combined heads per 32-bit word (2 for 16-bit dtypes); combined head `2h` is key head h and `2h + 1`
its value. `ejkernel.utils.make_dummy_rpa_inputs` builds valid inputs.
"""

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Float32, Int, Int8

from ejkernel.kernels._common.paged_attention.arguments import (
    check_cache_scales,
    check_distribution,
    check_heads,
    check_same_dtype,
    check_sequence_values,
    check_shape,
    check_sinks,
    check_soft_cap,
    last_positions_window,
    resolve_scale,
)
from ejkernel.kernels._common.paged_attention.kv_cache import v3_cache_shape
from ejkernel.modules.operations._common import executor, typechecked
from ejkernel.modules.operations.page_attention import PagedAttentionConfig, PagedAttentionKernel, busy_sequences
from ejkernel.ops.axis_roles import sink_roles
from ejkernel.registry import Backend, Platform, implementations

IMPLEMENTATIONS = implementations(
    "ragged_page_attention_v3",
    (Platform.PALLAS, Backend.GPU, "ejkernel.kernels._pallas.gpu.paged_attention:ragged_page_attention_v3"),
    (Platform.TRITON, Backend.GPU, "ejkernel.kernels._triton.paged_attention:ragged_page_attention_v3"),
    (Platform.XLA, Backend.ANY, "ejkernel.kernels._xla.paged_attention:ragged_page_attention_v3"),
    (Platform.PALLAS, Backend.TPU, "ejkernel.kernels._pallas.tpu.paged_attention:ragged_page_attention_v3"),
)
"""Best first. On Hopper GPUs the prefill chunks run in Mosaic GPU flash attention tiles beside the Triton core's
short-sequence pass (it declines windows, soft caps, sinks, quantised caches and decode-only batches: then the
Triton core serves them). The TPU kernel, checked only in Pallas' TPU interpret mode so far, comes after XLA
(`platform="pallas"` on a TPU asks for it) until the suite has passed on a real TPU."""


@dataclasses.dataclass(frozen=True)
class RaggedPageAttentionV3Config(PagedAttentionConfig):
    """Tiling of `ragged_page_attention_v3`: the fields and rules of `PagedAttentionConfig`, and one more.

    Attributes:
        chunk_prefill_size: `int | None`, default None. Upstream's cap on prefill tokens per kernel call, for
            its TPU schedule: checked like the other knobs, then ignored (our cores take any mix in one call).
    """

    chunk_prefill_size: int | None = None

    knob_fields: ClassVar[tuple[str, ...]] = (*PagedAttentionConfig.knob_fields, "chunk_prefill_size")


class RaggedPageAttentionV3(PagedAttentionKernel):
    """`ragged_page_attention_v3` as the executor runs it (config `RaggedPageAttentionV3Config`)."""

    op_id = "ragged_page_attention_v3"
    scale_slots: ClassVar[dict[str, int]] = {"kv_cache_scales": 3}
    config_type = RaggedPageAttentionV3Config

    def axis_roles(self, args, kwargs):
        """Heads only: queries, new keys / values and the cache's K/V groups alike (its scales too); tokens, pages
        and the per-sequence tables never. The updated cache (and scales) keep the input's layout."""
        queries, sinks = args[0], args[8]
        inputs = {0: ("queries", ("tokens", "heads", "dim")), 1: ("keys", ("tokens", "heads", "dim"))}
        inputs |= {2: ("values", ("tokens", "heads", "dim")), 3: ("kv_cache", ("pages", None, "heads", None, "dim"))}
        for i, name in ((4, "kv_lens"), (5, "block_tables"), (6, "query_start_loc"), (7, "distribution")):
            inputs[i] = (name, ("tokens",))
        if sinks is not None:
            inputs[8] = ("softmax_aux", sink_roles(sinks, queries.shape[1]))
        outputs = (("tokens", "heads", None), ("pages", None, "heads", None, None))
        if kwargs.get("kv_cache_scales") is not None:
            outputs += (("pages", None, "heads", None),)
        return self.with_scale_roles(inputs, kwargs), outputs

    def busy_integers(self, args):
        queries, _, _, cache, lengths, tables = args[:6]
        num_seqs, tokens = lengths.shape[0], queries.shape[0]
        lengths, tables, starts = busy_sequences(
            num_seqs, tables.shape[0] // num_seqs, cache.shape[1], cache.shape[0], tokens
        )
        decode = num_seqs if tokens == num_seqs else 0  # one token each: the decode-only sequences
        distribution = jnp.asarray([decode, decode, num_seqs], jnp.int32)
        return {4: lengths, 5: tables.reshape(-1), 6: starts, 7: distribution}


def _positive_scale(name: str, value) -> None:
    if value is not None and not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite number or None, got {value!r}")


@typechecked
def ragged_page_attention_v3(
    queries: Float[Array, "tokens num_heads head_dim"],
    keys: Float[Array, "tokens num_kv_heads head_dim"],
    values: Float[Array, "tokens num_kv_heads head_dim"],
    kv_cache: Float[Array, "num_pages page_size kv_groups packing padded_dim"]
    | Int8[Array, "num_pages page_size kv_groups packing padded_dim"],
    kv_lens: Int[Array, " max_seqs"],
    block_tables: Int[Array, " table_entries"],
    query_start_loc: Int[Array, " max_seqs_plus_1"],
    distribution: Int[Array, " 3"],
    softmax_aux: Float[Array, " num_heads"] | None = None,
    /,
    *,
    softmax_scale: float | None = 1.0,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    q_scale: float | None = None,
    k_scale: float | None = None,
    v_scale: float | None = None,
    vmem_limit_bytes: int | None = None,
    kv_cache_scales: Float32[Array, "num_pages page_size kv_groups packing"] | None = None,
    platform: str | None = None,
    cfg: RaggedPageAttentionV3Config | None = None,
    mesh: jax.sharding.Mesh | None = None,
    in_specs: Any = None,
    out_specs: Any = None,
) -> tuple:
    """Ragged paged attention that first writes the new tokens' keys and values into a packed cache.

    Sequence `s < distribution[2]` owns the tokens `query_start_loc[s]:query_start_loc[s + 1]` (its queries and
    new keys and values), the last positions of its `kv_lens[s]`, new tokens included; its pages are
    `block_tables[s * W:(s + 1) * W]`, `W = len(block_tables) // max_seqs`. New token `j` of a sequence with
    `q_len` tokens is written at position `kv_lens[s] - q_len + j`; then every query attends causally over its
    sequence's pages, read after the write. `distribution = [i, j, k]`: sequences `[0, i)` decode one token,
    `[i, j)` are prefill chunks, `[j, k)` mixed, and sequences from `k` on are ignored (not written, output
    rows 0); `i` and `j` are checked but do not change the result. Query head `h` reads kv head
    `h // (num_heads // num_kv_heads)`.

    Scale: `softmax_scale` defaults to 1.0, upstream's default, which leaves the logits unscaled: pass
    `head_dim ** -0.5` (or None) for the usual scaling, the default of every other serving op. With `q_scale`
    the queries are quantised as the cache (`q / q_scale` rounded to its dtype, saturating; the output keeps
    the queries' dtype) and the logits scaled back; `k_scale` scales the logits and `v_scale` the output
    (dequantised K and V).

    Quantised caches: a float8 cache (e4m3fn, e5m2) is read as stored and converted in the kernel; without
    scales the new keys and values come in its dtype and are written as they are. With `kv_cache_scales`
    (float32, the cache's shape without its head dim: `[num_pages, page_size, kv_groups, packing]`, indexed
    as the cache) each cached row is `code * scale`, applied in the kernel (the logits' key columns, the
    probabilities before `p @ v`), never as a dequantised copy; the new keys and values (any float dtype)
    are quantised as they are written, each token-head on its own: `scale = max|x| / M` over the head dim
    (`M` = 448 for e4m3fn, 57344 for e5m2, 127 for int8; a zero row gets scale 1) and `code = x / scale`
    cast (int8: rounded, clipped to [-127, 127]); the updated scales are returned as a third output. An
    int8 cache needs the scales. `q_scale`, `k_scale` and `v_scale` multiply on top.

    Cache layout: one packed cache `[num_pages, page_size, ceil(2 * num_kv_heads / packing), packing, D128]`,
    `packing = 32 // bits(dtype)` (1 for float32, 2 for 16-bit, 4 for 8-bit dtypes) and `D128` the head dim
    rounded up to a multiple of 128 (zero-padded). Combined head `c` sits at `[page, slot, c // packing,
    c % packing]`; `c = 2h` is key head `h` and `c = 2h + 1` its value. `ragged_page_attention_v2` keeps the
    same interleaving unpacked (`[num_pages, page_size, 2 * num_kv_heads, head_dim]`), `page_attention` and
    `unified_attention` separate K and V caches. `ejkernel.utils.make_dummy_rpa_inputs` builds valid inputs.
    Under `jax.jit(..., donate_argnums=3)` the cache is updated in place (only the new rows are written).

    Index values: outside `jit`, a bad one raises a ValueError naming it: `distribution` not
    `0 <= i <= j <= k <= max_seqs`, a sequence below `i` with other than one token, `query_start_loc` not
    rising from 0 to at most `tokens`, a `kv_lens` entry outside `[q_len, W * page_size]`, or a `block_tables`
    entry it reaches outside `[0, num_pages)` (only the first `k` sequences are checked). Under `jit` they are
    checked only with `EJKERNEL_CHECKS=1` (a bad one then stops the program with that message); otherwise
    `distribution[2]` is clamped to `[0, max_seqs]`; `query_start_loc` to `[0, tokens]` and made non-decreasing
    (a running max; tokens of no sequence give zeros); `kv_lens` to `[0, W * page_size]` (new tokens it puts
    before position 0 are not written and give zeros); a `block_tables` entry it reaches outside
    `[0, num_pages)` holds no keys (its positions are masked) and is not written; of new tokens naming one
    cache row, the last wins.

    Sharding: with `mesh`, `in_specs` and `out_specs` (all three or none) the call runs under `shard_map`.
    Only heads may be split: queries, new keys and values and the cache's group axis (axis 2) alike; never
    tokens, pages, head dims or the index arrays. `out_specs` is a pair, the output's spec and the cache's
    (its layout), splitting the heads as the inputs do; with `kv_cache_scales` a triple, the scales' last.

    Args:
        queries: `[tokens, num_heads, head_dim]` float, any float dtype (the output keeps it). Every
            sequence's queries, packed back to back.
        keys: `[tokens, num_kv_heads, head_dim]`, `kv_cache`'s dtype (with scales: any float dtype, quantised on
            write). The new tokens' keys; `num_heads` must be a multiple of `num_kv_heads`.
        values: `[tokens, num_kv_heads, head_dim]`, `keys`' dtype. The new tokens' values.
        kv_cache: `[num_pages, page_size, ceil(2 * num_kv_heads / packing), packing, D128]` float, or int8 with
            scales. The packed K/V cache (above).
        kv_lens: `[max_seqs]` int. Each sequence's length, its new tokens included.
        block_tables: `[max_seqs * W]` int, flat. Sequence `s`'s pages in order at `[s * W:(s + 1) * W]`;
            entries past `ceil(kv_lens[s] / page_size)` are not read.
        query_start_loc: `[max_seqs + 1]` int. The sequences' token bounds, rising from 0.
        distribution: `[3]` int. `[i, j, k]`: sequences `[0, i)` decode, `[i, j)` prefill, `[j, k)` mixed; the
            first `k` are processed.
        softmax_aux: `[num_heads]` float or None, default None (positional only, as every tensor). Per-head
            sink logits, in the softmax denominator only.
        softmax_scale: `float | None`, default 1.0 (logits not scaled). Multiplies the logits `q·k`; None:
            `head_dim ** -0.5`.
        sliding_window: `int | None`, default None. A positive `w` keeps keys `q - w + 1 <= k <= q`.
        logits_soft_cap: `float | None`, default None. A positive `c` caps the scaled logits as
            `c * tanh(s / c)`.
        q_scale: `float | None`, default None. Positive, finite: quantise the queries (above).
        k_scale: `float | None`, default None. Positive, finite: multiplies the logits.
        v_scale: `float | None`, default None. Positive, finite: multiplies the output.
        vmem_limit_bytes: `int | None`, default None. Upstream's TPU memory limit: ignored.
        kv_cache_scales: `[num_pages, page_size, kv_groups, packing]` float32 or None, default None (keyword
            only, beyond upstream's surface). Per-token-head scales of a quantised `kv_cache` (above); required
            for int8. Donated with the cache, it is updated in place.
        platform: `str | None`, default None ("auto": Triton on a GPU where it serves the call, else XLA).
            "xla", "triton" (GPU) or "pallas" (TPU) asks for that one.
        cfg: `RaggedPageAttentionV3Config | None`, default None (chosen by the executor). The tiling; it never
            changes the result.
        mesh: `jax.sharding.Mesh | None`, default None. The mesh to shard the call over (see Sharding).
        in_specs: sequence of `PartitionSpec` or None, default None. One per tensor passed, or one per
            positional slot.
        out_specs: pair of `PartitionSpec` or None, default None. The output's and the cache's specs (and the
            scales', with `kv_cache_scales`).

    Returns:
        tuple: `(out, kv_cache)`, or `(out, kv_cache, kv_cache_scales)` with scales. `out` is
        `[tokens, num_heads, head_dim]` in `queries`' dtype (rows of tokens no processed sequence owns are 0);
        `kv_cache` the updated cache, of the input's shape and dtype; `kv_cache_scales` the updated scales.

    Raises:
        TypeError: an array of the wrong rank, kind (float or int) or size against the others (one line
            naming it), `keys`, `values` and `kv_cache` of different dtypes (with scales: `keys` and `values`
            of different or non-float dtypes), an int8 cache without scales, scales with a 16/32-bit cache or
            not float32, an option of the wrong type, or `cfg` not a `RaggedPageAttentionV3Config`.
        ValueError: `num_heads` not a multiple of `num_kv_heads`; `kv_cache` not the packed shape for `keys`' heads,
            `head_dim` and its dtype; `kv_cache_scales` not the cache's shape without its last axis; `query_start_loc`
            not `[max_seqs + 1]`; `len(block_tables)` not a multiple of `max_seqs`; `q_scale`, `k_scale` or `v_scale`
            not positive and finite; `softmax_scale` not finite; `logits_soft_cap` not positive; `sliding_window` below
            1; a `platform` not listed, contradicting `cfg.platform` or with no implementation on this device; `mesh`,
            `in_specs`, `out_specs` not given together, or specs that split anything but the heads; outside `jit`, a bad
            index value.
        jax.errors.JaxRuntimeError: under `jit` with `EJKERNEL_CHECKS=1`, a bad index value, when the program
            runs (the message is the ValueError's).

    Example:
        >>> import jax.numpy as jnp
        >>> from ejkernel.modules import ragged_page_attention_v3
        >>> queries = jnp.ones((5, 4, 16), jnp.bfloat16)  # 5 tokens, 4 query heads, head_dim 16
        >>> keys = values = jnp.ones((5, 2, 16), jnp.bfloat16)  # the tokens' new keys and values, 2 kv heads
        >>> kv_cache = jnp.zeros((4, 8, 2, 2, 128), jnp.bfloat16)  # 4 pages of 8; 4 combined heads, 2 a word
        >>> kv_lens = jnp.array([3, 4])  # sequence 0 decodes its 3rd token, sequence 1 prefills 4
        >>> block_tables = jnp.array([0, 1, 2, 3])  # W = 2 pages per sequence
        >>> query_start_loc, distribution = jnp.array([0, 1, 5]), jnp.array([1, 1, 2])
        >>> out, kv_cache = ragged_page_attention_v3(
        ...     queries, keys, values, kv_cache, kv_lens, block_tables, query_start_loc, distribution,
        ...     softmax_scale=16**-0.5)  # the usual scaling; the default 1.0 leaves the logits unscaled
        >>> out.shape, out.dtype
        ((5, 4, 16), dtype(bfloat16))
        >>> bool((kv_cache[2, :4, 0, 0, :16] == 1).all())  # sequence 1's keys (head 0), written to its page 2
        True
    """
    num_tokens, num_heads, head_dim = queries.shape
    num_kv_heads = keys.shape[1]
    num_pages, page_size = kv_cache.shape[:2]
    max_seqs = kv_lens.shape[0]
    check_heads(num_heads, num_kv_heads)
    if kv_cache_scales is None:
        check_same_dtype("keys, values and kv_cache", keys, values, kv_cache)
    else:
        check_same_dtype("keys and values", keys, values)
    check_cache_scales("kv_cache", kv_cache, "kv_cache_scales", kv_cache_scales)
    expected = v3_cache_shape(num_pages, page_size, num_kv_heads, head_dim, kv_cache.dtype)
    check_shape("kv_cache", kv_cache, expected, "[pages, page_size, ceil(2 Hkv / packing), packing, D_pad128]")
    check_shape("query_start_loc", query_start_loc, (max_seqs + 1,), "[max_seqs + 1]")
    if block_tables.shape[0] % max(max_seqs, 1):
        raise ValueError(
            f"block_tables must hold max_seqs ({max_seqs}) x pages_per_seq entries, got {block_tables.shape[0]}"
        )
    check_sinks("softmax_aux", softmax_aux, num_heads, per_head=True)
    for name, value in (("q_scale", q_scale), ("k_scale", k_scale), ("v_scale", v_scale)):
        _positive_scale(name, value)
    options = dict(
        softmax_scale=resolve_scale(softmax_scale, head_dim),
        sliding_window=sliding_window,
        logits_soft_cap=check_soft_cap(logits_soft_cap),
        q_scale=q_scale,
        k_scale=k_scale,
        v_scale=v_scale,
    )
    if kv_cache_scales is not None:
        options["kv_cache_scales"] = kv_cache_scales
    last_positions_window(sliding_window)
    distribution_ok = check_distribution(distribution, query_start_loc, max_seqs, decode_counts=True)
    check_sequence_values(
        page_tables=block_tables,
        kv_len=kv_lens,
        page_size=page_size,
        num_pages=num_pages,
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
    )
    return executor(
        RaggedPageAttentionV3(),
        queries,
        keys,
        values,
        kv_cache,
        kv_lens,
        block_tables,
        query_start_loc,
        distribution,
        softmax_aux,
        platform=platform,
        cfg=cfg,
        mesh=mesh,
        in_specs=in_specs,
        out_specs=out_specs,
        **options,
    )
