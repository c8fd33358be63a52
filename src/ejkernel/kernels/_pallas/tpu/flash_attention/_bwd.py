"""Flash attention backward as two Pallas Mosaic TPU kernels (FlashAttention-2 style).

With `delta = rowsum(dO * O)` precomputed in plain jnp and P recomputed from the saved logsumexp,

    dV = (P∘Z)ᵀ dO,   dP = (dO Vᵀ)∘Z,   dS = P∘(dP − delta),   dQ = scale·(dS∘C) K,   dK = scale·(dS∘C)ᵀ Q

(Z the dropout keep mask over 1 − rate, C = 1 − tanh² the soft-cap derivative, 1 without a cap;
dBias = dS). Sinks enter only through the logsumexp; their gradient `−Σ exp(sink − lse)·delta` is
taken in jnp.

- dK/dV kernel: grid `(B, Hkv, k blocks, group, q blocks)`. The last two axes are sequential and
  walk every query head of the key/value head's group and every query block, accumulating dK and dV
  of one key block in VMEM scratch: no per-query-head dK/dV is ever stored.
- dQ kernel: grid `(B, H, q blocks, k blocks)` like the forward, dQ accumulated in VMEM scratch;
  with a bias it also writes the dS tiles (zeros for skipped tiles).

Both skip tiles that the positional masks leave empty (clamping the index maps of the streamed
operands so skipped steps fetch nothing new) and build positional masks only on edge tiles.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ejkernel.kernels._common.attention import Operands, RefReader, sum_to_bias_shape
from ejkernel.kernels._pallas.tpu.flash_attention._fwd import (
    LANES,
    TpuFlashStatic,
    block_state,
    clamp_block,
    compiler_params,
    keep_tile,
    kv_block_range,
    lanes,
    masked_logits,
    q_block_range,
    run_tile,
    side_args,
    side_specs,
)

TN_DIMS = (((0,), (0,)), ((), ()))  # a.T @ b
NN_DIMS = (((1,), (0,)), ((), ()))  # a @ b
NT_DIMS = (((1,), (1,)), ((), ()))  # a @ b.T


def _tile_grads(
    st: TpuFlashStatic, ops: Operands, positional: bool, refs, *, q_start, k_start, batch_head, kv_len_padded
):
    """Recomputes one `[block_q, block_k]` tile: (P with dropout applied, dS before the cap, dS∘C)."""
    q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, bias_ref, mask_ref, q_seg_ref, kv_seg_ref, seed_ref = refs
    block_q, block_k = q_ref.shape[0], k_ref.shape[0]
    shape = (block_q, block_k)
    logit_refs = (q_ref, k_ref, bias_ref, q_seg_ref, kv_seg_ref, mask_ref)
    s, t = masked_logits(st, ops, positional, q_start, k_start, shape, kv_len_padded=kv_len_padded, refs=logit_refs)
    p = jnp.exp(s - lanes(lse_ref[...], block_k))  # lse = +inf on empty rows: p = 0 there
    dp = lax.dot_general(do_ref[...], v_ref[...], NT_DIMS, preferred_element_type=jnp.float32)
    p_kept = p
    if ops.dropout:
        keep = keep_tile(st, seed_ref, batch_head, q_start, k_start, shape)
        keep_scale = 1.0 / (1.0 - st.dropout_prob)
        p_kept = jnp.where(keep, p * keep_scale, 0.0)
        dp = jnp.where(keep, dp * keep_scale, 0.0)
    ds = p * (dp - lanes(delta_ref[...], block_k))
    ds_logits = ds if t is None else ds * (1.0 - t * t)
    return p_kept, ds, ds_logits


def _dq_kernel(*refs, st: TpuFlashStatic, ops: Operands, q_len_padded: int, kv_len_padded: int):
    read = RefReader(refs)
    q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref = (read() for _ in range(6))
    bias_ref, mask_ref = read(ops.bias), read(ops.mask)
    q_seg_ref, kv_seg_ref = read(ops.segments), read(ops.segments)
    seed_ref = read(ops.dropout)
    dq_ref = read()
    dbias_ref = read(ops.bias)
    (dq_scratch,) = read.rest()

    block_q, block_k = st.bwd_block_q, st.bwd_block_k
    b, h, qi, ki = (pl.program_id(i) for i in range(4))
    q_start, k_start = qi * block_q, ki * block_k
    tile_refs = (q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, bias_ref, mask_ref, q_seg_ref, kv_seg_ref, seed_ref)

    @pl.when(ki == 0)
    def _init():
        dq_scratch[...] = jnp.zeros(dq_scratch.shape, jnp.float32)

    visible, interior = block_state(
        st, q_start, block_q, k_start, block_k, q_len_padded=q_len_padded, kv_len_padded=kv_len_padded
    )

    def body(positional: bool):
        _, ds, ds_logits = _tile_grads(
            st,
            ops,
            positional,
            tile_refs,
            q_start=q_start,
            k_start=k_start,
            batch_head=b * st.num_heads + h,
            kv_len_padded=kv_len_padded,
        )
        if ops.bias:
            dbias_ref[...] = ds.astype(dbias_ref.dtype)
        k = k_ref[...]
        dq_scratch[...] += lax.dot_general(ds_logits.astype(k.dtype), k, NN_DIMS, preferred_element_type=jnp.float32)

    run_tile(visible, interior, body)
    if ops.bias and visible is not True:  # dBias is dense: skipped (fully masked) tiles get zeros

        @pl.when(jnp.logical_not(visible))
        def _zero_dbias():
            dbias_ref[...] = jnp.zeros(dbias_ref.shape, dbias_ref.dtype)

    @pl.when(ki == pl.num_programs(3) - 1)
    def _finish():
        dq_ref[...] = (dq_scratch[...] * st.softmax_scale).astype(dq_ref.dtype)


def _dkv_kernel(*refs, st: TpuFlashStatic, ops: Operands, q_len_padded: int, kv_len_padded: int):
    read = RefReader(refs)
    q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref = (read() for _ in range(6))
    bias_ref, mask_ref = read(ops.bias), read(ops.mask)
    q_seg_ref, kv_seg_ref = read(ops.segments), read(ops.segments)
    seed_ref = read(ops.dropout)
    dk_ref, dv_ref, dk_scratch, dv_scratch = read.rest()

    block_q, block_k = st.bwd_block_q, st.bwd_block_k
    b, hkv, ki, g, qi = (pl.program_id(i) for i in range(5))
    q_start, k_start = qi * block_q, ki * block_k
    tile_refs = (q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, bias_ref, mask_ref, q_seg_ref, kv_seg_ref, seed_ref)

    @pl.when(jnp.logical_and(g == 0, qi == 0))
    def _init():
        dk_scratch[...] = jnp.zeros(dk_scratch.shape, jnp.float32)
        dv_scratch[...] = jnp.zeros(dv_scratch.shape, jnp.float32)

    def body(positional: bool):
        p_kept, _, ds_logits = _tile_grads(
            st,
            ops,
            positional,
            tile_refs,
            q_start=q_start,
            k_start=k_start,
            batch_head=b * st.num_heads + hkv * st.group + g,
            kv_len_padded=kv_len_padded,
        )
        q, do = q_ref[...], do_ref[...]
        dv_scratch[...] += lax.dot_general(p_kept.astype(do.dtype), do, TN_DIMS, preferred_element_type=jnp.float32)
        dk_scratch[...] += lax.dot_general(ds_logits.astype(q.dtype), q, TN_DIMS, preferred_element_type=jnp.float32)

    visible, interior = block_state(
        st, q_start, block_q, k_start, block_k, q_len_padded=q_len_padded, kv_len_padded=kv_len_padded
    )
    run_tile(visible, interior, body)

    @pl.when(jnp.logical_and(g == pl.num_programs(3) - 1, qi == pl.num_programs(4) - 1))
    def _finish():
        dk_ref[...] = (dk_scratch[...] * st.softmax_scale).astype(dk_ref.dtype)
        dv_ref[...] = dv_scratch[...].astype(dv_ref.dtype)


def _row_specs(block_q, head_dim, value_dim, index):
    """Specs of q, dO, lse, delta for the query tile `index(*grid) -> (b, h, q block)`."""
    return [
        pl.BlockSpec((None, None, block_q, head_dim), lambda *g: (*index(*g), 0)),
        pl.BlockSpec((None, None, block_q, value_dim), lambda *g: (*index(*g), 0)),
        pl.BlockSpec((None, None, block_q, LANES), lambda *g: (*index(*g), 0)),
        pl.BlockSpec((None, None, block_q, LANES), lambda *g: (*index(*g), 0)),
    ]


def dq_and_dbias(st: TpuFlashStatic, q, k, v, do, lse, delta, bias, q_seg, kv_seg, mask, seed):
    """dQ `[B, H, Sqp, D]` and, with a bias, dS as float32 `[B, H, Sqp, Skp]` (None without)."""
    batch, num_heads, q_len_padded, head_dim = q.shape
    kv_len_padded, value_dim = k.shape[2], v.shape[3]
    block_q, block_k, group = st.bwd_block_q, st.bwd_block_k, st.group
    num_q_blocks, num_k_blocks = q_len_padded // block_q, kv_len_padded // block_k
    ops = Operands.of(bias, None, q_seg, mask, seed)

    def kv_block(qi, ki):
        lo, hi = kv_block_range(st, qi * block_q, block_q, block_k, num_k_blocks)
        return clamp_block(ki, lo, hi, num_k_blocks)

    q_spec, do_spec, lse_spec, delta_spec = _row_specs(block_q, head_dim, value_dim, lambda b, h, qi, ki: (b, h, qi))
    in_specs = [
        q_spec,
        pl.BlockSpec((None, None, block_k, head_dim), lambda b, h, qi, ki: (b, h // group, kv_block(qi, ki), 0)),
        pl.BlockSpec((None, None, block_k, value_dim), lambda b, h, qi, ki: (b, h // group, kv_block(qi, ki), 0)),
        do_spec,
        lse_spec,
        delta_spec,
        *side_specs(st, ops, block_q=block_q, block_k=block_k, index=lambda b, h, qi, ki: (b, h, qi, kv_block(qi, ki))),
    ]
    out_specs = [pl.BlockSpec((None, None, block_q, head_dim), lambda b, h, qi, ki: (b, h, qi, 0))]
    out_shape = [jax.ShapeDtypeStruct(q.shape, q.dtype)]
    if ops.bias:
        out_specs.append(pl.BlockSpec((None, None, block_q, block_k), lambda b, h, qi, ki: (b, h, qi, ki)))
        out_shape.append(jax.ShapeDtypeStruct((batch, num_heads, q_len_padded, kv_len_padded), jnp.float32))
    outs = pl.pallas_call(
        functools.partial(_dq_kernel, st=st, ops=ops, q_len_padded=q_len_padded, kv_len_padded=kv_len_padded),
        grid=(batch, num_heads, num_q_blocks, num_k_blocks),
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        scratch_shapes=[pltpu.VMEM((block_q, head_dim), jnp.float32)],
        compiler_params=compiler_params(4),
        interpret=st.interpret,
        name="ejkernel_tpu_flash_attention_bwd_dq",
    )(q, k, v, do, lse, delta, *side_args(ops, bias, mask, q_seg, kv_seg, seed=seed))
    return outs[0], (outs[1] if ops.bias else None)


def dk_dv(st: TpuFlashStatic, q, k, v, do, lse, delta, bias, q_seg, kv_seg, mask, seed):
    """dK `[B, Hkv, Skp, D]` and dV `[B, Hkv, Skp, Dv]`, summed over each key/value head's group."""
    q_len_padded, head_dim = q.shape[2], q.shape[3]
    batch, num_kv_heads, kv_len_padded, value_dim = *k.shape[:3], v.shape[3]
    block_q, block_k, group = st.bwd_block_q, st.bwd_block_k, st.group
    num_q_blocks, num_k_blocks = q_len_padded // block_q, kv_len_padded // block_k
    ops = Operands.of(bias, None, q_seg, mask, seed)

    def q_tile(b, hkv, ki, g, qi):
        """(b, query head, clamped query block) of a step of the sequential (head, q block) walk."""
        lo, hi = q_block_range(st, ki * block_k, block_k, block_q, num_q_blocks)
        return b, hkv * group + g, clamp_block(qi, lo, hi, num_q_blocks)

    q_spec, do_spec, lse_spec, delta_spec = _row_specs(block_q, head_dim, value_dim, q_tile)
    in_specs = [
        q_spec,
        pl.BlockSpec((None, None, block_k, head_dim), lambda b, hkv, ki, g, qi: (b, hkv, ki, 0)),
        pl.BlockSpec((None, None, block_k, value_dim), lambda b, hkv, ki, g, qi: (b, hkv, ki, 0)),
        do_spec,
        lse_spec,
        delta_spec,
        *side_specs(st, ops, block_q=block_q, block_k=block_k, index=lambda *g: (*q_tile(*g), g[2])),
    ]
    kernel = functools.partial(_dkv_kernel, st=st, ops=ops, q_len_padded=q_len_padded, kv_len_padded=kv_len_padded)
    return pl.pallas_call(
        kernel,
        grid=(batch, num_kv_heads, num_k_blocks, group, num_q_blocks),
        in_specs=in_specs,
        out_specs=[
            pl.BlockSpec((None, None, block_k, head_dim), lambda b, hkv, ki, g, qi: (b, hkv, ki, 0)),
            pl.BlockSpec((None, None, block_k, value_dim), lambda b, hkv, ki, g, qi: (b, hkv, ki, 0)),
        ],
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
        scratch_shapes=[pltpu.VMEM((block_k, head_dim), jnp.float32), pltpu.VMEM((block_k, value_dim), jnp.float32)],
        compiler_params=compiler_params(5, sequential=2),
        interpret=st.interpret,
        name="ejkernel_tpu_flash_attention_bwd_dkv",
    )(q, k, v, do, lse, delta, *side_args(ops, bias, mask, q_seg, kv_seg, seed=seed))


def backward(st: TpuFlashStatic, residuals, do):
    """Cotangent of the padded output -> (dq, dk, dv, dbias | None, dsinks | None)."""
    q, k, v, bias, sinks, q_seg, kv_seg, mask, seed, out, lse = residuals
    do = do.astype(out.dtype)
    delta = jnp.einsum("bhqd,bhqd->bhq", out.astype(jnp.float32), do.astype(jnp.float32))
    delta_lanes = jnp.broadcast_to(delta[..., None], (*delta.shape, LANES))
    operands = (q, k, v, do, lse, delta_lanes, bias, q_seg, kv_seg, mask, seed)
    dq, dbias = dq_and_dbias(st, *operands)
    dk, dv = dk_dv(st, *operands)
    if dbias is not None:
        dbias = sum_to_bias_shape(dbias, bias)
    dsinks = None
    if sinks is not None:
        # d lse / d sink = exp(sink - lse) and d out / d lse = -out, so dsink = -Σ exp(sink - lse)·delta.
        p_sink = jnp.exp(sinks.astype(jnp.float32)[None, :, None] - lse[..., 0])
        dsinks = -jnp.sum(p_sink * delta, axis=(0, 2)).astype(sinks.dtype)
    return dq, dk, dv, dbias, dsinks
