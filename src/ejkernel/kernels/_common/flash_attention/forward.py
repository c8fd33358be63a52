"""Forward pass of the XLA flash attention: chunked online softmax over key blocks.

For each query block (outer loop) the key blocks it can see (inner loop, bounds from the block
index under causal / window masking) are folded into a running max `m`, denominator `l` and
float32 accumulator. Nothing of size Sq x Sk is ever built; the per-row residuals are the
log-sum-exp (for the backward) and the final max `m` (for the unnormalised output).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from ejkernel.kernels._common.vma import vary

from .tiles import AttentionSpec, FlashPass, from_rows, sink_logits


def attention_forward(
    spec: AttentionSpec,
    q,
    k,
    v,
    bias,
    aux,
    q_seg,
    kv_seg,
    mask,
    seed,
    q_offset=None,
    kv_offset=None,
    out_dtype=None,
):
    """Returns (out [B, Sq, H, Dv] in `out_dtype` (default q.dtype), lse [B, H, Sq] f32, m [B, H, Sq] f32 or None).

    `lse` is -inf and `m` is 0 for a row with nothing to attend and no sinks; `m` (the final row
    max, needed by the backward of the unnormalised output only) is None when normalising.
    With `spec.normalize_output` False, out is sum_j exp(s_ij - m_i) v_j (dropout applied).
    `q_offset` / `kv_offset` (int32 scalars, may be traced) are the absolute positions of the first
    query and key: causal and window masks compare `q_offset + i` with `kv_offset + j`.
    """
    t = FlashPass(spec, False, q, k, v, bias, q_seg, kv_seg, mask, seed, q_offset, kv_offset)
    out_dtype = q.dtype if out_dtype is None else out_dtype
    batch, hkv, group, bq, bk = t.batch, t.num_kv_heads, t.group, t.block_q, t.block_k
    dv = v.shape[-1]
    row_shape = (batch, hkv, group, bq)

    if aux is not None:
        sinks = sink_logits(aux, hkv, group)  # [Hkv, G, n]
        sink_max = jnp.max(sinks, axis=-1)
        m_init = jnp.broadcast_to(sink_max[None, :, :, None], row_shape)
        l_init = jnp.broadcast_to(jnp.sum(jnp.exp(sinks - sink_max[..., None]), axis=-1)[None, :, :, None], row_shape)
    else:
        m_init = jnp.full(row_shape, -jnp.inf, jnp.float32)
        l_init = jnp.zeros(row_shape, jnp.float32)
    acc_init = jnp.zeros((*row_shape, dv), jnp.float32)
    m_init, l_init, acc_init = (vary(x, t.vma) for x in (m_init, l_init, acc_init))

    def q_step(qb, buffers):
        out_buf, lse_buf, m_buf = buffers
        q0 = qb * bq
        q_blk = t.q_block(t.q, q0)

        def k_step(kb, state):
            m_prev, l_prev, acc_prev = state
            k0 = kb * bk
            s, _ = t.scores(q_blk, t.k_block(t.k, k0), q0, k0)
            allowed = t.allowed(q0, k0)
            if allowed is not None:
                s = jnp.where(allowed, s, -jnp.inf)
            m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1))
            m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # rows with nothing so far
            p = jnp.exp(s - m_safe[..., None])
            alpha = jnp.exp(m_prev - m_safe)
            l_new = alpha * l_prev + jnp.sum(p, axis=-1)
            if spec.dropout_prob > 0.0:
                p = p * t.dropout_scale(q0, k0)
            v_blk = t.k_block(t.v, k0)
            pv = jnp.einsum(
                "bhgqk,bkhd->bhgqd",
                p.astype(v.dtype),
                v_blk,
                precision=spec.precision,
                preferred_element_type=jnp.float32,
            )
            return m_new, l_new, alpha[..., None] * acc_prev + pv

        lo, hi = t.k_block_range(qb)
        m, denom, acc = lax.fori_loop(lo, hi, k_step, (m_init, l_init, acc_init))

        nonempty = denom > 0.0
        denom = jnp.where(nonempty, denom, 1.0)
        if spec.normalize_output:
            acc = acc * jnp.where(nonempty, 1.0 / denom, 0.0)[..., None]
        lse = jnp.where(nonempty, jnp.where(nonempty, m, 0.0) + jnp.log(denom), -jnp.inf)
        m = jnp.where(nonempty, m, 0.0)
        out_blk = jnp.moveaxis(acc, 3, 1).astype(out_dtype)  # [B, bq, Hkv, G, Dv]
        out_buf = lax.dynamic_update_slice_in_dim(out_buf, out_blk, q0, axis=1)
        lse_buf = lax.dynamic_update_slice_in_dim(lse_buf, lse, q0, axis=3)
        if m_buf is not None:
            m_buf = lax.dynamic_update_slice_in_dim(m_buf, m, q0, axis=3)
        return out_buf, lse_buf, m_buf

    buffers = (
        jnp.zeros((batch, t.q_pad, hkv, group, dv), out_dtype),
        jnp.zeros((batch, hkv, group, t.q_pad), jnp.float32),
        None if spec.normalize_output else jnp.zeros((batch, hkv, group, t.q_pad), jnp.float32),
    )
    buffers = tuple(vary(x, t.vma) for x in buffers)
    out, lse, m = lax.fori_loop(0, t.num_q_blocks, q_step, buffers)
    out = out[:, : t.q_len].reshape(batch, t.q_len, t.num_heads, dv)
    m = None if m is None else from_rows(m[..., : t.q_len])
    return out, from_rows(lse[..., : t.q_len]), m
