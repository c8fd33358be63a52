"""Backward pass of the XLA flash attention: recompute tiles from (out, lse), memory linear in length.

Outer loop over key blocks, inner loop over the query blocks that can see them. dK and dV of a key
block accumulate in block-sized float32 carries and are written once; dQ accumulates in a
carried float32 [B, Sqp, H, D] buffer; dbias (only when a bias is given, which is already
Sq x Sk) is written tile by tile. With P = exp(S - lse) the recomputed probabilities,
Z = keep / (1 - rate) the dropout scale and dO the output cotangent:

    dV  = (P Z)^T dO
    dS  = P * (Z (dO V^T) - delta),  delta_i = dO_i . O_i - dlse_i
    dQ  = scale * (dS * cap') K,   dK = scale * (dS * cap')^T Q,   dbias = dS summed to bias's shape
    daux_n = -sum_i exp(aux_n - lse_i) delta_i   (summed over the heads that share the sink)

For the unnormalised output O_u = O * exp(lse - m) (m held constant), the same formulas apply with
dO replaced by dO_u * exp(lse - m) and delta by -dlse.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from ejkernel.kernels._common.vma import vary

from .tiles import AttentionSpec, FlashPass, sink_logits, sum_to_shape, to_rows


def attention_backward(spec: AttentionSpec, residuals, d_out, d_lse, q_offset=None, kv_offset=None, grad_dtype=None):
    """Cotangents (dq, dk, dv, dbias, daux) from the forward residuals and (d_out, d_lse).

    `q_offset` / `kv_offset`: absolute positions of the first query and key, as in the forward.
    `grad_dtype` (default: the dtype of each input) is the dtype of dq, dk and dv; float32 keeps the
    accumulated values unrounded for a caller that sums them further (ring attention).
    """
    q, k, v, bias, aux, q_seg, kv_seg, mask, seed, out, lse, m = residuals
    t = FlashPass(spec, True, q, k, v, bias, q_seg, kv_seg, mask, seed, q_offset, kv_offset)
    batch, hkv, group, bq, bk = t.batch, t.num_kv_heads, t.group, t.block_q, t.block_k
    d_out = d_out.astype(q.dtype)

    lse_rows = to_rows(jnp.swapaxes(lse, 1, 2), hkv, group)  # [B, Hkv, G, Sq]
    d_lse_rows = to_rows(jnp.swapaxes(d_lse.astype(jnp.float32), 1, 2), hkv, group)
    if spec.normalize_output:
        delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)  # [B, Sq, H]
        delta = to_rows(delta, hkv, group) - d_lse_rows
        d_eff = d_out
    else:
        m_rows = to_rows(jnp.swapaxes(m, 1, 2), hkv, group)
        rescale = jnp.exp(lse_rows - m_rows)  # l_i; 0 for empty rows (lse = -inf)
        rescale = jnp.moveaxis(rescale, 3, 1).reshape(batch, t.q_len, t.num_heads)
        d_eff = (d_out.astype(jnp.float32) * rescale[..., None]).astype(q.dtype)
        delta = -d_lse_rows
    # exp(s - lse) must be 0, never NaN, for rows with nothing allowed (lse = -inf) and padded rows.
    lse_safe = jnp.where(lse_rows == -jnp.inf, jnp.inf, lse_rows)

    d_eff_t = t.pad_q(d_eff.reshape(batch, t.q_len, hkv, group, d_eff.shape[-1]))
    lse_t = t.pad_rows(lse_safe, jnp.inf)
    delta_t = t.pad_rows(delta, 0.0)

    dk_shape = (batch, bk, hkv, k.shape[-1])
    dv_shape = (batch, bk, hkv, v.shape[-1])

    def k_step(kb, buffers):
        dq_buf, dk_buf, dv_buf, db_buf = buffers
        k0 = kb * bk
        k_blk = t.k_block(t.k, k0)
        v_blk = t.k_block(t.v, k0)

        def q_step(qb, state):
            dq_buf, dk_acc, dv_acc, db_buf = state
            q0 = qb * bq
            q_blk = t.q_block(t.q, q0)
            do_blk = t.q_block(d_eff_t, q0)
            s, tanh = t.scores(q_blk, k_blk, q0, k0)
            allowed = t.allowed(q0, k0)
            if allowed is not None:
                s = jnp.where(allowed, s, -jnp.inf)
            p = jnp.exp(s - t.row_block(lse_t, q0)[..., None])
            dp = jnp.einsum(
                "bqhgd,bkhd->bhgqk", do_blk, v_blk, precision=spec.precision, preferred_element_type=jnp.float32
            )
            p_drop = p
            if spec.dropout_prob > 0.0:
                z = t.dropout_scale(q0, k0)
                p_drop = p * z
                dp = dp * z
            dv_acc = dv_acc + jnp.einsum(
                "bhgqk,bqhgd->bkhd",
                p_drop.astype(do_blk.dtype),
                do_blk,
                precision=spec.precision,
                preferred_element_type=jnp.float32,
            )
            ds = p * (dp - t.row_block(delta_t, q0)[..., None])
            if db_buf is not None:
                db_tile = sum_to_shape(ds, (*db_buf.shape[:3], bq, bk))
                db_buf = lax.dynamic_update_slice(db_buf, db_tile, (0, 0, 0, q0, k0))
            if tanh is not None:
                ds = ds * (1.0 - tanh * tanh)
            ds = (ds * jnp.float32(spec.softmax_scale)).astype(q.dtype)
            dk_acc = dk_acc + jnp.einsum(
                "bhgqk,bqhgd->bkhd", ds, q_blk, precision=spec.precision, preferred_element_type=jnp.float32
            )
            dq_blk = jnp.einsum(
                "bhgqk,bkhd->bqhgd", ds, k_blk, precision=spec.precision, preferred_element_type=jnp.float32
            )
            dq_buf = lax.dynamic_update_slice_in_dim(dq_buf, t.q_block(dq_buf, q0) + dq_blk, q0, axis=1)
            return dq_buf, dk_acc, dv_acc, db_buf

        lo, hi = t.q_block_range(kb)
        zeros = (vary(jnp.zeros(shape, jnp.float32), t.vma) for shape in (dk_shape, dv_shape))
        init = (dq_buf, *zeros, db_buf)
        dq_buf, dk_acc, dv_acc, db_buf = lax.fori_loop(lo, hi, q_step, init)
        dk_buf = lax.dynamic_update_slice_in_dim(dk_buf, dk_acc.astype(dk_buf.dtype), k0, axis=1)
        dv_buf = lax.dynamic_update_slice_in_dim(dv_buf, dv_acc.astype(dv_buf.dtype), k0, axis=1)
        return dq_buf, dk_buf, dv_buf, db_buf

    buffers = (
        jnp.zeros(t.q.shape, jnp.float32),
        jnp.zeros(t.k.shape, k.dtype if grad_dtype is None else grad_dtype),
        jnp.zeros(t.v.shape, v.dtype if grad_dtype is None else grad_dtype),
        None if t.bias is None else jnp.zeros(t.bias.shape, jnp.float32),
    )
    buffers = tuple(vary(x, t.vma) for x in buffers)
    dq, dk, dv, dbias = lax.fori_loop(0, t.num_k_blocks, k_step, buffers)
    dq = dq[:, : t.q_len].reshape(q.shape).astype(q.dtype if grad_dtype is None else grad_dtype)
    dk = dk[:, : t.k_len]
    dv = dv[:, : t.k_len]
    if dbias is not None:
        dbias = dbias[..., : t.q_len, : t.k_len]
        dbias = dbias.reshape(bias.shape).astype(bias.dtype)

    daux = None
    if aux is not None:
        sinks = sink_logits(aux, hkv, group)  # [Hkv, G, n]
        p_sink = jnp.exp(sinks[None, :, :, None, :] - lse_safe[..., None])  # [B, Hkv, G, Sq, n]
        d_sinks = -jnp.sum(p_sink * delta[..., None], axis=(0, 3))  # [Hkv, G, n]
        per_head = aux.shape[0] == t.num_heads
        daux = d_sinks.reshape(t.num_heads) if per_head else jnp.sum(d_sinks, axis=(0, 1))
        daux = daux.astype(aux.dtype)
    return dq, dk, dv, dbias, daux
