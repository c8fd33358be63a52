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
from jaxtyping import Array, Float, Int

from ejkernel.kernels._common.paged_attention import (
    check_distribution,
    check_heads,
    check_same_dtype,
    check_sequence_values,
    check_shape,
    check_sinks,
    check_soft_cap,
    last_positions_window,
    resolve_scale,
    v3_cache_shape,
)
from ejkernel.modules.operations._common import executor, typechecked
from ejkernel.modules.operations.page_attention import PagedAttentionConfig, PagedAttentionKernel, busy_sequences
from ejkernel.ops.axis_roles import sink_roles


@dataclasses.dataclass(frozen=True)
class RaggedPageAttentionV3Config(PagedAttentionConfig):
    """Tiling of `ragged_page_attention_v3` (see `PagedAttentionConfig`); `chunk_prefill_size` is upstream's
    cap on prefill tokens per kernel call, accepted for its TPU schedule (our cores take any mix in one call)."""

    chunk_prefill_size: int | None = None

    knob_fields: ClassVar[tuple[str, ...]] = (*PagedAttentionConfig.knob_fields, "chunk_prefill_size")


class RaggedPageAttentionV3(PagedAttentionKernel):
    op_id = "ragged_page_attention_v3"
    config_type = RaggedPageAttentionV3Config

    def axis_roles(self, args, kwargs):
        """Heads only: queries, new keys / values and the cache's K/V groups alike; tokens, pages and the
        per-sequence tables never. The updated cache keeps the cache's layout."""
        queries, sinks = args[0], args[8]
        inputs = {0: ("queries", ("tokens", "heads", "dim")), 1: ("keys", ("tokens", "heads", "dim"))}
        inputs |= {2: ("values", ("tokens", "heads", "dim")), 3: ("kv_cache", ("pages", None, "heads", None, "dim"))}
        for i, name in ((4, "kv_lens"), (5, "block_tables"), (6, "query_start_loc"), (7, "distribution")):
            inputs[i] = (name, ("tokens",))
        if sinks is not None:
            inputs[8] = ("softmax_aux", sink_roles(sinks, queries.shape[1]))
        return inputs, (("tokens", "heads", None), ("pages", None, "heads", None, None))

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
    kv_cache: Float[Array, "num_pages page_size kv_groups packing padded_dim"],
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
    platform: str | None = None,
    cfg: RaggedPageAttentionV3Config | None = None,
    mesh: jax.sharding.Mesh | None = None,
    in_specs: Any = None,
    out_specs: Any = None,
) -> tuple[Float[Array, "tokens num_heads head_dim"], Float[Array, "num_pages page_size kv_groups packing padded_dim"]]:
    """Mixed prefill/decode attention that first appends the new keys/values to the cache: `(out, kv_cache)`.

    Sequence `s < distribution[2]` has queries (and new keys/values) at tokens
    `query_start_loc[s] : query_start_loc[s + 1]`, the last positions of its `kv_lens[s]` (new tokens
    included); its pages are `block_tables[s * W : (s + 1) * W]`, `W = len(block_tables) // max_seqs`.
    New token j of sequence s is written at position `kv_lens[s] - q_len + j`, then every query
    attends causally over its sequence's pages. `distribution = [i, j, k]`: sequences `[0, i)` decode
    one token, `[i, j)` are prefill chunks, `[j, k)` mixed, and sequences from `k` on are ignored (not
    written, output rows 0).

    The default `softmax_scale` is 1.0 (None: `D**-0.5`). With `q_scale` the queries are quantised as
    the cache (`q / q_scale` rounded to its dtype, saturating; the output keeps the queries' dtype) and
    the logits scaled back; `k_scale` scales the logits and `v_scale` the output (dequantised K and V).
    Soft cap `c·tanh(s/c)`; `sliding_window=w` keeps keys `q - w + 1 <= k <= q`; `softmax_aux [Hq]` are
    per-head sink logits. `vmem_limit_bytes` steers TPU schedules only.

    Under `jax.jit(..., donate_argnums=3)` the cache is updated in place (only the new rows are
    written).

    Index values: a bad one raises a ValueError outside `jit` (under `jit` too with `EJKERNEL_CHECKS=1`);
    otherwise under `jit`, `distribution[2]` is clamped to `[0, max_seqs]` (`[0:2]` only steer TPU
    schedules); `query_start_loc` to `[0, tokens]` and made non-decreasing (a running max; tokens of no
    sequence give zeros); `kv_lens` to `[0, W·page_size]` (new tokens it puts before position 0 are not
    written and give zeros); a `block_tables` entry it reaches outside `[0, num_pages)` holds no keys
    (its positions are masked) and is not written; of new tokens naming one cache row, the last wins.
    """
    num_tokens, num_heads, head_dim = queries.shape
    num_kv_heads = keys.shape[1]
    num_pages, page_size = kv_cache.shape[:2]
    max_seqs = kv_lens.shape[0]
    check_heads(num_heads, num_kv_heads)
    check_same_dtype("keys, values and kv_cache", keys, values, kv_cache)
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
