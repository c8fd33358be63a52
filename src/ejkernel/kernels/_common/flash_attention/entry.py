"""Entry point of the XLA flash attention: argument checks and the custom VJP.

Semantics are those of `ejkernel.reference.flash_attention.flash_attention_reference`. The forward
walks [block_q, block_k] tiles with an online softmax (`forward.py`); the backward recomputes
tiles from the saved output and log-sum-exp (`backward.py`). Memory is linear in sequence length
(apart from a bias / mask the caller already holds at Sq x Sk); fully masked tiles under causal
and sliding-window masking are skipped.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ejkernel.kernels._common.attention import check_broadcastable, check_call, check_qkv, check_segments
from ejkernel.kernels._common.attention_call import AttentionCall
from ejkernel.kernels._common.float8_attention import (
    OUTPUT_DTYPE,
    check_descales,
    dequantize,
    inference_only,
)
from ejkernel.kernels._common.vma import sum_to_vma

from .backward import attention_backward
from .forward import attention_forward
from .tiles import AttentionSpec

FLOAT_DTYPES = tuple(jnp.dtype(d) for d in (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(spec: AttentionSpec, q, k, v, bias, aux, q_seg, kv_seg, mask, seed):
    out, lse, _ = attention_forward(spec, q, k, v, bias, aux, q_seg, kv_seg, mask, seed)
    return out, lse


def _attention_fwd(spec, q, k, v, bias, aux, q_seg, kv_seg, mask, seed):
    out, lse, m = attention_forward(spec, q, k, v, bias, aux, q_seg, kv_seg, mask, seed)
    return (out, lse), (q, k, v, bias, aux, q_seg, kv_seg, mask, seed, out, lse, m)


def _attention_bwd(spec, residuals, cotangents):
    d_out, d_lse = cotangents
    dq, dk, dv, dbias, daux = attention_backward(spec, residuals, d_out, d_lse)
    bias, aux = residuals[3], residuals[4]
    return dq, dk, dv, sum_to_vma(dbias, bias), sum_to_vma(daux, aux), None, None, None, None


_attention.defvjp(_attention_fwd, _attention_bwd)


def flash_attention_xla(
    query,
    key,
    value,
    bias,
    softmax_aux,
    call: AttentionCall,
    *,
    fwd_params=None,
    bwd_params=None,
    normalize_output: bool = True,
    precision=jax.lax.Precision.DEFAULT,
    logits_dtype=jnp.float32,
    return_lse: bool = False,
    descales=None,
):
    """Memory-linear flash attention in plain JAX: [B, Sq, H, D] x [B, Sk, Hkv, D] -> [B, Sq, H, Dv].

    Follows the canonical contract (see `flash_attention_reference` for the exact semantics); the options
    come as one `AttentionCall`. Extra keyword-only options:
      normalize_output: False returns sum_j exp(s_ij - m_i) v_j without dividing by the softmax
        denominator (m_i the row max including sinks; 0 for empty rows). Still differentiable;
        m_i is held constant in the gradient, as a shift should be.
      precision: matmul precision of every dot product.
      logits_dtype: accumulation dtype of Q K^T (softmax arithmetic is float32 regardless).
      return_lse: also return the rows' log-sum-exp, float32 [B, Sq, H] (the reference's step 8),
        differentiable (its cotangent joins the backward's row term).
      descales: with float8 query/key/value, `(q [H], k [Hkv], v [Hkv])` float32 per-head factors: the
        inputs are dequantised (`code * descale`) to float32, attended as such, and the output is
        bfloat16; inference only (a derivative raises TypeError).
    Block sizes come from `fwd_params` / `bwd_params` (the op's `FwdParams` / `BwdParams`, read for
    block_q and block_k); `bwd_params` falls back to `fwd_params`. Defaults: 1024 x 2048 forward,
    1024 x 1024 backward, halved while B * H * block_q * block_k exceeds 2**25 (forward) / 2**24
    (backward), clamped to the lengths.
    """
    descales = check_descales("xla flash_attention", query, key, descales)
    if descales is not None:
        options = dict(
            fwd_params=fwd_params,
            bwd_params=bwd_params,
            normalize_output=normalize_output,
            precision=precision,
            logits_dtype=logits_dtype,
            return_lse=return_lse,
        )

        def dequantized(q, k, v, q_descale, k_descale, v_descale, bias, softmax_aux, call):
            q, k, v = dequantize(q, q_descale), dequantize(k, k_descale), dequantize(v, v_descale)
            result = flash_attention_xla(q, k, v, bias, softmax_aux, call, **options)
            return (result[0].astype(OUTPUT_DTYPE), result[1]) if return_lse else result.astype(OUTPUT_DTYPE)

        return inference_only(dequantized)(query, key, value, *descales, bias, softmax_aux, call)
    batch, q_len, k_len, num_heads, *_ = check_qkv(
        query, key, value, who="xla flash_attention", dtypes=FLOAT_DTYPES, max_head_dim=2**31 - 1
    )
    check_segments(call.q_segment_ids, call.kv_segment_ids, batch, q_len, k_len)
    check_call(call)
    if softmax_aux is not None and softmax_aux.ndim != 1:
        raise ValueError(f"softmax_aux must be 1-D, got shape {softmax_aux.shape}")
    if bias is not None:
        check_broadcastable("bias", bias, batch, num_heads, q_len, k_len)
        bias = jnp.broadcast_to(bias, (*bias.shape[:2], q_len, k_len))
    attention_mask = call.attention_mask
    if attention_mask is not None:
        check_broadcastable("attention_mask", attention_mask, batch, num_heads, q_len, k_len)
        attention_mask = jnp.broadcast_to(attention_mask.astype(bool), (*attention_mask.shape[:2], q_len, k_len))

    if q_len == 0 or k_len == 0:  # nothing to attend: every row is empty
        out = jnp.zeros((batch, q_len, num_heads, value.shape[-1]), query.dtype)
        return (out, jnp.full((batch, q_len, num_heads), -jnp.inf, jnp.float32)) if return_lse else out

    fwd_blocks = (fwd_params.block_q, fwd_params.block_k) if fwd_params is not None else (None, None)
    bwd_blocks = (bwd_params.block_q, bwd_params.block_k) if bwd_params is not None else fwd_blocks
    spec = AttentionSpec(
        softmax_scale=call.softmax_scale,
        causal=call.causal,
        sliding_window=call.sliding_window,
        logits_soft_cap=call.logits_soft_cap,
        dropout_prob=call.dropout_prob,
        normalize_output=bool(normalize_output),
        precision=precision,
        logits_dtype=jnp.dtype(logits_dtype),
        fwd_blocks=fwd_blocks,
        bwd_blocks=bwd_blocks,
    )
    seed = jnp.asarray(call.dropout_seed).astype(jnp.uint32) if call.dropout_prob > 0.0 else None
    masks = (call.q_segment_ids, call.kv_segment_ids, attention_mask)
    out, lse = _attention(spec, query, key, value, bias, softmax_aux, *masks, seed)
    return (out, jnp.swapaxes(lse, 1, 2)) if return_lse else out
