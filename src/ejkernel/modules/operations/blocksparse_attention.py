"""`blocksparse_attention`: attention whose cost follows the density of its block mask.

Layout `[batch, heads, seq, dim]` (unlike the other dense ops). The public function checks the
arguments and reduces every way of giving a mask (`mask_info`, `attention_mask`, `mask_builder`,
`causal`, `sliding_window`, `chunk_size`) to one canonical mask (see
`ejkernel.kernels._common.block_sparse`); each implementation builds the block table of its tiling
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
from ejkernel.kernels._common.block_sparse import canonical_sparse_mask
from ejkernel.modules.operations._attention_args import attention_roles, check_bias
from ejkernel.modules.operations._common import executor, require_float, require_rank, typechecked
from ejkernel.ops import BwdParams, FwdParams, Invocation, Kernel, KernelConfig
from ejkernel.types import MaskInfo
from ejkernel.types.mask_info import clamp_window


@dataclasses.dataclass(frozen=True)
class BlockSparseAttentionConfig(KernelConfig):
    """`fwd_params.block_q x block_k`: the tiles of the block table (the sparsity's granularity) and of
    the kernels; `num_warps`/`num_stages` of the forward (`fwd_params`) and backward (`bwd_params`)."""


class BlockSparseAttention(Kernel):
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

    Layout `[batch, heads, seq, dim]`; fewer key/value heads than query heads is grouped-query
    attention. Query `i` may attend key `j` (positions from the start of both sequences) where every
    given mask allows it: `causal` (`j <= i`, on by default), `sliding_window` (`(left, right)` keeps
    `i - left <= j <= i + right`, an int `w` is `(w, w)`), `chunk_size c` (`i // c == j // c`,
    chunked local attention), `mask_info` (segments, dense masks and their transforms),
    `attention_mask` (bool `[B, S]` padding, `[B, Sq, Sk]` or `[B, 1|H, Sq, Sk]`) and `mask_builder`,
    a function `(q_idx [Sq, 1], kv_idx [1, Sk]) -> bool` mask broadcastable to `[Sq, Sk]` or
    `[1|B, 1|H, Sq, Sk]`, evaluated once per call (a builder of positions alone gives a constant
    block table). `bias [1|B, 1|H, Sq, Sk]` is added to the logits after the `logits_soft_cap`;
    `softmax_aux` are sink logits (length `heads`: one per head; other lengths: shared; `[heads, n]`:
    n per head) in the denominator only. A query row with nothing to attend is zero, so padded rows are always zero
    (`purify` asks for nothing more). `fused_backward=True` is served by the XLA implementation
    and the Mosaic GPU kernels (Hopper), whose backward is one fused pass; `qkv_layouts` and
    `sequence_parallelism_mesh_axis_name` (sequence parallelism: use `ring_attention`) are not
    supported (NotImplementedError).
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
