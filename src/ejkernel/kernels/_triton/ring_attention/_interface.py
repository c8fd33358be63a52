"""Ring attention with our Pallas-Triton flash attention kernels as the per-step block computation.

The Triton kernels take static masks, so this route serves calls where every visible step block is
either the diagonal block (cuDNN-style top-left causal mask) or entirely allowed by position: causal
or full attention with equal query and key/value lengths, and no sliding window (declined with
`NotImplementedError`; the XLA ring takes those). Soft cap and segment ids are the kernels' own;
sinks join in the ring's final merge. The kernels' log-sum-exp is a pair (offset, rest): the row's
largest logit in the kernels' units and the rest in base 2, +inf on rows with nothing allowed. The
ring keeps the pair (`lse_unit`), with the rest natural and -inf there: converted both ways here.
One float would round the log-sum-exp to its ulp, and the backward's weights with it.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from ejkernel.kernels._common.attention import LN2, LOG2E, check_call, decline_call
from ejkernel.kernels._common.attention_call import AttentionCall
from ejkernel.kernels._common.ring import RingSpec, bound_axis_size, check_local_inputs, run_ring
from ejkernel.kernels._triton.flash_attention._bwd import backward
from ejkernel.kernels._triton.flash_attention._fwd import forward
from ejkernel.kernels._triton.flash_attention._interface import plan
from ejkernel.ops.config import BwdParams, FwdParams

WHO = "triton ring attention"


def _pad_to(x, axis: int, length: int, value=0):
    extra = length - x.shape[axis]
    if extra == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths, constant_values=value)


@dataclasses.dataclass(frozen=True)
class TritonBlock:
    """One step: the Triton forward / backward kernels, the diagonal block (the ring says which) with the
    causal mask, every other visible block without one."""

    softmax_scale: float
    causal: bool
    logits_soft_cap: float | None
    fwd_params: FwdParams | None
    bwd_params: BwdParams | None
    interpret: bool | None = None

    @property
    def lse_unit(self) -> float:
        """Natural units per unit of the kernels' offset: raw `q·k` without a soft cap, base-2 logits with one."""
        return self.softmax_scale if self.logits_soft_cap is None else LN2

    def plan(self, q, k, v, q_seg, kv_seg, causal: bool):
        call = AttentionCall(
            softmax_scale=self.softmax_scale,
            causal=causal,
            logits_soft_cap=self.logits_soft_cap,
            q_segment_ids=q_seg,
            kv_segment_ids=kv_seg,
        )
        return plan(
            q,
            k,
            v,
            None,
            None,
            call,
            fwd_params=self.fwd_params,
            bwd_params=self.bwd_params,
            interpret=self.interpret,
        )

    def forward(self, q, k, v, q_seg, kv_seg, q_offset, kv_offset, diagonal, bias=None):
        st, operands, (q_len, value_dim) = self.plan(q, k, v, q_seg, kv_seg, self.causal and diagonal)
        out, (offset, rest2) = forward(st, *operands)
        offset, rest2 = offset[:, :, :q_len], rest2[:, :, :q_len]
        rest = jnp.where(rest2 == jnp.inf, -jnp.inf, rest2 * LN2)
        return out[:, :q_len, :, :value_dim].astype(jnp.float32), (offset, rest)

    def backward(self, q, k, v, q_seg, kv_seg, out, lse, d_out, q_offset, kv_offset, diagonal, bias=None):
        st, operands, _ = self.plan(q, k, v, q_seg, kv_seg, self.causal and diagonal)
        rows, cols = operands[0].shape[1], operands[2].shape[3]  # padded query rows, value columns
        # Padded query rows get rest = +inf (p = 0) and a zero output gradient: they contribute nothing.
        pad = lambda x: _pad_to(_pad_to(x.astype(q.dtype), 1, rows), 3, cols)
        offset, rest = lse
        rest2 = _pad_to(jnp.where(rest == -jnp.inf, jnp.inf, rest * LOG2E), 2, rows, jnp.inf)
        lse2 = (_pad_to(offset, 2, rows), rest2)
        dq, dk, dv, _, _ = backward(st, (*operands, pad(out), lse2), pad(d_out))
        q_len, k_len = q.shape[1], k.shape[1]
        dq = dq[:, :q_len, :, : q.shape[3]]
        dk, dv = dk[:, :k_len, :, : k.shape[3]], dv[:, :k_len, :, : v.shape[3]]
        return (*(g.astype(jnp.float32) for g in (dq, dk, dv)), None)


def ring_attention_triton(
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
    interpret: bool | None = None,
):
    """Ring attention of local shards over the bound mesh axis `axis_name`, Triton kernels per step.

    Same contract as `ring_attention_xla` (a sliding window or bias is declined: the xla ring takes them);
    `fwd_params` / `bwd_params` tile the Triton kernels; `interpret=True` runs them in Pallas interpret
    mode (off a GPU, None is an error).
    """
    decline_call(WHO, call, serves=("segment ids", "causal", "logits_soft_cap"), bias=bias is not None)
    check_call(call)
    causal = bool(call.causal)
    if causal and query.shape[1] != key.shape[1]:
        raise NotImplementedError(f"{WHO} with causal=True needs equal query and key/value lengths")
    q_segment_ids, kv_segment_ids = call.q_segment_ids, call.kv_segment_ids
    check_local_inputs(query, key, value, softmax_aux, q_segment_ids, kv_segment_ids, layout)
    n = bound_axis_size(axis_name)
    block = TritonBlock(
        softmax_scale=float(call.softmax_scale),
        causal=causal,
        logits_soft_cap=None if call.logits_soft_cap is None else float(call.logits_soft_cap),
        fwd_params=fwd_params,
        bwd_params=bwd_params,
        interpret=interpret,
    )
    # What the kernels cannot serve (dtype, head dim, tiles) is refused here, before the ring is traced.
    block.plan(query, key, value, q_segment_ids, kv_segment_ids, causal)
    ring = RingSpec(axis_name=axis_name, layout=layout, causal=causal, window=None)
    return run_ring(block, ring, n, query, key, value, softmax_aux, q_segment_ids, kv_segment_ids)
