"""`native_sparse_attention` (NSA): a compressed branch over block means, a selected branch over chosen blocks
and an optional sliding-window branch.

The block size belongs to the call (`block_size=`, default 64, or the caller's own `cfg=`'s, as upstream
reads it): it changes the result, so no config from a cache, an overlay or the autotuner chooses it. The
public function checks the arguments; every implementation shares the compressed branch and the choice of
blocks (`ejkernel.kernels._common.sparse_attention.native_sparse.native_selection`) and computes the
selected branch, whose cost follows the number of selected blocks.
"""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from ejkernel.kernels._common.bounds import check_packed, clamp_packed
from ejkernel.kernels._common.checks import require_float, require_int
from ejkernel.modules.operations._common import executor, require_rank, typechecked
from ejkernel.ops import Invocation, Kernel, KernelConfig
from ejkernel.registry import Backend, Platform, implementations

IMPLEMENTATIONS = implementations(
    "native_sparse_attention",
    (Platform.TRITON, Backend.GPU, "ejkernel.kernels._triton.native_sparse_attention:native_sparse_attention_triton"),
    (Platform.XLA, Backend.ANY, "ejkernel.kernels._xla.native_sparse_attention:native_sparse_attention_xla"),
)

DEFAULT_BLOCK_SIZE = 64


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


@dataclasses.dataclass(frozen=True)
class NativeSparseAttentionConfig(KernelConfig):
    """`fwd_params`/`bwd_params`: the kernels' warps and stages.

    `block_size` is upstream's field: set in the `cfg=` a caller passes (and no `block_size=` given), it is
    the call's block size, as upstream reads it. A config from any other tier (overlay, caches, autotuner,
    shipped) whose `block_size` differs from the call's is refused (ValueError) when it runs: a config there
    may not change the result. Values out of range are a ValueError when the config is built.

    Attributes:
        platform: Default `"auto"`. `"auto"`, `"xla"` or `"triton"` (the platforms with an implementation).
        fwd_params: Default None. `FwdParams` of the forward kernels (`num_warps`, `num_stages`).
        bwd_params: Default None. `BwdParams` of the backward kernels.
        backend: Default `"any"`. The device kind the config is meant for (`"gpu"`, `"tpu"`, `"cpu"`); a call
            on another kind is refused (ValueError).
        block_size: Default None, meaning the call's. A positive int: in the caller's `cfg=`, the call's
            block size unless `block_size=` is given (then they must agree); elsewhere, the call's.

    Example:
        >>> from ejkernel.modules import NativeSparseAttentionConfig
        >>> NativeSparseAttentionConfig(platform="xla").block_size is None
        True
    """

    block_size: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.block_size is not None and not _positive_int(self.block_size):
            raise ValueError(
                f"NativeSparseAttentionConfig.block_size must be a positive integer or None, got {self.block_size!r}"
            )


class NativeSparseAttention(Kernel):
    """The `Kernel` the executor runs for `native_sparse_attention` (op id `"native_sparse_attention"`).

    It takes the nine tensors of `native_sparse_attention` (an int `block_counts` travels as an option) and
    passes `block_size` to the implementations; call `native_sparse_attention` rather than this class.
    Implementations: Triton (GPU), then XLA.
    """

    op_id = "native_sparse_attention"
    config_type = NativeSparseAttentionConfig

    def axis_roles(self, args, kwargs):
        """q, k, v `[B, S, H, D]`, gates `[B, S, H]`, block indices / counts `[B, S, Hkv, ...]` split by batch
        and heads alike (the sequence is the op's own check)."""
        per_token = ("batch", None, "heads")
        inputs = {0: ("query", (*per_token, "dim")), 1: ("key", (*per_token, "dim")), 2: ("value", (*per_token, "dim"))}
        for i, name in ((3, "g_cmp"), (4, "g_slc"), (5, "block_indices"), (6, "block_counts"), (8, "g_swa")):
            inputs[i] = (name, per_token)
        inputs[7] = ("cu_seqlens", ("tokens",))
        return inputs, (*per_token, None)

    def call_impl(self, impl, args, kwargs, cfg):
        kwargs = dict(kwargs)
        counts = kwargs.pop("block_counts", None)  # an int travels as an option, an array as a tensor
        args = list(args)
        if counts is not None:
            args[6] = counts
        block_size = kwargs.pop("block_size", DEFAULT_BLOCK_SIZE)
        if cfg.block_size not in (None, block_size):
            raise ValueError(
                f"native_sparse_attention: cfg.block_size={cfg.block_size} differs from the call's "
                f"block_size={block_size}; a config cannot change the result: pass block_size= instead"
            )
        return impl.fn(*args, block_size=block_size, fwd_params=cfg.fwd_params, bwd_params=cfg.bwd_params, **kwargs)

    def platform_cfgs(self, platform: str, inv: Invocation):
        yield NativeSparseAttentionConfig(platform=platform)

    def kwarg_specs(self, kwargs: dict[str, Any], in_specs) -> dict[str, Any]:
        """No array options; refuses a sharded sequence (blocks and causality span the whole sequence)."""
        for spec in in_specs[:3]:
            if spec is not None and len(tuple(spec)) > 1 and tuple(spec)[1] is not None:
                raise ValueError(
                    f"native_sparse_attention: in_specs shard the sequence axis over {tuple(spec)[1]!r}; blocks and "
                    "causality span the whole sequence: shard batch or heads instead"
                )
        return {}


@typechecked
def native_sparse_attention(
    query: Float[Array, "batch seq heads dim"],
    key: Float[Array, "batch seq kv_heads dim"],
    value: Float[Array, "batch seq kv_heads dim_v"],
    g_cmp: Float[Array, "batch seq heads"] | None = None,
    g_slc: Float[Array, "batch seq heads"] | None = None,
    block_indices: Int[Array, "batch seq kv_heads num_selected"] | None = None,
    block_counts: Int[Array, "batch seq kv_heads"] | int = 16,
    cu_seqlens: Int[Array, " n_plus_1"] | None = None,
    g_swa: Float[Array, "batch seq heads"] | None = None,
    /,
    *,
    softmax_scale: float | None = None,
    window_size: int = 0,
    block_size: int | None = None,
    platform: str | None = None,
    cfg: NativeSparseAttentionConfig | None = None,
    mesh: jax.sharding.Mesh | None = None,
    in_specs: Any = None,
    out_specs: Any = None,
) -> Float[Array, "batch seq heads dim_v"]:
    """`g_slc · selected + g_cmp · compressed + g_swa · sliding` attention (native sparse attention, NSA).

    Layout `[batch, seq, heads, dim]`, one sequence for queries and keys; any head ratio, query head `h`
    reading key/value head `h // (heads // kv_heads)`. Per sequence (a batch row, or with `cu_seqlens` and
    batch 1 each packed sequence), keys in blocks of `block_size` tokens counted from the sequence's start:

    - compressed branch (only with `g_cmp`): query t attends the means of the complete blocks that end at
      or before it;
    - selected branch: query t attends the keys `s <= t` of the blocks listed for it and its key/value head:
      the first `block_counts` entries of `block_indices` (-1 lists nothing; repeats count once), or without
      indices the top `block_counts` blocks by the compressed branch's probability summed over the head's
      query heads, with the query's own block always first; without `g_slc` it enters ungated;
    - sliding branch (with `g_swa` and `window_size > 0`, both or neither): query t attends the keys
      `t - window_size < s <= t` of its sequence. API.md's signature has no such branch: the gate comes as a
      trailing positional tensor and the window as a keyword, as in flash-linear-attention's NSA, so calls
      without them are unchanged.

    Differentiable in query, key, value and the gates; the block choice is not differentiated.
    `block_size` belongs to the call, as it changes the result: the argument, else the `cfg=` passed (as
    upstream reads `cfg.block_size`), else 64; a config from another tier cannot change it. The tensors
    are positional-only, the options keyword-only.

    Args:
        query: `[batch, seq, heads, dim]`, float (Triton: float16, bfloat16 or float32).
        key: `[batch, seq, kv_heads, dim]` in query's dtype, with `heads % kv_heads == 0`.
        value: `[batch, seq, kv_heads, dim_v]` in query's dtype.
        g_cmp: Default None (no compressed branch in the output). Float `[batch, seq, heads]`: its gate.
        g_slc: Default None (the selected branch ungated). Float `[batch, seq, heads]`: its gate.
        block_indices: Default None (blocks chosen from the compressed branch). Int
            `[batch, seq, kv_heads, n]`: block numbers within each token's sequence; blocks after the token's
            own are ignored. Entries outside `[-1, blocks of the sequence)` are a ValueError outside `jit`;
            under `jit` such an entry lists nothing.
        block_counts: Default 16. A non-negative int, or int `[batch, seq, kv_heads]` per token: how many
            blocks each token attends (the first entries of `block_indices`, or the top ones chosen).
        cu_seqlens: Default None. Int `[N + 1]`: bounds of N sequences packed into one row (batch must be 1),
            rising from 0 to exactly `seq`. Other bounds are a ValueError outside `jit`; under it each is
            clamped into `[previous bound, seq]`, the first to 0 and the last to `seq` (a sequence past the
            end is empty), and `EJKERNEL_CHECKS=1` raises the eager error.
        g_swa: Default None (no sliding branch). Float `[batch, seq, heads]`: its gate; needs
            `window_size > 0`.
        softmax_scale: Default None, meaning `dim ** -0.5`.
        window_size: Default 0 (no sliding branch). A non-negative int; a positive one needs `g_swa`.
        block_size: Default None: the `cfg=` given's `block_size` if set, else 64. Tokens per block, a
            positive int (Triton: a power of two of at least 16).
        platform: Default None, meaning `"auto"`: Triton on GPUs where it accepts the call, else XLA. One of
            `"auto"`, `"xla"`, `"triton"`.
        cfg: Default None. A `NativeSparseAttentionConfig`; its `block_size`, when set, is the call's block
            size (and must equal `block_size=` when both are given).
        mesh: Default None. A `jax.sharding.Mesh`: with `in_specs` and `out_specs` (the three or none) the
            call runs under `jax.shard_map`.
        in_specs: Default None. A `PartitionSpec` per tensor passed (or per positional slot); shard batch or
            heads alike, never the sequence.
        out_specs: Default None. The output's `PartitionSpec`.

    Returns:
        `[batch, seq, heads, dim_v]` in query's dtype.

    Raises:
        TypeError: a rank, dtype or size the annotations refuse (one line naming the argument), query, key
            and value of different dtypes, non-float gates, a non-integer `block_indices`, or a bool
            `block_counts`.
        ValueError: `heads` not a multiple of `kv_heads`; a `block_size` that is not a positive int; negative
            `block_counts`; bad `block_indices` or `cu_seqlens` values (see above); `cu_seqlens` with
            `batch != 1`; `g_swa` without `window_size > 0` or the reverse; a negative `window_size`; a
            `cfg.block_size` other than `block_size`; a platform that is unknown or has no implementation on
            this device; `mesh`, `in_specs`, `out_specs` not given together, or specs that shard the sequence.
        NotImplementedError: a requested platform that declines the call (Triton: another dtype, a head dim
            over 256, a `block_size` that is not a power of two of at least 16).

    Example:
        >>> import jax, numpy as np
        >>> from ejkernel.modules import native_sparse_attention
        >>> rng = np.random.default_rng(0)
        >>> q = rng.standard_normal((1, 32, 4, 8), np.float32)
        >>> kv = rng.standard_normal((1, 32, 2, 8), np.float32)
        >>> gate = np.full((1, 32, 4), 0.5, np.float32)  # g_cmp and g_slc
        >>> nsa = jax.jit(lambda q, kv, g: native_sparse_attention(q, kv, kv, g, g, None, 2, block_size=8))
        >>> out = nsa(q, kv, gate)  # per query: 2 selected blocks of 8 keys, and the compressed branch
        >>> out.shape, bool(np.isfinite(out).all())
        ((1, 32, 4, 8), True)
    """
    for name, x in (("query", query), ("key", key), ("value", value)):
        require_float(name, x)
        require_rank(name, x, (4,), "[batch, seq, heads, dim]")
    if key.dtype != query.dtype or value.dtype != query.dtype:
        raise TypeError(f"query, key and value must share a dtype, got {query.dtype}, {key.dtype}, {value.dtype}")
    batch, seq_len, heads, _ = query.shape
    if heads % key.shape[2]:
        raise ValueError(f"query heads ({heads}) must be a multiple of key/value heads ({key.shape[2]})")
    for name, g in (("g_cmp", g_cmp), ("g_slc", g_slc), ("g_swa", g_swa)):
        if g is not None:
            require_float(name, g)
    if block_indices is not None:
        require_int("block_indices", block_indices)
    if block_size is None:  # the caller's own config speaks for the call, as upstream reads it
        block_size = getattr(cfg, "block_size", None) or DEFAULT_BLOCK_SIZE
    if not _positive_int(block_size):
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    if isinstance(block_counts, bool):
        raise TypeError(f"block_counts must be an int or an integer array, got {block_counts!r}")
    if isinstance(block_counts, int):
        if block_counts < 0:
            raise ValueError(f"block_counts must be non-negative, got {block_counts}")
    else:
        require_int("block_counts", block_counts)
    if cu_seqlens is not None:
        check_packed("cu_seqlens", cu_seqlens, seq_len, exact=True)
        cu_seqlens = clamp_packed(cu_seqlens, seq_len, exact=True)
        if batch != 1:
            raise ValueError(f"with cu_seqlens the sequences are packed into one row: batch must be 1, got {batch}")
    counts_option = {"block_counts": int(block_counts)} if isinstance(block_counts, int) else {}
    counts_tensor = None if isinstance(block_counts, int) else block_counts
    tensors = (query, key, value, g_cmp, g_slc, block_indices, counts_tensor, cu_seqlens, g_swa)
    if query.size == 0:  # no tokens: nothing to attend
        return jnp.zeros((*query.shape[:3], value.shape[-1]), query.dtype)
    return executor(
        NativeSparseAttention(),
        *tensors,
        platform=platform,
        cfg=cfg,
        mesh=mesh,
        in_specs=in_specs,
        out_specs=out_specs,
        softmax_scale=None if softmax_scale is None else float(softmax_scale),
        window_size=window_size,
        block_size=block_size,
        **counts_option,
    )
