"""Ring attention with our Mosaic GPU flash attention forward (Hopper) as the per-step block computation.

Like the cuDNN ring, it serves the calls where every visible step block is either the diagonal block
(causal mask) or entirely allowed by position: causal or full attention with equal query and key/value
lengths, without a window, soft cap, segment ids or bias; sinks join in the ring's final merge. The
kernels' log-sum-exp is in base 2 (`m + log2(sum)` of the scaled logits), the ring's natural: converted
both ways here. Each step's forward merges into the running result as it writes its rows (`forward_onto`),
so the ring keeps that result in the inputs' dtype and runs no merge of its own. Query rows padded to the
kernel's tiles are cut off before the ring sees them.

Each step's backward is cuDNN's fused attention backward (a JAX primitive, `_common/jax_compat.py`), fed the
ring's output and log-sum-exp: at the ring's block sizes it ran faster than our Mosaic GPU backward (S/2 = 32768
causal on an H200: 27.5 against 29.4 ms; the whole ring trained 60.8 against 66.9 ms on 2 H200s, BENCHMARKS.md,
sessions 33 and 35), and with the Mosaic GPU forward it trains 2% faster than the cuDNN ring (session 37).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from ejkernel.kernels._common.attention import LN2, LOG2E, check_call, decline_call, pad_axes
from ejkernel.kernels._common.attention_call import AttentionCall
from ejkernel.kernels._common.device import is_hopper
from ejkernel.kernels._common.jax_compat import cudnn_backward
from ejkernel.kernels._common.ring import RingSpec, bound_axis_size, check_local_inputs, run_ring
from ejkernel.kernels._pallas.gpu.flash_attention._interface import plan
from ejkernel.ops.config import BwdParams, FwdParams

WHO = "mosaic gpu ring attention"


@dataclasses.dataclass(frozen=True)
class MosaicGpuBlock:
    """One step: the diagonal block (the ring says which) with the causal mask, every other visible block
    without one."""

    softmax_scale: float
    causal: bool
    fwd_params: FwdParams | None

    def plan(self, q, k, v, diagonal: bool):
        """`(MosaicGpuFlashStatic, padded q, k, v)`; NotImplementedError for what the kernels do not serve."""
        options = dict(softmax_scale=self.softmax_scale, causal=self.causal and diagonal, sliding_window=None)
        st, q, k, v, _ = plan(q, k, v, None, fwd_params=self.fwd_params, bwd_params=None, **options)
        return st, q, k, v

    def forward_onto(self, prior, q, k, v, q_seg, kv_seg, q_offset, kv_offset, diagonal, bias=None):
        """This block's attention merged into `prior = (out, lse)`, the running result of these queries over other
        keys (out in q's dtype): `BlockKernel.forward_onto`."""
        from ejkernel.kernels._pallas.gpu.flash_attention._fwd import forward  # loads Mosaic GPU

        st, qp, kp, vp = self.plan(q, k, v, diagonal)
        rows = qp.shape[1] - q.shape[1]
        prior_out, prior_lse = prior
        prior = (pad_axes(prior_out.astype(q.dtype), {1: rows}), pad_axes(prior_lse * LOG2E, {2: rows}, value=-jnp.inf))
        out, lse2 = forward(st, qp, kp, vp, prior=prior)
        q_len = q.shape[1]
        return out[:, :q_len], lse2[:, :, :q_len] * LN2

    def backward(self, q, k, v, q_seg, kv_seg, out, lse, d_out, q_offset, kv_offset, diagonal, bias=None):
        out, d_out = out.astype(q.dtype), d_out.astype(q.dtype)
        grads = cudnn_backward(q, k, v, out, lse, d_out, self.softmax_scale, self.causal and diagonal)
        return (*(g.astype(jnp.float32) for g in grads), None)


def _block(query, key, value, softmax_aux, bias, call: AttentionCall, *, layout="contiguous", fwd_params=None):
    """The per-step block of a call; NotImplementedError for what the kernels do not serve."""
    decline_call(WHO, call, serves=("causal",), bias=bias is not None)
    check_call(call)
    if not is_hopper():
        raise NotImplementedError(f"{WHO} needs a Hopper GPU (compute capability 9.x)")
    causal = bool(call.causal)
    if causal and query.shape[1] != key.shape[1]:
        raise NotImplementedError(f"{WHO} with causal=True needs equal query and key/value lengths")
    check_local_inputs(query, key, value, softmax_aux, None, None, layout)
    block = MosaicGpuBlock(float(call.softmax_scale), causal, fwd_params)
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

    Same contract as `ring_attention_xla`; `fwd_params` tile the forward as flash attention's Mosaic GPU route
    reads them, `bwd_params` are ignored (cuDNN's backward tiles itself). Declines (NotImplementedError) what
    the forward does not serve and any GPU but a Hopper.
    """
    block = _block(query, key, value, softmax_aux, bias, call, layout=layout, fwd_params=fwd_params)
    n = bound_axis_size(axis_name)
    ring = RingSpec(axis_name=axis_name, layout=layout, causal=block.causal, window=None)
    return run_ring(block, ring, n, query, key, value, softmax_aux)
