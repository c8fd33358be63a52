"""Entry point of the XLA ring attention: the XLA flash attention as the per-step block computation.

Runs where `axis_name` is bound (inside `shard_map`), on the local sequence shards; the ring itself
(transfers, merge, layouts, custom VJP) is `ejkernel.kernels._common.ring`. Each step attends a query
piece to a key/value piece with the XLA flash attention's tiled forward and backward, told the
absolute positions of both pieces so that causal and window masks hold across devices.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from ejkernel.kernels._common.attention import check_call, decline_call
from ejkernel.kernels._common.attention_call import AttentionCall
from ejkernel.kernels._common.flash_attention.backward import attention_backward
from ejkernel.kernels._common.flash_attention.forward import attention_forward
from ejkernel.kernels._common.flash_attention.tiles import AttentionSpec
from ejkernel.kernels._common.ring import (
    RingSpec,
    bound_axis_size,
    check_local_bias,
    check_local_inputs,
    ring_window,
    run_ring,
)
from ejkernel.ops.config import BwdParams, FwdParams

WHO = "xla ring attention"


@dataclasses.dataclass(frozen=True)
class XlaBlock:
    """One step: the XLA flash attention forward / backward with position offsets, float32 results (it masks
    by absolute position, so it needs no `diagonal`)."""

    spec: AttentionSpec

    def forward(self, q, k, v, q_seg, kv_seg, q_offset, kv_offset, diagonal, bias=None):
        out, lse, _ = attention_forward(
            self.spec, q, k, v, bias, None, q_seg, kv_seg, None, None, q_offset, kv_offset, out_dtype=jnp.float32
        )
        return out, lse

    def backward(self, q, k, v, q_seg, kv_seg, out, lse, d_out, q_offset, kv_offset, diagonal, bias=None):
        residuals = (q, k, v, bias, None, q_seg, kv_seg, None, None, out, lse, None)
        dq, dk, dv, dbias, _ = attention_backward(
            self.spec, residuals, d_out, jnp.zeros_like(lse), q_offset, kv_offset, grad_dtype=jnp.float32
        )
        return dq, dk, dv, dbias


def ring_attention_xla(
    query,
    key,
    value,
    softmax_aux,
    bias,
    call: AttentionCall,
    *,
    axis_name: str,
    layout: str = "contiguous",
    fwd_params: FwdParams | None = None,
    bwd_params: BwdParams | None = None,
):
    """Ring attention of local shards over the bound mesh axis `axis_name`.

    Shapes (per device): query [B, Lq, H, D], key [B, Lk, Hkv, D], value [B, Lk, Hkv, Dv], softmax_aux
    1-D sink logits, bias [1|B, 1|H, Lq, n Lk] (the local query rows against every key of the ring,
    keys in sequence order); the options come as one `AttentionCall` (segment ids [B, Lq] / [B, Lk],
    negative: padding; a dense mask or dropout is declined). Inputs and output are
    contiguous shards (device d holds positions [d L, (d + 1) L)); `layout="mirrored"` reorders them
    internally so that device d computes for chunks 2d and 2n - 1 - 2d of 2n (balanced causal work).
    The result equals `flash_attention_reference` over the whole (unsharded) sequence.
    Block sizes of the per-step tiles come from `fwd_params` / `bwd_params` (block_q, block_k).
    """
    decline_call(WHO, call, serves=("segment ids", "causal", "sliding_window", "logits_soft_cap"))
    check_call(call)
    q_segment_ids, kv_segment_ids = call.q_segment_ids, call.kv_segment_ids
    check_local_inputs(query, key, value, softmax_aux, q_segment_ids, kv_segment_ids, layout)
    n = bound_axis_size(axis_name)
    check_local_bias(bias, query, key, n)
    window = ring_window(call.sliding_window, call.causal, n * max(query.shape[1], key.shape[1]))
    fwd_blocks = (fwd_params.block_q, fwd_params.block_k) if fwd_params is not None else (None, None)
    bwd_blocks = (bwd_params.block_q, bwd_params.block_k) if bwd_params is not None else fwd_blocks
    spec = AttentionSpec(
        softmax_scale=float(call.softmax_scale),
        causal=bool(call.causal),
        sliding_window=window,
        logits_soft_cap=None if call.logits_soft_cap is None else float(call.logits_soft_cap),
        dropout_prob=0.0,
        normalize_output=True,
        precision=jax.lax.Precision.DEFAULT,
        logits_dtype=jnp.dtype(jnp.float32),
        fwd_blocks=fwd_blocks,
        bwd_blocks=bwd_blocks,
    )
    ring = RingSpec(axis_name=axis_name, layout=layout, causal=bool(call.causal), window=window)
    return run_ring(XlaBlock(spec), ring, n, query, key, value, softmax_aux, q_segment_ids, kv_segment_ids, bias)
