"""`blocksparse_attention`: attention whose cost follows the density of its block mask.

Layout `[batch, heads, seq, dim]` (unlike the other dense ops). The public function checks the
arguments and reduces every way of giving a mask (`mask_info`, `attention_mask`, `mask_builder`,
`causal`, `sliding_window`, `chunk_size`) to one canonical mask (see
`ejkernel.kernels._common.sparse_attention.masks`); each implementation builds the block table of its tiling
from it once per call and never visits an empty block.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec
from jax.typing import ArrayLike
from jaxtyping import Array, Float

from ejkernel.kernels._common.attention import canonical_sinks
from ejkernel.kernels._common.checks import require_float
from ejkernel.kernels._common.sparse_attention.masks import canonical_sparse_mask
from ejkernel.modules.operations._attention_args import attention_roles, check_bias
from ejkernel.modules.operations._common import executor, require_rank, typechecked
from ejkernel.ops import BwdParams, FwdParams, Invocation, Kernel, KernelConfig
from ejkernel.registry import Backend, Platform, implementations
from ejkernel.types import MaskInfo
from ejkernel.types.windows import clamp_window

IMPLEMENTATIONS = implementations(
    "blocksparse_attention",
    (
        Platform.PALLAS,
        Backend.GPU,
        "ejkernel.kernels._pallas.gpu.blocksparse_attention:blocksparse_attention_mosaic_gpu",
    ),
    (Platform.PALLAS, Backend.TPU, "ejkernel.kernels._pallas.tpu.blocksparse_attention:blocksparse_attention_tpu"),
    (Platform.TRITON, Backend.GPU, "ejkernel.kernels._triton.blocksparse_attention:blocksparse_attention_triton"),
    (Platform.XLA, Backend.ANY, "ejkernel.kernels._xla.blocksparse_attention:blocksparse_attention_xla"),
)
"""Best first. On an H100 (`exp/bsa_gpu.py`, S=16384 H=16 D=128 bf16, random blocks at 10% / 25%) the Mosaic GPU
kernels trained in 1.83 / 3.98 ms against Triton's 3.23 / 7.10 and matched XLA in all three checks (random blocks
with empty rows; causal + window + segment ids + sinks; soft cap + chunks); calls they decline (bias, dense masks
that vary within a tile or are traced, other dtypes / head dims, non-Hopper GPUs) fall to Triton."""


@dataclasses.dataclass(frozen=True)
class BlockSparseAttentionConfig(KernelConfig):
    """`fwd_params.block_q x block_k`: the tiles of the block table (the sparsity's granularity) and of
    the kernels; `num_warps`/`num_stages` of the forward (`fwd_params`) and backward (`bwd_params`).

    Given as `blocksparse_attention(..., cfg=cfg)`, it replaces the config the executor would select. A
    field left None is the implementation's own default; an implementation that cannot take a tiling
    declines it (NotImplementedError). Values out of range are a ValueError when the config is built.

    Attributes:
        platform: Default `"auto"`. One of `"auto"`, `"xla"`, `"triton"`, `"pallas"` (Mosaic GPU or TPU).
        fwd_params: Default None. `FwdParams`: `block_q`, `block_k` (powers of two), `num_warps`,
            `num_stages`; the Mosaic GPU kernels also read `block_m` and `block_n`.
        bwd_params: Default None. `BwdParams` of the backward, with the same fields.
        backend: Default `"any"`. The device kind the config is meant for (`"gpu"`, `"tpu"`, `"cpu"`); a call
            on another kind is refused (ValueError).

    Example:
        >>> from ejkernel.modules import BlockSparseAttentionConfig
        >>> from ejkernel.ops import FwdParams
        >>> BlockSparseAttentionConfig(fwd_params=FwdParams(block_q=64, block_k=64)).fwd_params.block_q
        64
    """


class BlockSparseAttention(Kernel):
    """The `Kernel` the executor runs for `blocksparse_attention` (op id `"blocksparse_attention"`).

    It takes `(query, key, value, softmax_aux, bias)` in `[batch, heads, seq, dim]` with the canonical mask
    `blocksparse_attention` built (segment ids, a dense mask, causal, window, chunk size); call
    `blocksparse_attention` rather than this class. Differentiated calls get a config of their own
    (autotuning times forward + backward) over a few tilings. Implementations: Pallas (Mosaic GPU on
    Hopper, or TPU), Triton (GPU) and XLA.
    """

    op_id = "blocksparse_attention"
    config_type = BlockSparseAttentionConfig

    def axis_roles(self, args, kwargs):
        return attention_roles(args, bias_at=4, sinks_at=3, heads_first=True)

    # Configs tile the backward too (forward and training calls tuned apart). A mask known while tracing
    # still reaches the implementations concrete: the executor closes over concrete boolean and integer
    # inputs rather than tracing them through its per-mode wrapper.
    tune_argnums = (0, 1, 2)

    def call_impl(self, impl, args, kwargs, cfg):
        return impl.fn(*args, fwd_params=cfg.fwd_params, bwd_params=cfg.bwd_params, **kwargs)

    def platform_cfgs(self, platform: str, inv: Invocation):
        yield BlockSparseAttentionConfig(platform=platform)
        for block_q, block_k in ((64, 64), (128, 64), (128, 128)):
            yield BlockSparseAttentionConfig(platform=platform, fwd_params=FwdParams(block_q=block_q, block_k=block_k))
        if platform == "pallas":  # the Mosaic GPU dQ kernel in 128-key steps: 1.833 against 1.860 ms trained (H100,
            # S=16384 H=16 D=128, 10% of random blocks); where the kernels take no such tiling, the tuner skips it
            yield BlockSparseAttentionConfig(platform=platform, bwd_params=BwdParams(block_k=128))

    def kwarg_specs(self, kwargs: dict[str, Any], in_specs) -> dict[str, Any]:
        """Segment ids follow the batch and sequence sharding of the query and of the keys; a dense mask
        follows the query's batch, heads and sequence and the keys' sequence.

        Refuses specs under which each shard would compute something else: a sharded key sequence
        (every shard would see only its own keys) or a sharded query sequence under positional rules
        (positions would restart on every shard).
        """
        q_spec, k_spec, v_spec = (tuple(s) + (None,) * 4 for s in in_specs[:3])
        for name, spec in (("key", k_spec), ("value", v_spec)):
            if spec[2] is not None:
                raise ValueError(
                    f"blocksparse_attention: in_specs shard the {name} sequence axis over {spec[2]!r}, so every "
                    "shard would attend only to its own keys; shard batch or heads instead (or use ring_attention)"
                )
        positional = kwargs.get("causal") or kwargs.get("sliding_window") or kwargs.get("chunk_size")
        if q_spec[2] is not None and positional:
            raise ValueError(
                f"blocksparse_attention: in_specs shard the query sequence axis over {q_spec[2]!r} together with "
                "causal / sliding-window / chunked masking, which would compare shard-local positions"
            )
        specs = {}
        if kwargs.get("q_segment_ids") is not None:
            specs["q_segment_ids"] = PartitionSpec(q_spec[0], q_spec[2])
            specs["kv_segment_ids"] = PartitionSpec(k_spec[0], k_spec[2])
        mask = kwargs.get("attention_mask")
        if mask is not None:
            specs["attention_mask"] = PartitionSpec(
                q_spec[0] if mask.shape[0] > 1 else None, q_spec[1] if mask.shape[1] > 1 else None, q_spec[2], None
            )
        return specs


@typechecked
def blocksparse_attention(
    query: Float[Array, "batch heads seq_q dim"],
    key: Float[Array, "batch kv_heads seq_k dim"],
    value: Float[Array, "batch kv_heads seq_k dim_v"],
    softmax_aux: Float[Array, "..."] | None = None,
    bias: Float[Array, "..."] | None = None,
    *,
    mask_info: MaskInfo | None = None,
    attention_mask: ArrayLike | None = None,
    sequence_parallelism_mesh_axis_name: str | None = None,
    logits_soft_cap: float | None = None,
    qkv_layouts: Any = None,
    softmax_scale: float | None = None,
    mask_builder: Callable | None = None,
    sliding_window: int | tuple[int, int] | None = None,
    chunk_size: int | None = None,
    causal: bool = True,
    fused_backward: bool = False,
    purify: bool = False,
    platform: str | None = None,
    cfg: BlockSparseAttentionConfig | None = None,
    mesh: jax.sharding.Mesh | None = None,
    in_specs: Any = None,
    out_specs: Any = None,
) -> Float[Array, "batch heads seq_q dim_v"]:
    """Softmax attention `softmax(scale · q kᵀ [+ bias], masked) v` that skips every masked block.

    Layout `[batch, heads, seq, dim]`, unlike the other attention ops (`[batch, seq, heads, dim]`); fewer
    key/value heads than query heads is grouped-query attention. Query `i` may attend key `j` (positions
    from the start of both sequences) where every mask given allows it: `causal` (on by default),
    `sliding_window`, `chunk_size`, `mask_info`, `attention_mask` and `mask_builder`. They reduce to one
    mask per call, from which each implementation builds the block table of its tiling once; a block with
    no allowed pair is never visited. A query row with nothing to attend is zero, so padded rows are always
    zero (`purify` asks for nothing more).

    Args:
        query: `[batch, heads, seq_q, dim]`, float16, bfloat16 or float32.
        key: `[batch, kv_heads, seq_k, dim]` in query's dtype, with `heads % kv_heads == 0`.
        value: `[batch, kv_heads, seq_k, dim_v]` in query's dtype.
        softmax_aux: Default None. Float sink logits in the softmax denominator only: length `heads`, one per
            head; other lengths, shared by all heads; `[heads, n]`, n per head; `[1, n]`, n shared.
        bias: Default None. Float, broadcastable as `[1|batch, 1|heads, seq_q, seq_k]` (fewer dims get
            leading 1s); added to the logits after the soft cap.
        mask_info: Default None. A `MaskInfo`: segments, dense masks and their transforms.
        attention_mask: Default None. Nonzero = attend: `[batch, seq]` padding of queries and keys alike
            (needs `seq_q == seq_k`), `[batch, seq_q, seq_k]` or `[batch, 1|heads, seq_q, seq_k]`.
        sequence_parallelism_mesh_axis_name: Default None. Not supported (NotImplementedError; for sequence
            parallelism use `ring_attention`).
        logits_soft_cap: Default None. A positive `c`: logits become `c · tanh(logits / c)`.
        qkv_layouts: Default None. Not supported (NotImplementedError).
        softmax_scale: Default None, meaning `dim ** -0.5`.
        mask_builder: Default None. A function `(q_idx [seq_q, 1], kv_idx [1, seq_k]) -> mask`, boolean or
            integer, broadcastable to `[seq_q, seq_k]` or `[1|batch, 1|heads, seq_q, seq_k]`; evaluated once
            per call (a builder of positions alone gives a constant block table).
        sliding_window: Default None. Non-negative `(left, right)` keeps `i - left <= j <= i + right`; an int
            `w` means `(w, w)`.
        chunk_size: Default None. A positive `c`: chunked local attention, `i // c == j // c`.
        causal: Default True. Keep `j <= i`; pass False for bidirectional attention.
        fused_backward: Default False. True asks for a backward in one fused pass, served by the XLA
            implementation and the Mosaic GPU kernels (Hopper); the others decline it.
        purify: Default False. Accepted for compatibility; it changes nothing.
        platform: Default None, meaning `"auto"`: the best implementation on this device that accepts the
            call. One of `"auto"`, `"xla"`, `"triton"`, `"pallas"`.
        cfg: Default None (a tuned, shipped or heuristic config). A `BlockSparseAttentionConfig`.
        mesh: Default None. A `jax.sharding.Mesh`: with `in_specs` and `out_specs` (the three or none) the
            call runs under `jax.shard_map`.
        in_specs: Default None. A `PartitionSpec` per tensor passed (or per positional slot), in the
            `[batch, heads, seq, dim]` layout. Shard batch or heads: the key/value sequence must stay whole,
            and so must the query sequence under `causal`, a window or `chunk_size`; segment ids and a dense
            mask follow.
        out_specs: Default None. The output's `PartitionSpec`.

    Returns:
        `[batch, heads, seq_q, dim_v]` in query's dtype; zeros for query rows with nothing to attend (and for
        empty inputs).

    Raises:
        TypeError: a rank, dtype or size the annotations refuse (one line naming the argument), query, key
            and value of different dtypes, a non-float `bias`, a `sliding_window` that is neither an int nor
            a pair, or a `mask_builder` returning a float mask.
        ValueError: `heads` not a multiple of `kv_heads`; `logits_soft_cap <= 0`; a `chunk_size` that is not a
            positive int; a negative window; an `attention_mask` of another rank, or `[batch, seq]` with
            `seq_q != seq_k`; a `mask_info`, `attention_mask`, `mask_builder`, `bias` or `softmax_aux` of the
            wrong shape; a platform that is unknown or has no implementation on this device; `mesh`,
            `in_specs`, `out_specs` not given together, or specs that shard a sequence as forbidden above.
        NotImplementedError: `qkv_layouts` or `sequence_parallelism_mesh_axis_name` given, or a requested
            platform that declines the call (a dtype, head dim, tiling or option its kernels do not take).

    Example:
        >>> import jax, numpy as np
        >>> from ejkernel.modules import blocksparse_attention
        >>> rng = np.random.default_rng(0)
        >>> q = rng.standard_normal((1, 4, 32, 8), np.float32)  # [batch, heads, seq, dim]
        >>> kv = rng.standard_normal((1, 2, 32, 8), np.float32)
        >>> attend = jax.jit(lambda q, kv: blocksparse_attention(q, kv, kv, sliding_window=(8, 0)))  # and causal
        >>> out = attend(q, kv)
        >>> out.shape, bool(np.isfinite(out).all())
        ((1, 4, 32, 8), True)
    """
    for name, x in (("query", query), ("key", key), ("value", value)):
        require_float(name, x)
        require_rank(name, x, (4,), "[batch, heads, seq, dim]")
    if key.dtype != query.dtype or value.dtype != query.dtype:
        raise TypeError(f"query, key and value must share a dtype, got {query.dtype}, {key.dtype}, {value.dtype}")
    if bias is not None:
        require_float("bias", bias)
    refused = [
        name
        for name, used in (
            ("qkv_layouts", qkv_layouts is not None),
            ("sequence_parallelism_mesh_axis_name (use ring_attention)", sequence_parallelism_mesh_axis_name),
        )
        if used
    ]
    if refused:
        raise NotImplementedError(f"blocksparse_attention does not support {', '.join(refused)}")
    batch, heads, q_len, head_dim = query.shape
    kv_len = key.shape[2]
    if heads % key.shape[1]:
        raise ValueError(f"query heads ({heads}) must be a multiple of key/value heads ({key.shape[1]})")
    if logits_soft_cap is not None and not logits_soft_cap > 0:
        raise ValueError(f"logits_soft_cap must be positive, got {logits_soft_cap}")
    mask = canonical_sparse_mask(
        batch,
        heads,
        q_len,
        kv_len,
        mask_info=mask_info,
        attention_mask=attention_mask,
        mask_builder=mask_builder,
        causal=causal,
        sliding_window=sliding_window,
        chunk_size=chunk_size,
    )
    bias = check_bias(bias, batch, heads, q_len, kv_len)
    softmax_aux = canonical_sinks(softmax_aux, heads)
    if query.size == 0 or kv_len == 0:  # no rows or no keys: every output is 0
        return jnp.zeros((batch, heads, q_len, value.shape[-1]), query.dtype)
    return executor(
        BlockSparseAttention(),
        query,
        key,
        value,
        softmax_aux,
        bias,
        platform=platform,
        cfg=cfg,
        mesh=mesh,
        in_specs=in_specs,
        out_specs=out_specs,
        q_segment_ids=mask.q_segment_ids,
        kv_segment_ids=mask.kv_segment_ids,
        attention_mask=mask.attention_mask,
        causal=mask.causal,
        sliding_window=clamp_window(mask.sliding_window, q_len + kv_len),
        chunk_size=mask.chunk_size,
        softmax_scale=float(head_dim**-0.5 if softmax_scale is None else softmax_scale),
        logits_soft_cap=None if logits_soft_cap is None else float(logits_soft_cap),
        fused_backward=bool(fused_backward),
    )
