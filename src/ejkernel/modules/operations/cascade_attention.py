"""`cascade_attention`: decode attention for a batch whose sequences share one prefix, reading the prefix once."""

import dataclasses

import jax
from jaxtyping import Array, Float, Int

from ejkernel.kernels._common.checks import require_float
from ejkernel.modules.operations._common import executor, require_rank, typechecked
from ejkernel.ops import Kernel, KernelConfig
from ejkernel.registry import Backend, Platform, implementations

IMPLEMENTATIONS = implementations(
    "cascade_attention",
    (Platform.TRITON, Backend.GPU, "ejkernel.kernels._triton.cascade_attention:cascade_attention_triton"),
    (Platform.XLA, Backend.ANY, "ejkernel.kernels._xla.cascade_attention:cascade_attention_xla"),
)
"""Both run the serving ops' paged core twice (the prefix once for the batch, the own pages per sequence) and
merge the two by log-sum-exp; on a GPU the Pallas-Triton kernel, elsewhere plain JAX."""


@dataclasses.dataclass(frozen=True)
class CascadeAttentionConfig(KernelConfig):
    """How `cascade_attention` runs: only the platform (`"auto"`, `"triton"` or `"xla"`) and `backend` so far.

    Raises:
        ValueError: An unknown `platform` or `backend`.
    """


class CascadeAttention(Kernel):
    """The executor's `Kernel` for `cascade_attention`: op id `"cascade_attention"`.

    A mesh may split the heads (query heads with the key/value heads of the prefix and the caches) and the
    sequences (queries, lengths and tables; prefix and caches then replicated); never a prefix or a page axis.
    """

    op_id = "cascade_attention"
    config_type = CascadeAttentionConfig

    def axis_roles(self, args, kwargs):
        prefix = (None, "heads", "dim")
        cache = ("pages", "heads", None, "dim")
        inputs = {0: ("query", ("batch", "heads", "dim")), 1: ("prefix_key", prefix), 2: ("prefix_value", prefix)}
        inputs |= {3: ("key_cache", cache), 4: ("value_cache", cache), 5: ("context_lens", ("batch",))}
        inputs |= {6: ("block_tables", ("batch", None)), 7: ("softmax_aux", ("heads",))}
        return inputs, ("batch", "heads", "dim")

    def platform_cfgs(self, platform, inv):
        yield CascadeAttentionConfig(platform=platform)


@typechecked
def cascade_attention(
    query: Float[Array, "num_seqs num_heads head_dim"],
    prefix_key: Float[Array, "prefix_len num_kv_heads head_dim"],
    prefix_value: Float[Array, "prefix_len num_kv_heads head_dim"],
    key_cache: Float[Array, "num_pages num_kv_heads page_size head_dim"],
    value_cache: Float[Array, "num_pages num_kv_heads page_size head_dim"],
    context_lens: Int[Array, " num_seqs"],
    block_tables: Int[Array, "num_seqs max_blocks"],
    softmax_aux: Float[Array, " num_heads"] | None = None,
    /,
    *,
    softmax_scale: float | None = None,
    logits_soft_cap: float | None = None,
    platform: str | None = None,
    cfg: CascadeAttentionConfig | None = None,
    mesh: jax.sharding.Mesh | None = None,
    in_specs=None,
    out_specs=None,
) -> Float[Array, "num_seqs num_heads head_dim"]:
    """Decode attention of sequences that all begin with one shared prefix, the prefix read once for the batch.

    Sequence i's keys are the prefix's `prefix_len` tokens followed by its own `context_lens[i]` tokens, held
    in the pages `block_tables[i]` lists (`page_attention`'s cache layout); its one query (the next token)
    attends to all of them. Decoding many continuations of one prompt (parallel sampling, beam search, a
    shared system prompt) this way reads the prefix's keys and values once instead of once per sequence:
    the batch's queries attend to the prefix together, each attends to its own pages apart, and the two
    partial results are joined by their log-sum-exps (`merge_attention_states`). Exact: the same softmax as
    one pass over the concatenated keys, up to rounding. Query head h reads key/value head
    `h // (num_heads // num_kv_heads)`. A sequence with no own token attends to the prefix alone.

    Args:
        query: `[num_seqs, num_heads, head_dim]` float, one query per sequence.
        prefix_key: `[prefix_len, num_kv_heads, head_dim]` in query's dtype: the shared prefix's keys.
        prefix_value: `[prefix_len, num_kv_heads, head_dim]`: its values.
        key_cache: `[num_pages, num_kv_heads, page_size, head_dim]`: the sequences' own keys, in pages.
        value_cache: Same layout: their values.
        context_lens: `[num_seqs]` int32: each sequence's own token count (the prefix not included).
        block_tables: `[num_seqs, max_blocks]` int32: each sequence's pages in order; only the first
            `ceil(context_lens[i] / page_size)` entries are read.
        softmax_aux: `[num_heads]` float sink logits joining every row's denominator once; None (default): none.
        softmax_scale: Default None, meaning `head_dim ** -0.5`.
        logits_soft_cap: Default None. A positive `c`: logits become `c · tanh(logits / c)`.
        platform: `"auto"`, `"triton"` (GPU) or `"xla"`; None (default): `cfg.platform`, else auto.
        cfg: A `CascadeAttentionConfig`; None (default): the executor's choice.
        mesh: A `jax.sharding.Mesh` to run the op on under `shard_map`; None (default): no sharding. Needs
            `in_specs` and `out_specs`.
        in_specs: A `PartitionSpec` per tensor passed: heads may split (all alike), sequences may split (the
            prefix and caches then whole); the prefix and page axes never.
        out_specs: The output's spec, laid out as the query.

    Returns:
        `[num_seqs, num_heads, head_dim]` in query's dtype.

    Raises:
        TypeError: A rank, dtype or size the annotations refuse (one line naming the argument), or prefix and
            caches of another dtype than the query.
        ValueError: `num_heads` not a multiple of `num_kv_heads`; a non-positive `logits_soft_cap`; specs that
            split a prefix or page axis, or heads unlike each other; a `platform` that is unknown, has no
            implementation on this device or contradicts `cfg.platform`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from ejkernel.modules import cascade_attention
        >>> normal = lambda i, shape: jax.random.normal(jax.random.PRNGKey(i), shape)
        >>> q = normal(0, (3, 4, 16))  # 3 sequences, 4 heads
        >>> prefix_k, prefix_v = normal(1, (40, 2, 16)), normal(2, (40, 2, 16))  # a 40-token shared prompt
        >>> caches = normal(3, (6, 2, 8, 16)), normal(4, (6, 2, 8, 16))  # 6 pages of 8 tokens
        >>> lens, tables = jnp.array([5, 0, 12]), jnp.array([[0, 5], [1, 1], [2, 4]])
        >>> cascade_attention(q, prefix_k, prefix_v, *caches, lens, tables).shape
        (3, 4, 16)
    """
    require_float("query", query)
    keys = {"prefix_key": prefix_key, "prefix_value": prefix_value, "key_cache": key_cache, "value_cache": value_cache}
    for name, x in keys.items():
        if x.dtype != query.dtype:
            raise TypeError(f"cascade_attention: {name} must have query's dtype {query.dtype}, got {x.dtype}")
    require_rank("query", query, (3,), "[num_seqs, num_heads, head_dim]")
    if query.shape[1] % prefix_key.shape[1]:
        raise ValueError(
            f"cascade_attention: num_heads ({query.shape[1]}) must be a multiple of num_kv_heads "
            f"({prefix_key.shape[1]})"
        )
    if logits_soft_cap is not None and not logits_soft_cap > 0:
        raise ValueError(f"cascade_attention: logits_soft_cap must be positive, got {logits_soft_cap}")
    return executor(
        CascadeAttention(),
        query,
        prefix_key,
        prefix_value,
        key_cache,
        value_cache,
        context_lens,
        block_tables,
        softmax_aux,
        softmax_scale=query.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale),
        logits_soft_cap=None if logits_soft_cap is None else float(logits_soft_cap),
        platform=platform,
        cfg=cfg,
        mesh=mesh,
        in_specs=in_specs,
        out_specs=out_specs,
    )
