"""Ring attention with cuDNN's fused attention as the per-step block computation (GPU only).

cuDNN's flash attention is the fastest a JAX user has on Hopper, but it knows only static masks
(none, or causal aligned at the top-left), so this route serves calls where every step's block is
either fully visible or the diagonal block: causal or full attention, without a window, soft cap or
segment ids, with equal query and key/value lengths; sinks join in the ring's final merge. Everything
else is declined with `NotImplementedError` (automatic selection then takes another platform).

It uses JAX's cuDNN attention primitives directly (`jax._src.cudnn.fused_attention_stablehlo`, a private
module whose changes between JAX versions `_common/jax_compat.py` absorbs): the forward with its softmax
statistics (the row log-sum-exp, [B, H, T] float32), and the backward fed with the ring's global output
and log-sum-exp.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from ejkernel.kernels._common.attention import check_call, decline_call
from ejkernel.kernels._common.attention_call import AttentionCall
from ejkernel.kernels._common.jax_compat import cudnn_backward, cudnn_forward
from ejkernel.kernels._common.ring import RingSpec, bound_axis_size, check_local_inputs, run_ring
from ejkernel.ops.config import BwdParams, FwdParams

SUPPORTED_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


@dataclasses.dataclass(frozen=True)
class CudnnBlock:
    """One step. With aligned pieces of equal length, a visible causal block is either the diagonal
    (the ring says so statically: cuDNN's causal mask) or entirely in the past (no mask)."""

    softmax_scale: float
    causal: bool

    def forward(self, q, k, v, q_seg, kv_seg, q_offset, kv_offset, diagonal, bias=None):
        out, lse = cudnn_forward(q, k, v, self.softmax_scale, self.causal and diagonal)
        return out.astype(jnp.float32), lse

    def backward(self, q, k, v, q_seg, kv_seg, out, lse, d_out, q_offset, kv_offset, diagonal, bias=None):
        out, d_out = out.astype(q.dtype), d_out.astype(q.dtype)
        grads = cudnn_backward(q, k, v, out, lse, d_out, self.softmax_scale, self.causal and diagonal)
        return (*(g.astype(jnp.float32) for g in grads), None)


def ring_attention_cudnn(
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
    """Ring attention of local shards over the bound mesh axis `axis_name`, cuDNN per step.

    Same contract as `ring_attention_xla`; `fwd_params` / `bwd_params` are ignored (cuDNN tiles itself).
    """
    decline_call("cuDNN ring attention", call, serves=("causal",), bias=bias is not None)
    check_call(call)
    if jax.default_backend() != "gpu":
        raise NotImplementedError("cuDNN ring attention runs on a GPU only")
    for name, x in (("query", query), ("key", key), ("value", value)):
        if jnp.dtype(x.dtype) not in SUPPORTED_DTYPES:
            raise NotImplementedError(f"cuDNN ring attention needs bfloat16/float16, got {name} {x.dtype}")
    head_dim = query.shape[-1]
    if head_dim > 256 or head_dim % 8 or value.shape[-1] != head_dim:
        raise NotImplementedError(f"cuDNN ring attention needs equal head dims <= 256, multiple of 8, got {head_dim}")
    causal = bool(call.causal)
    if causal and query.shape[1] != key.shape[1]:
        raise NotImplementedError("cuDNN ring attention with causal=True needs equal query and key/value lengths")
    check_local_inputs(query, key, value, softmax_aux, None, None, layout)
    n = bound_axis_size(axis_name)
    ring = RingSpec(axis_name=axis_name, layout=layout, causal=causal, window=None)
    block = CudnnBlock(softmax_scale=float(call.softmax_scale), causal=causal)
    return run_ring(block, ring, n, query, key, value, softmax_aux)
