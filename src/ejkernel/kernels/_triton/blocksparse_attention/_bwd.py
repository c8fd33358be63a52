"""Block-sparse attention backward, as two Pallas-Triton kernels that walk the block table.

With `delta = rowsum(dO · O)` (plain jnp) and P recomputed from the saved base-2 logsumexp:
`dV = Pᵀ dO`, `dS = P (dO Vᵀ − delta)`, `dQ = scale · (dS ∘ C) K`, `dK = scale · (dS ∘ C)ᵀ Q`
(C = 1 − tanh² of the soft cap, 1 without one), dBias = dS; the sinks' gradient is taken in the
wrapper (`−Σ exp(sink − lse) · delta`).

- dQ kernel: one program per (query block, batch, query head) over the key blocks its table row lists
  (edge tiles masked, full ones not), like the forward; it also writes the dBias tiles it visits
  into a zeroed buffer.
- dK/dV kernel: one program per (key block, batch, key/value head) over every query head of the
  group and the query blocks the transposed table lists for it, accumulating dK and dV in registers
  (K and V are never repeated). Tiles are computed transposed, `[block_k, block_q]`.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from ejkernel.kernels._common.attention import LOG2E, Operands, RefReader, sum_to_bias_shape
from ejkernel.kernels._common.vma import out_struct
from ejkernel.kernels._triton._helpers import dot, exp2
from ejkernel.kernels._triton.blocksparse_attention._fwd import (
    TritonBlockSparseStatic,
    allowed_tile,
    listed_loop,
    lists_spec,
    row_operands,
)
from ejkernel.kernels._triton.flash_attention._fwd import logits_base2


def _dq_kernel(*refs, st: TritonBlockSparseStatic, ops: Operands, kv_len_padded: int):
    read = RefReader(refs)
    lists_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref = (read() for _ in range(7))
    bias_ref, mask_ref = read(ops.bias), read(ops.mask)
    q_seg_ref, kv_seg_ref = read(ops.segments), read(ops.segments)
    _ = read(ops.bias)  # the zeroed dBias buffer, aliased to the dbias output
    dq_ref = read()
    dbias_ref = read(ops.bias)

    bq, bk = st.block_q, st.block_k
    q_pos = pl.program_id(0) * bq + jnp.arange(bq, dtype=jnp.int32)[:, None]
    q, do = q_ref[...], do_ref[...]
    lse, delta = lse_ref[...][:, None], delta_ref[...][:, None]
    q_seg = q_seg_ref[...][:, None] if ops.segments else None

    def step(kb, dq, edge: bool):
        cols = pl.ds(pl.multiple_of(kb * bk, bk), bk)
        k = k_ref[cols, :]
        x, t = logits_base2(dot(q, k, trans_b=True), bias_ref[:, cols] if ops.bias else None, st)
        if edge:
            k_pos = kb * bk + jnp.arange(bk, dtype=jnp.int32)[None, :]
            kv_seg = kv_seg_ref[cols][None, :] if ops.segments else None
            allowed = allowed_tile(
                st, ops, q_pos, k_pos, q_seg, kv_seg, mask_ref[:, cols] if ops.mask else None, kv_len_padded
            )
            if allowed is not None:
                x = jnp.where(allowed, x, -jnp.inf)
        p = exp2(x - lse, interpret=st.interpret)  # lse = +inf on empty rows: p = 0 there
        ds = p * (dot(do, v_ref[cols, :], trans_b=True) - delta)
        if ops.bias:
            dbias_ref[:, cols] = ds.astype(dbias_ref.dtype)
        if t is not None:
            ds = ds * (1.0 - t * t)
        return dq + dot(ds.astype(k.dtype), k)

    dq = listed_loop(lists_ref, lambda j: j, step, jnp.zeros((bq, q_ref.shape[-1]), jnp.float32))
    dq_ref[...] = (dq * st.softmax_scale).astype(dq_ref.dtype)


def _dkv_kernel(*refs, st: TritonBlockSparseStatic, ops: Operands, kv_len_padded: int):
    read = RefReader(refs)
    lists_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref = (read() for _ in range(7))
    bias_ref, mask_ref = read(ops.bias), read(ops.mask)
    q_seg_ref, kv_seg_ref = read(ops.segments), read(ops.segments)
    dk_ref, dv_ref = read.rest()

    bq, bk = st.block_q, st.block_k
    k_pos = pl.program_id(0) * bk + jnp.arange(bk, dtype=jnp.int32)[:, None]  # keys are the rows here
    k, v = k_ref[...], v_ref[...]
    kv_seg = kv_seg_ref[...][:, None] if ops.segments else None

    def tile_t(ref, per_head: bool, g, rows):
        """A `[block_q, block_k]` tile of a bias-like operand, transposed to `[block_k, block_q]`."""
        return (ref[g, rows, :] if per_head else ref[rows, :]).T

    def step(qb, carry, edge: bool, g):
        dk, dv = carry
        rows = pl.ds(pl.multiple_of(qb * bq, bq), bq)
        q, do = q_ref[g, rows, :], do_ref[g, rows, :]
        bias_t = tile_t(bias_ref, ops.bias_heads, g, rows) if ops.bias else None
        x, t = logits_base2(dot(k, q, trans_b=True), bias_t, st)  # [block_k, block_q]
        if edge:
            q_pos = qb * bq + jnp.arange(bq, dtype=jnp.int32)[None, :]
            q_seg = q_seg_ref[rows][None, :] if ops.segments else None
            mask_t = tile_t(mask_ref, ops.mask_heads, g, rows) if ops.mask else None
            allowed = allowed_tile(st, ops, q_pos, k_pos, q_seg, kv_seg, mask_t, kv_len_padded)
            if allowed is not None:
                x = jnp.where(allowed, x, -jnp.inf)
        p = exp2(x - lse_ref[g, rows][None, :], interpret=st.interpret)
        dv = dv + dot(p.astype(do.dtype), do)
        ds = p * (dot(v, do, trans_b=True) - delta_ref[g, rows][None, :])
        if t is not None:
            ds = ds * (1.0 - t * t)
        return dk + dot(ds.astype(q.dtype), q), dv

    def head(g, carry):
        index = (lambda j: (g, j)) if st.table_heads else (lambda j: j)
        return listed_loop(lists_ref, index, functools.partial(step, g=g), carry)

    carry = (jnp.zeros((bk, k_ref.shape[-1]), jnp.float32), jnp.zeros((bk, v_ref.shape[-1]), jnp.float32))
    dk, dv = head(0, carry) if st.group == 1 else lax.fori_loop(0, st.group, head, carry)
    dk_ref[...] = (dk * st.softmax_scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def _dq_and_dbias(
    st: TritonBlockSparseStatic, ops: Operands, q, k, v, do, lse, delta, bias, q_seg, kv_seg, mask, fwd_lists
):
    batch, num_heads, q_len_padded, head_dim = q.shape
    kv_len_padded, value_dim = k.shape[2], v.shape[3]
    group, bq = st.group, st.block_q
    row = lambda i, b, h: (b, h, i, 0)
    in_specs = [
        lists_spec(st, fwd_lists.shape[-1], lambda i: i),
        pl.BlockSpec((None, None, bq, head_dim), row),
        pl.BlockSpec((None, None, kv_len_padded, head_dim), lambda i, b, h: (b, h // group, 0, 0)),
        pl.BlockSpec((None, None, kv_len_padded, value_dim), lambda i, b, h: (b, h // group, 0, 0)),
        pl.BlockSpec((None, None, bq, value_dim), row),
        pl.BlockSpec((None, None, bq), lambda i, b, h: (b, h, i)),
        pl.BlockSpec((None, None, bq), lambda i, b, h: (b, h, i)),
    ]
    args = [fwd_lists, q, k, v, do, lse, delta]
    specs, arrays = row_operands(st, ops, kv_len_padded, bias, mask, q_seg, kv_seg)
    in_specs += specs
    args += arrays
    out_specs = [pl.BlockSpec((None, None, bq, head_dim), row)]
    out_shape = [out_struct(q.shape, q.dtype, *args)]
    aliases = {}
    if ops.bias:  # dBias is dense: the tiles no program visits keep the zeros of this buffer
        dbias_spec = pl.BlockSpec((None, None, bq, kv_len_padded), lambda i, b, h: (b, h, i, 0))
        in_specs.append(dbias_spec)
        args.append(jnp.zeros((batch, num_heads, q_len_padded, kv_len_padded), jnp.float32))
        out_specs.append(dbias_spec)
        out_shape.append(out_struct(args[-1].shape, jnp.float32, *args))
        aliases = {len(args) - 1: 1}
    outs = pl.pallas_call(
        functools.partial(_dq_kernel, st=st, ops=ops, kv_len_padded=kv_len_padded),
        grid=(q_len_padded // bq, batch, num_heads),
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        input_output_aliases=aliases,
        compiler_params=plgpu.CompilerParams(num_warps=st.bwd_warps, num_stages=st.bwd_stages),
        interpret=st.interpret,
        name="ejkernel_blocksparse_bwd_dq",
    )(*args)
    return outs[0], (outs[1] if ops.bias else None)


def _dk_dv(st: TritonBlockSparseStatic, ops: Operands, q, k, v, do, lse, delta, bias, q_seg, kv_seg, mask, bwd_lists):
    batch, _, q_len_padded, head_dim = q.shape
    num_kv_heads, kv_len_padded, value_dim = k.shape[1], k.shape[2], v.shape[3]
    group, bk = st.group, st.block_k
    width = bwd_lists.shape[-1]
    group_rows = lambda j, b, g: (b, g, 0, 0)  # the group's query heads, every row
    in_specs = [
        pl.BlockSpec(
            (None, group if st.table_heads else None, None, width),
            lambda j, b, g: (b if st.table_batch else 0, g if st.table_heads else 0, j, 0),
        ),
        pl.BlockSpec((None, group, q_len_padded, head_dim), group_rows),
        pl.BlockSpec((None, None, bk, head_dim), lambda j, b, g: (b, g, j, 0)),
        pl.BlockSpec((None, None, bk, value_dim), lambda j, b, g: (b, g, j, 0)),
        pl.BlockSpec((None, group, q_len_padded, value_dim), group_rows),
        pl.BlockSpec((None, group, q_len_padded), lambda j, b, g: (b, g, 0)),
        pl.BlockSpec((None, group, q_len_padded), lambda j, b, g: (b, g, 0)),
    ]
    args = [bwd_lists, q, k, v, do, lse, delta]
    for present, on_batch, on_heads, x in (
        (ops.bias, ops.bias_batch, ops.bias_heads, bias),
        (ops.mask, ops.mask_batch, ops.mask_heads, mask),
    ):
        if present:  # this kv head's query heads (or the one broadcast head), every row, one key block
            in_specs.append(
                pl.BlockSpec(
                    (None, group if on_heads else None, q_len_padded, bk),
                    lambda j, b, g, on_batch=on_batch, on_heads=on_heads: (
                        b if on_batch else 0,
                        g if on_heads else 0,
                        0,
                        j,
                    ),
                )
            )
            args.append(x)
    if ops.segments:
        in_specs += [
            pl.BlockSpec((None, q_len_padded), lambda j, b, g: (b, 0)),
            pl.BlockSpec((None, bk), lambda j, b, g: (b, j)),
        ]
        args += [q_seg, kv_seg]
    return pl.pallas_call(
        functools.partial(_dkv_kernel, st=st, ops=ops, kv_len_padded=kv_len_padded),
        grid=(kv_len_padded // bk, batch, num_kv_heads),
        in_specs=in_specs,
        out_specs=[
            pl.BlockSpec((None, None, bk, head_dim), lambda j, b, g: (b, g, j, 0)),
            pl.BlockSpec((None, None, bk, value_dim), lambda j, b, g: (b, g, j, 0)),
        ],
        out_shape=[out_struct(k.shape, k.dtype, *args), out_struct(v.shape, v.dtype, *args)],
        compiler_params=plgpu.CompilerParams(num_warps=st.bwd_warps, num_stages=st.bwd_stages),
        interpret=st.interpret,
        name="ejkernel_blocksparse_bwd_dkv",
    )(*args)


def backward(st: TritonBlockSparseStatic, residuals, do):
    """Cotangent of the padded output -> (dq, dk, dv, dbias | None, dsinks | None)."""
    q, k, v, bias, sinks, q_seg, kv_seg, mask, fwd_lists, bwd_lists, out, lse = residuals
    do = do.astype(out.dtype)
    delta = jnp.einsum("bhqd,bhqd->bhq", out.astype(jnp.float32), do.astype(jnp.float32))
    ops = Operands.of(bias, None, q_seg, mask, None)
    operands = (q, k, v, do, lse, delta, bias, q_seg, kv_seg, mask)
    dq, dbias = _dq_and_dbias(st, ops, *operands, fwd_lists)
    dk, dv = _dk_dv(st, ops, *operands, bwd_lists)
    if dbias is not None:
        dbias = sum_to_bias_shape(dbias, bias)
    dsinks = None
    if sinks is not None:  # d lse / d sink = exp(sink - lse), d out / d lse = -out
        p_sink = jnp.exp2(sinks.astype(jnp.float32)[None, :, None] * LOG2E - lse)
        dsinks = -jnp.sum(p_sink * delta, axis=(0, 2)).astype(sinks.dtype)
    return dq, dk, dv, dbias, dsinks
