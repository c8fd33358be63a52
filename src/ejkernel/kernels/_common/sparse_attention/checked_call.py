"""One block-sparse attention call, checked and put in canonical form (sizes, bias, sinks, the mask), and
the mask operands the kernels read, padded to their tiling."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from ejkernel.kernels._common.attention import fold_sinks, pad_axes
from ejkernel.kernels._common.sparse_attention.block_table import BlockTable
from ejkernel.kernels._common.sparse_attention.masks import SparseMask, canonical_sparse_mask


class BlockSparseCall(NamedTuple):
    """A checked block-sparse attention call: sizes, operands in canonical form, and the mask."""

    batch: int
    heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    bias: jax.Array | None  # [1|B, 1|H, Sq, Sk]
    sink: jax.Array | None  # [H] float32: each head's sinks folded into one logit
    mask: SparseMask
    softmax_scale: float
    soft_cap: float | None


def blocksparse_call(
    who: str,
    query,
    key,
    value,
    softmax_aux=None,
    bias=None,
    *,
    fuses_backward: bool,
    dtypes=None,
    max_head_dim: int | None = None,
    mask_info=None,
    attention_mask=None,
    sequence_parallelism_mesh_axis_name=None,
    logits_soft_cap=None,
    qkv_layouts=None,
    softmax_scale=None,
    mask_builder=None,
    sliding_window=None,
    chunk_size=None,
    causal=True,
    fused_backward=False,
    purify=False,
    q_segment_ids=None,
    kv_segment_ids=None,
) -> BlockSparseCall:
    """Checks a call of implementation `who` (`[B, H, S, D]` layout) and puts it in canonical form.

    The keyword options are the public ones of `blocksparse_attention` (with their defaults), plus
    canonical segment ids. Shape errors are ValueError. NotImplementedError (so that automatic
    dispatch moves on): options no implementation serves, `fused_backward=True` where the backward
    is not one fused pass (`fuses_backward`), and for a kernel implementation, dtypes outside
    `dtypes`, head dims over `max_head_dim` and empty inputs. `purify` needs nothing: a query row
    with no allowed key (a padded one) is always zero.
    """
    del purify
    for name, x in (("query", query), ("key", key), ("value", value)):
        if getattr(x, "ndim", None) != 4:
            raise ValueError(f"{name} must be [batch, heads, seq, dim], got shape {getattr(x, 'shape', None)}")
    batch, heads, q_len, head_dim = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    if key.shape[0] != batch or value.shape[:3] != key.shape[:3] or key.shape[3] != head_dim:
        raise ValueError(
            f"key and value must be [batch={batch}, kv_heads, kv_len, dim={head_dim}] and [.., dim_v] alike, "
            f"got key {key.shape}, value {value.shape}"
        )
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"query heads ({heads}) must be a multiple of key/value heads ({kv_heads})")
    if dtypes is not None:
        names = "/".join(jnp.dtype(d).name for d in dtypes)
        for name, x in (("query", query), ("key", key), ("value", value), ("bias", bias)):
            if x is not None and jnp.dtype(x.dtype) not in dtypes:
                raise NotImplementedError(f"{who} takes {names}, got {name} {x.dtype}")
        if not query.dtype == key.dtype == value.dtype:
            raise NotImplementedError(f"{who} needs one dtype for query/key/value, got {query.dtype}/{key.dtype}")
        if max(head_dim, value.shape[-1]) > max_head_dim:
            raise NotImplementedError(f"{who} supports head dims up to {max_head_dim}, got {head_dim}")
        if min(batch, heads, q_len, kv_len) == 0:
            raise NotImplementedError(f"{who} needs non-empty inputs")
    refused = [
        ("qkv_layouts", qkv_layouts is not None),
        (
            "sequence_parallelism_mesh_axis_name (shard the sequence with ring_attention)",
            sequence_parallelism_mesh_axis_name is not None,
        ),
        ("fused_backward=True", fused_backward and not fuses_backward),
    ]
    names = [name for name, used in refused if used]
    if names:
        raise NotImplementedError(f"{who} does not support {', '.join(names)}")
    if bias is not None:
        bias = bias.reshape((1,) * (4 - bias.ndim) + bias.shape) if bias.ndim < 4 else bias
        if (
            bias.ndim != 4
            or bias.shape[0] not in (1, batch)
            or bias.shape[1] not in (1, heads)
            or bias.shape[2:] != (q_len, kv_len)
        ):
            raise ValueError(f"bias must be [1|{batch}, 1|{heads}, {q_len}, {kv_len}], got {tuple(bias.shape)}")
    sink = None
    if softmax_aux is not None:
        if softmax_aux.ndim != 1 or softmax_aux.shape[0] == 0:
            raise ValueError(f"softmax_aux must be a non-empty 1-D array, got shape {softmax_aux.shape}")
        sink = fold_sinks(softmax_aux, heads)
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
        q_segment_ids=q_segment_ids,
        kv_segment_ids=kv_segment_ids,
    )
    return BlockSparseCall(
        batch,
        heads,
        kv_heads,
        q_len,
        kv_len,
        bias,
        sink,
        mask,
        float(head_dim**-0.5 if softmax_scale is None else softmax_scale),
        None if logits_soft_cap is None else float(logits_soft_cap),
    )


def padded_mask_operands(call: BlockSparseCall, table: BlockTable, q_pad: int, kv_pad: int):
    """What the kernels read of the mask, padded by `q_pad` / `kv_pad` positions: (bias, dense mask as int8
    or None when the table says it all, q segment ids, kv segment ids; padding ids -1)."""
    mask = call.mask
    dense = None
    if table.needs_dense_mask:
        dense = pad_axes(mask.attention_mask.astype(jnp.int8), {2: q_pad, 3: kv_pad})
    q_seg = kv_seg = None
    if mask.q_segment_ids is not None:
        q_seg = pad_axes(mask.q_segment_ids, {1: q_pad}, value=-1)
        kv_seg = pad_axes(mask.kv_segment_ids, {1: kv_pad}, value=-1)
    return pad_axes(call.bias, {2: q_pad, 3: kv_pad}), dense, q_seg, kv_seg
