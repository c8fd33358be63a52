"""Native sparse attention's selected branch as Pallas-Triton kernels: forward, dQ and dK/dV.

A program of the forward and of the dQ kernel serves one token and one key/value head: its query
heads (padded to at least 16 rows for the matmuls) against the blocks listed for it, valid entries
first (`count` of them), with the causal mask inside each block. Base-2 online softmax; the forward
saves a base-2 logsumexp (+inf for a row with nothing to attend).

The dK/dV kernel runs one program per key block slot (a block of one sequence) and key/value head,
over the tokens that selected the block (the wrapper sorts the selections by block): per token a
`[block, heads]` tile, accumulated in registers and written per slot; the wrapper adds the slots
into dK and dV (a sequence's last block may run into the next sequence's rows).
"""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from ejkernel.kernels._common.attention import LOG2E
from ejkernel.kernels._common.vma import out_struct
from ejkernel.kernels._triton._helpers import dot, exp2


@dataclasses.dataclass(frozen=True)
class TritonNativeSparseStatic:
    """What is fixed at trace time: the scale, the selected blocks' size, and each pass's Triton settings."""

    softmax_scale: float
    block_size: int
    fwd_warps: int
    fwd_stages: int
    bwd_warps: int
    bwd_stages: int
    interpret: bool


def _block_logits(st: TritonNativeSparseStatic, q, k, c, position):
    """Base-2 logits `[rows, block]` of block `c` (local index) for a query at `position`, causal inside."""
    x = dot(q, k, trans_b=True) * (st.softmax_scale * LOG2E)
    k_pos = c * st.block_size + jnp.arange(st.block_size, dtype=jnp.int32)[None, :]
    return jnp.where(k_pos <= position, x, -jnp.inf)


def _listed(info_ref, idx_ref, k_ref, v_ref, st: TritonNativeSparseStatic, step, carry):
    """`step(k, v, x_fn, carry)` over the token's listed blocks: `x_fn(q)` gives the block's logits."""
    start, position, count = info_ref[0], info_ref[1], info_ref[2]
    bs = st.block_size

    def body(w, carry):
        c = idx_ref[w]
        rows = pl.ds(start + c * bs, bs)
        k, v = k_ref[rows, :], v_ref[rows, :]
        return step(k, v, lambda q: _block_logits(st, q, k, c, position), carry)

    return lax.fori_loop(0, count, body, carry)


def _forward_kernel(info_ref, idx_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *, st: TritonNativeSparseStatic):
    q = q_ref[...]

    def step(k, v, logits, carry):
        acc, m_prev, l_prev = carry
        x = logits(q)
        m_next = jnp.maximum(m_prev, jnp.max(x, axis=1))
        shift = jnp.where(m_next == -jnp.inf, 0.0, m_next)
        alpha = exp2(m_prev - shift, interpret=st.interpret)
        p = exp2(x - shift[:, None], interpret=st.interpret)
        return acc * alpha[:, None] + dot(p.astype(v.dtype), v), m_next, l_prev * alpha + jnp.sum(p, axis=1)

    rows = q.shape[0]
    carry = (
        jnp.zeros((rows, o_ref.shape[-1]), jnp.float32),
        jnp.full((rows,), -jnp.inf, jnp.float32),
        jnp.zeros((rows,), jnp.float32),
    )
    acc, m, denom = _listed(info_ref, idx_ref, k_ref, v_ref, st, step, carry)
    empty = denom == 0.0
    denom = jnp.where(empty, 1.0, denom)
    o_ref[...] = (acc / denom[:, None]).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(empty, jnp.inf, m + jnp.log2(denom))


def _dq_kernel(
    info_ref, idx_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, *, st: TritonNativeSparseStatic
):
    q, do = q_ref[...], do_ref[...]
    lse, delta = lse_ref[...][:, None], delta_ref[...][:, None]

    def step(k, v, logits, dq):
        p = exp2(logits(q) - lse, interpret=st.interpret)
        ds = p * (dot(do, v, trans_b=True) - delta)
        return dq + dot(ds.astype(k.dtype), k)

    dq = _listed(info_ref, idx_ref, k_ref, v_ref, st, step, jnp.zeros(q.shape, jnp.float32))
    dq_ref[...] = (dq * st.softmax_scale).astype(dq_ref.dtype)


def _dkv_kernel(
    slot_ref,
    tokens_ref,
    pos_ref,
    q_ref,
    k_ref,
    v_ref,
    do_ref,
    lse_ref,
    delta_ref,
    dk_ref,
    dv_ref,
    *,
    st: TritonNativeSparseStatic,
):
    key_start, c, first, count = slot_ref[0], slot_ref[1], slot_ref[2], slot_ref[3]
    rows = pl.ds(key_start, st.block_size)
    k, v = k_ref[rows, :], v_ref[rows, :]
    k_pos = c * st.block_size + jnp.arange(st.block_size, dtype=jnp.int32)[:, None]  # keys are the rows here

    def step(j, carry):
        dk, dv = carry
        t = tokens_ref[first + j]
        q, do = q_ref[t], do_ref[t]
        x = dot(k, q, trans_b=True) * (st.softmax_scale * LOG2E)  # [block, heads]
        x = jnp.where(k_pos <= pos_ref[t], x, -jnp.inf)
        p = exp2(x - lse_ref[t][None, :], interpret=st.interpret)
        ds = p * (dot(v, do, trans_b=True) - delta_ref[t][None, :])
        return dk + dot(ds.astype(q.dtype), q), dv + dot(p.astype(do.dtype), do)

    carry = (jnp.zeros(dk_ref.shape, jnp.float32), jnp.zeros(dv_ref.shape, jnp.float32))
    dk, dv = lax.fori_loop(0, count, step, carry)
    dk_ref[...] = dk * st.softmax_scale
    dv_ref[...] = dv


def _params(warps, stages):
    return plgpu.CompilerParams(num_warps=warps, num_stages=stages)


def forward(st: TritonNativeSparseStatic, q, k, v, info, idx):
    """q `[B, S, Hkv, Gp, D]`, k/v `[B, Sp, Hkv, D]`, info `[B, S, Hkv, 4]`, idx `[B, S, Hkv, n]` ->
    (out `[B, S, Hkv, Gp, Dv]`, base-2 lse `[B, S, Hkv, Gp]`)."""
    batch, seq_len, kv_heads, rows, dim = q.shape
    padded_len, value_dim = k.shape[1], v.shape[-1]
    tok = lambda t, b, h: (b, t, h, 0)
    kv = lambda t, b, h: (b, 0, h, 0)
    args = [info, idx, q, k, v]
    return pl.pallas_call(
        functools.partial(_forward_kernel, st=st),
        grid=(seq_len, batch, kv_heads),
        in_specs=[
            pl.BlockSpec((None, None, None, info.shape[-1]), tok),
            pl.BlockSpec((None, None, None, idx.shape[-1]), tok),
            pl.BlockSpec((None, None, None, rows, dim), lambda t, b, h: (b, t, h, 0, 0)),
            pl.BlockSpec((None, padded_len, None, dim), kv),
            pl.BlockSpec((None, padded_len, None, value_dim), kv),
        ],
        out_specs=[
            pl.BlockSpec((None, None, None, rows, value_dim), lambda t, b, h: (b, t, h, 0, 0)),
            pl.BlockSpec((None, None, None, rows), tok),
        ],
        out_shape=[
            out_struct((*q.shape[:4], value_dim), q.dtype, *args),
            out_struct(q.shape[:4], jnp.float32, *args),
        ],
        compiler_params=_params(st.fwd_warps, st.fwd_stages),
        interpret=st.interpret,
        name="ejkernel_nsa_fwd",
    )(*args)


def dq(st: TritonNativeSparseStatic, q, k, v, do, lse, delta, info, idx):
    """dQ `[B, S, Hkv, Gp, D]` of the selected branch."""
    batch, seq_len, kv_heads, rows, dim = q.shape
    padded_len, value_dim = k.shape[1], v.shape[-1]
    tok = lambda t, b, h: (b, t, h, 0)
    kv = lambda t, b, h: (b, 0, h, 0)
    head_rows = lambda t, b, h: (b, t, h, 0, 0)
    args = [info, idx, q, k, v, do, lse, delta]
    return pl.pallas_call(
        functools.partial(_dq_kernel, st=st),
        grid=(seq_len, batch, kv_heads),
        in_specs=[
            pl.BlockSpec((None, None, None, info.shape[-1]), tok),
            pl.BlockSpec((None, None, None, idx.shape[-1]), tok),
            pl.BlockSpec((None, None, None, rows, dim), head_rows),
            pl.BlockSpec((None, padded_len, None, dim), kv),
            pl.BlockSpec((None, padded_len, None, value_dim), kv),
            pl.BlockSpec((None, None, None, rows, value_dim), head_rows),
            pl.BlockSpec((None, None, None, rows), tok),
            pl.BlockSpec((None, None, None, rows), tok),
        ],
        out_specs=pl.BlockSpec((None, None, None, rows, dim), head_rows),
        out_shape=out_struct(q.shape, q.dtype, *args),
        compiler_params=_params(st.bwd_warps, st.bwd_stages),
        interpret=st.interpret,
        name="ejkernel_nsa_bwd_dq",
    )(*args)


def dk_dv(st: TritonNativeSparseStatic, q, k, v, do, lse, delta, slots, tokens, positions):
    """Per key block slot and key/value head: (dK, dV) `[B, Hkv, slots, block, D]` float32.

    `slots [B, Hkv, n_slots, 4]`: key start row, block index in its sequence, first entry and count of
    the slot's tokens in `tokens [B, Hkv, E]`; `positions [B, S]`: each token's position.
    """
    batch, seq_len, kv_heads, rows, dim = q.shape
    padded_len, value_dim = k.shape[1], v.shape[-1]
    n_slots, bs = slots.shape[2], st.block_size
    every_token = lambda s, b, h: (b, 0, h, 0, 0)
    every_row = lambda s, b, h: (b, 0, h, 0)
    args = [slots, tokens, positions, q, k, v, do, lse, delta]
    in_specs = [
        pl.BlockSpec((None, None, None, slots.shape[-1]), lambda s, b, h: (b, h, s, 0)),
        pl.BlockSpec((None, None, tokens.shape[-1]), lambda s, b, h: (b, h, 0)),
        pl.BlockSpec((None, seq_len), lambda s, b, h: (b, 0)),
        pl.BlockSpec((None, seq_len, None, rows, dim), every_token),
        pl.BlockSpec((None, padded_len, None, dim), every_row),
        pl.BlockSpec((None, padded_len, None, value_dim), every_row),
        pl.BlockSpec((None, seq_len, None, rows, value_dim), every_token),
        pl.BlockSpec((None, seq_len, None, rows), every_row),
        pl.BlockSpec((None, seq_len, None, rows), every_row),
    ]
    slot_of = lambda s, b, h: (b, h, s, 0, 0)
    return pl.pallas_call(
        functools.partial(_dkv_kernel, st=st),
        grid=(n_slots, batch, kv_heads),
        in_specs=in_specs,
        out_specs=[
            pl.BlockSpec((None, None, None, bs, dim), slot_of),
            pl.BlockSpec((None, None, None, bs, value_dim), slot_of),
        ],
        out_shape=[
            out_struct((batch, kv_heads, n_slots, bs, dim), jnp.float32, *args),
            out_struct((batch, kv_heads, n_slots, bs, value_dim), jnp.float32, *args),
        ],
        compiler_params=_params(st.bwd_warps, st.bwd_stages),
        interpret=st.interpret,
        name="ejkernel_nsa_bwd_dkv",
    )(*args)
