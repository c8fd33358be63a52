"""Attention over gathered key blocks: the XLA core of both sparse attention ops.

Queries come in N groups of R rows (one query block of one head; the query heads of one token), and
each group has its own list of key blocks. Step w of a walk gathers, for every group at once, one
block of bk rows from the flat key and value tables [T, D], forms the [N, R, bk] logits, masks them
and folds them into an online softmax: nothing of size Sq x Sk is built, and the cost follows the
number of listed blocks. The backward walks the same steps, recomputes each tile from the saved
log-sum-exp and scatter-adds dK and dV into the flat tables.

What a step gathers and masks is the op's walk, an object with:
  steps                  the number of steps (an int, or a traced int32 scalar)
  rows(w)                int32 [N, bk]: rows of the flat key/value tables that step w gathers
  mask(w)                bool, broadcastable to [N, R, bk]: the allowed pairs of step w (None: all)
  bias(w)                float [N, R, bk] added to the logits, or None
  add_dbias(buf, w, ds)  `buf` plus the bias cotangent `ds` [N, R, bk] of step w
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax import lax

from ejkernel.kernels._common.attention import join_sink
from ejkernel.kernels._common.vma import vary, varying_axes


@dataclasses.dataclass(frozen=True)
class Logits:
    """How a tile's logits are formed: `scale · q kᵀ`, soft-capped at `soft_cap` (None: not capped)."""

    softmax_scale: float
    soft_cap: float | None


def _dot(spec: str, a, b):
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


def _tile(logits: Logits, walk, w, q, k_blk):
    """Masked logits [N, R, bk] of step w (float32, -inf where masked) and tanh(s / cap) for the backward."""
    s = _dot("nrd,nkd->nrk", q, k_blk) * jnp.float32(logits.softmax_scale)
    tanh = None
    if logits.soft_cap is not None:
        tanh = jnp.tanh(s / jnp.float32(logits.soft_cap))
        s = jnp.float32(logits.soft_cap) * tanh
    bias = walk.bias(w)
    if bias is not None:
        s = s + bias.astype(jnp.float32)
    allowed = walk.mask(w)
    if allowed is not None:
        s = jnp.where(allowed, s, -jnp.inf)
    return s, tanh


def forward(logits: Logits, walk, q, k, v, sink):
    """Rows `q [N, R, D]` over the walk's blocks of `k [T, D]`, `v [T, Dv]`.

    `sink [N, R]` (float32 or None) is one sink logit per row, joining the denominator only.
    Returns (out [N, R, Dv] float32, lse [N, R] float32); a row with no allowed key gets out 0 and
    lse -inf (its sink's logit when it has one).
    """
    n, r, _ = q.shape
    axes = varying_axes(q, k, v, sink)
    init = (
        jnp.full((n, r), -jnp.inf, jnp.float32),
        jnp.zeros((n, r), jnp.float32),
        jnp.zeros((n, r, v.shape[-1]), jnp.float32),
    )

    def step(w, carry):
        m_prev, l_prev, acc = carry
        rows = walk.rows(w)
        s, _ = _tile(logits, walk, w, q, k[rows])
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1))
        m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # rows with nothing allowed so far
        p = jnp.exp(s - m_safe[..., None])
        alpha = jnp.exp(m_prev - m_safe)
        pv = _dot("nrk,nkd->nrd", p.astype(v.dtype), v[rows])
        return m_new, alpha * l_prev + jnp.sum(p, axis=-1), alpha[..., None] * acc + pv

    m, denom, acc = lax.fori_loop(0, walk.steps, step, tuple(vary(x, axes) for x in init))
    if sink is not None:
        m, weight, denom = join_sink(m, denom, sink, jnp.exp)
        acc = acc * weight[..., None]
    nonempty = denom > 0.0
    denom = jnp.where(nonempty, denom, 1.0)
    lse = jnp.where(nonempty, jnp.where(nonempty, m, 0.0) + jnp.log(denom), -jnp.inf)
    return acc / denom[..., None], lse


def backward(logits: Logits, walk, q, k, v, sink, out, lse, d_out, dbias):
    """Cotangents of `forward`: (dq [N, R, D], dk [T, D], dv [T, Dv], dbias, dsink [N, R]), float32.

    With P = exp(S - lse): dV = Pᵀ dO, dS = P (dO Vᵀ - delta) with delta = rowsum(dO · O), then
    through the soft cap and the scale dQ = dS K, dK = dSᵀ Q; a sink's cotangent is
    -exp(sink - lse) · delta. `dbias` is the buffer the walk adds the bias cotangents to (or None).
    """
    d_out = d_out.astype(q.dtype)
    delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)
    lse_safe = jnp.where(lse == -jnp.inf, jnp.inf, lse)  # exp(s - lse) = 0 for empty rows, never NaN
    axes = varying_axes(q, k, v, sink, d_out)

    def step(w, carry):
        dq, dk, dv, dbias = carry
        rows = walk.rows(w)
        k_blk, v_blk = k[rows], v[rows]
        s, tanh = _tile(logits, walk, w, q, k_blk)
        p = jnp.exp(s - lse_safe[..., None])
        dv = dv.at[rows].add(_dot("nrk,nrd->nkd", p.astype(d_out.dtype), d_out))
        ds = p * (_dot("nrd,nkd->nrk", d_out, v_blk) - delta[..., None])
        if dbias is not None:
            dbias = walk.add_dbias(dbias, w, ds)
        if tanh is not None:
            ds = ds * (1.0 - tanh * tanh)
        ds = (ds * jnp.float32(logits.softmax_scale)).astype(q.dtype)
        dq = dq + _dot("nrk,nkd->nrd", ds, k_blk)
        dk = dk.at[rows].add(_dot("nrk,nrd->nkd", ds, q))
        return dq, dk, dv, dbias

    init = (
        jnp.zeros(q.shape, jnp.float32),
        jnp.zeros(k.shape, jnp.float32),
        jnp.zeros(v.shape, jnp.float32),
        dbias,
    )
    dq, dk, dv, dbias = lax.fori_loop(0, walk.steps, step, tuple(vary(x, axes) for x in init))
    dsink = None if sink is None else -jnp.exp(sink - lse_safe) * delta
    return dq, dk, dv, dbias, dsink
