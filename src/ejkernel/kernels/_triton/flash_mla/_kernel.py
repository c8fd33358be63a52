"""Absorbed MLA attention as one Pallas-Triton kernel: every query row against the shared latent rows.

In the absorbed form (`_common.mla`) all query heads score against the same latent key rows, so the
kernel flattens `(query position, head)` into rows: `[B, Sq·Hq, rank + d_rope]`, row `r` at position
`r // Hq`. A program takes `block_q` rows of one batch entry and streams `block_k` latent rows (and
their RoPE key dims) through an online softmax with base-2 exponentials, accumulating the weighted
latent rows in a float32 `[block_q, rank]` tile: the latent rows are both keys and values, read once
per program. Decode (one position, all heads in one program) and prefill (many positions) are the same
kernel; for decode the key range is split over `splits` programs (flash-decoding) so that a small
batch still fills the GPU, and the splits' normalised partial outputs are joined by their
log-sum-exps in plain jnp (`combine`), which is also where sink logits join the denominator.

Masks: key length, causal and `(left, right)` windows on positions (the key-block range of a program is
cut to the blocks its positions can see), and segment ids (packed sequences). The wrapper pads the rank
and the RoPE dims to powers of two (zeros: they add nothing to any score or output).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from ejkernel.kernels._common.attention import LOG2E
from ejkernel.kernels._common.vma import out_struct
from ejkernel.kernels._triton._helpers import dot, exp2


@dataclasses.dataclass(frozen=True)
class TritonFlashMlaStatic:
    """What is fixed at trace time."""

    num_heads: int
    q_len: int
    kv_len: int
    rank: int
    rope_dim: int  # 0: no RoPE key dims
    softmax_scale: float
    causal: bool
    window: tuple[int, int] | None
    soft_cap: float | None
    segments: bool
    block_q: int
    block_k: int
    splits: int
    num_warps: int
    num_stages: int
    interpret: bool

    @property
    def rows(self) -> int:
        return self.q_len * self.num_heads


def padded_dim(n: int) -> int:
    """The width a rank or RoPE dim is padded to: a power of two, at least 16 (the smallest matmul tile)."""
    return max(16, pl.next_power_of_2(n))


def _load(ref, index, row_mask):
    """`ref[index]`, rows where `row_mask` is False read as zeros."""
    return ref[index] if row_mask is None else plgpu.load(ref.at[index], mask=row_mask[:, None], other=0)


def _key_range(first_pos, last_pos, st: TritonFlashMlaStatic):
    """Key blocks `[lo, hi)` that positions `first_pos .. last_pos` may see (causal, window, length)."""
    bk = st.block_k
    num_blocks = pl.cdiv(st.kv_len, bk)
    lo, hi = jnp.int32(0), jnp.int32(num_blocks)
    reach = 0 if st.causal else None
    if st.window is not None:
        lo = lax.div(jnp.maximum(first_pos - st.window[0], 0), jnp.int32(bk))
        reach = st.window[1] if reach is None else min(reach, st.window[1])
    if reach is not None:
        hi = jnp.minimum(lax.div(jnp.maximum(last_pos + reach + 1, 0) + (bk - 1), jnp.int32(bk)), num_blocks)
    return lo, jnp.maximum(hi, lo)


def _kernel(*refs, st: TritonFlashMlaStatic):
    q_ref, kv_ref, rest = refs[0], refs[1], list(refs[2:])
    q_rope_ref, rope_ref = (rest.pop(0), rest.pop(0)) if st.rope_dim else (None, None)
    q_seg_ref, kv_seg_ref = (rest.pop(0), rest.pop(0)) if st.segments else (None, None)
    o_ref, lse_ref = rest

    bq, bk = st.block_q, st.block_k
    row_block, b, split = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    r0 = pl.multiple_of(row_block * bq, bq)
    row_ids = r0 + jnp.arange(bq, dtype=jnp.int32)
    row_mask = row_ids < st.rows if st.rows % bq else None
    q_pos = lax.div(row_ids, jnp.int32(st.num_heads))
    rows = pl.ds(r0, bq)
    q_lat = _load(q_ref, (b, rows, slice(None)), row_mask)
    q_rope = _load(q_rope_ref, (b, rows, slice(None)), row_mask) if st.rope_dim else None
    q_seg = None
    if st.segments:
        q_seg = q_seg_ref[b, rows] if row_mask is None else plgpu.load(q_seg_ref.at[b, rows], mask=row_mask, other=-1)

    first_pos = lax.div(r0, jnp.int32(st.num_heads))
    last_pos = jnp.minimum(lax.div(r0 + (bq - 1), jnp.int32(st.num_heads)), st.q_len - 1)
    lo, hi = _key_range(first_pos, last_pos, st)
    per_split = lax.div(hi - lo + (st.splits - 1), jnp.int32(st.splits))
    start = lo + split * per_split
    stop = jnp.minimum(start + per_split, hi)
    scale2 = st.softmax_scale * LOG2E

    def step(kb, carry):
        acc, m_prev, l_prev = carry
        k0 = pl.multiple_of(kb * bk, bk)
        k_ids = k0 + jnp.arange(bk, dtype=jnp.int32)
        k_mask = k_ids < st.kv_len if st.kv_len % bk else None
        keys = pl.ds(k0, bk)
        latent = _load(kv_ref, (b, keys, slice(None)), k_mask)
        s = dot(q_lat, latent, trans_b=True)
        if st.rope_dim:
            s = s + dot(q_rope, _load(rope_ref, (b, keys, slice(None)), k_mask), trans_b=True)
        if st.soft_cap is None:
            x = s * scale2
        else:
            x = jnp.tanh(s * (st.softmax_scale / st.soft_cap)) * (st.soft_cap * LOG2E)
        allowed = None
        if k_mask is not None:
            allowed = jnp.broadcast_to(k_mask[None, :], x.shape)
        k_pos = k_ids[None, :]
        pos = q_pos[:, None]
        for ok in (
            (k_pos <= pos) if st.causal else None,
            ((k_pos >= pos - st.window[0]) & (k_pos <= pos + st.window[1])) if st.window is not None else None,
        ):
            if ok is not None:
                allowed = ok if allowed is None else allowed & ok
        if st.segments:
            kv_seg = (
                kv_seg_ref[b, keys] if k_mask is None else plgpu.load(kv_seg_ref.at[b, keys], mask=k_mask, other=-1)
            )
            ok = (q_seg[:, None] == kv_seg[None, :]) & (q_seg[:, None] >= 0)
            allowed = ok if allowed is None else allowed & ok
        if allowed is not None:
            x = jnp.where(allowed, x, -jnp.inf)
        m_next = jnp.maximum(m_prev, jnp.max(x, axis=1))
        shift = jnp.where(m_next == -jnp.inf, 0.0, m_next)
        alpha = exp2(m_prev - shift, interpret=st.interpret)
        p = exp2(x - shift[:, None], interpret=st.interpret)
        l_next = l_prev * alpha + jnp.sum(p, axis=1)
        return acc * alpha[:, None] + dot(p.astype(latent.dtype), latent), m_next, l_next

    carry = (
        jnp.zeros((bq, q_ref.shape[-1]), jnp.float32),
        jnp.full((bq,), -jnp.inf, jnp.float32),
        jnp.zeros((bq,), jnp.float32),
    )
    acc, m, denom = lax.fori_loop(start, stop, step, carry)
    empty = denom == 0.0
    denom = jnp.where(empty, 1.0, denom)
    out_mask = None if row_mask is None else row_mask[:, None]
    plgpu.store(o_ref.at[split, b, rows, :], (acc / denom[:, None]).astype(o_ref.dtype), mask=out_mask)
    lse = jnp.where(empty, -jnp.inf, (m + jnp.log2(denom)) / LOG2E)  # natural units
    plgpu.store(lse_ref.at[split, b, rows], lse, mask=row_mask)


def attend(st: TritonFlashMlaStatic, q, q_rope, kv, rope_keys, q_seg, kv_seg):
    """Normalised partial outputs `[splits, B, Sq·Hq, R]` and their log-sum-exps `[splits, B, Sq·Hq]`.

    `q [B, Sq·Hq, R]` (latent part, R the padded rank), `q_rope [B, Sq·Hq, P]`, `kv [B, Sk, R]`,
    `rope_keys [B, Sk, P]` (both RoPE parts None without RoPE), segment ids per row `[B, Sq·Hq]` and per
    key `[B, Sk]` (or None). Partial outputs are in q's dtype with one split, else float32.
    """
    batch, width = q.shape[0], q.shape[2]
    out_dtype = q.dtype if st.splits == 1 else jnp.float32
    rope = [q_rope, rope_keys] if st.rope_dim else []
    args = [q, kv, *rope] + ([q_seg, kv_seg] if st.segments else [])
    return pl.pallas_call(
        functools.partial(_kernel, st=st),
        grid=(pl.cdiv(st.rows, st.block_q), batch, st.splits),
        out_shape=[
            out_struct((st.splits, batch, st.rows, width), out_dtype, *args),
            out_struct((st.splits, batch, st.rows), jnp.float32, *args),
        ],
        compiler_params=plgpu.CompilerParams(num_warps=st.num_warps, num_stages=st.num_stages),
        interpret=st.interpret,
        name="ejkernel_flash_mla",
    )(*args)


def combine(partials, lse, sinks, num_heads: int):
    """Joins the splits by their log-sum-exps (and per-head sink logits, which add mass to no value).

    `partials [splits, B, R, rank]`, `lse [splits, B, R]` with rows `R = Sq·Hq` (head = row % Hq);
    `sinks [Hq]` float32 or None. Rows with nothing allowed and no sink come out 0.
    """
    total = jax.nn.logsumexp(lse, axis=0)  # [B, R]
    if sinks is not None:
        per_row = jnp.tile(sinks, lse.shape[2] // num_heads)
        total = jnp.logaddexp(total, per_row[None, :])
    safe = jnp.where(jnp.isfinite(total), total, 0.0)
    weights = jnp.where(jnp.isfinite(lse), jnp.exp(lse - safe[None]), 0.0)
    return jnp.sum(weights[..., None] * partials.astype(jnp.float32), axis=0)
