"""Ring attention with our Mosaic GPU flash attention kernels (Hopper) as the per-step block computation.

Like the cuDNN ring, it serves the calls where every visible step block is either the diagonal block
(causal mask) or entirely allowed by position: causal or full attention with equal query and key/value
lengths, without a window, soft cap, segment ids or bias; sinks join in the ring's final merge. The
kernels' log-sum-exp is in base 2 (`m + log2(sum)` of the scaled logits), the ring's natural: converted
both ways here. Padded query rows (lengths that are not a multiple of the kernels' tiles) enter the
backward with a zero output gradient and log-sum-exp -inf (probabilities 0): they add nothing.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from ejkernel.kernels._common.attention import LN2, LOG2E, check_call, decline_call, pad_axes
from ejkernel.kernels._common.attention_call import AttentionCall
from ejkernel.kernels._common.device import is_hopper
from ejkernel.kernels._common.ring import RingSpec, bound_axis_size, check_local_inputs, run_ring
from ejkernel.kernels._pallas.gpu.flash_attention._interface import backward, plan
from ejkernel.ops.config import BwdParams, FwdParams

WHO = "mosaic gpu ring attention"


@dataclasses.dataclass(frozen=True)
class MosaicGpuBlock:
    """One step: the diagonal block (the ring says which) with the causal mask, every other visible block
    without one."""

    softmax_scale: float
    causal: bool
    fwd_params: FwdParams | None
    bwd_params: BwdParams | None

    def plan(self, q, k, v, diagonal: bool):
        """`(MosaicGpuFlashStatic, padded q, k, v)`; NotImplementedError for what the kernels do not serve."""
        options = dict(softmax_scale=self.softmax_scale, causal=self.causal and diagonal, sliding_window=None)
        st, q, k, v, _ = plan(q, k, v, None, fwd_params=self.fwd_params, bwd_params=self.bwd_params, **options)
        return st, q, k, v

    def forward(self, q, k, v, q_seg, kv_seg, q_offset, kv_offset, diagonal, bias=None):
        from ejkernel.kernels._pallas.gpu.flash_attention._fwd import forward  # loads Mosaic GPU

        out, lse2 = forward(*self.plan(q, k, v, diagonal))
        q_len = q.shape[1]
        return out[:, :q_len].astype(jnp.float32), lse2[:, :, :q_len] * LN2

    def backward(self, q, k, v, q_seg, kv_seg, out, lse, d_out, q_offset, kv_offset, diagonal, bias=None):
        st, qp, kp, vp = self.plan(q, k, v, diagonal)
        rows = {1: qp.shape[1] - q.shape[1]}
        out, d_out = (pad_axes(x.astype(q.dtype), rows) for x in (out, d_out))
        lse2 = pad_axes(lse * LOG2E, {2: rows[1]}, value=-jnp.inf)
        dq, dk, dv, _ = backward(st, qp, kp, vp, None, out, lse2, d_out)
        q_len, k_len = q.shape[1], k.shape[1]
        return (*(g.astype(jnp.float32) for g in (dq[:, :q_len], dk[:, :k_len], dv[:, :k_len])), None)


def _block(
    query, key, value, softmax_aux, bias, call: AttentionCall, *, layout="contiguous", fwd_params=None, bwd_params=None
):
    """The per-step block of a call; NotImplementedError for what the kernels do not serve."""
    decline_call(WHO, call, serves=("causal",), bias=bias is not None)
    check_call(call)
    if not is_hopper():
        raise NotImplementedError(f"{WHO} needs a Hopper GPU (compute capability 9.x)")
    causal = bool(call.causal)
    if causal and query.shape[1] != key.shape[1]:
        raise NotImplementedError(f"{WHO} with causal=True needs equal query and key/value lengths")
    check_local_inputs(query, key, value, softmax_aux, None, None, layout)
    block = MosaicGpuBlock(float(call.softmax_scale), causal, fwd_params, bwd_params)
    # What the kernels cannot serve (dtype, head dim, tiles) is refused here, before the ring is traced.
    block.plan(query, key, value, diagonal=causal)
    return block


def ring_attention_mosaic_gpu(
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
    """Ring attention of local shards over the bound mesh axis `axis_name`, Mosaic GPU kernels per step.

    Same contract as `ring_attention_xla`; `fwd_params` / `bwd_params` tile the kernels as flash attention's
    Mosaic GPU route reads them. Declines (NotImplementedError) what the kernels do not serve and any GPU
    but a Hopper.
    """
    options = dict(layout=layout, fwd_params=fwd_params, bwd_params=bwd_params)
    block = _block(query, key, value, softmax_aux, bias, call, **options)
    n = bound_axis_size(axis_name)
    ring = RingSpec(axis_name=axis_name, layout=layout, causal=block.causal, window=None)
    return run_ring(block, ring, n, query, key, value, softmax_aux)
