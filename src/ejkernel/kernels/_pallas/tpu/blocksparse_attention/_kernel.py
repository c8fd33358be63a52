"""Block-sparse attention as Pallas Mosaic TPU kernels: forward, dQ and dK/dV over the block table.

The block table travels as scalar-prefetch operands (SMEM): `blocks` (flat lists), `counts` and
`edges` per table row. A grid's last axis walks the entries of a row: the key/value (or query) index
maps read the listed block, so the pipeline fetches exactly the listed tiles; steps past a row's
count repeat its last entry (nothing new is fetched) and compute nothing. The first `edges` entries
of a row build the token mask, the full tiles after them none.

- forward: grid `(B, H, q blocks, Wk)`, online softmax in VMEM scratch (natural-log units, statistics
  lane-replicated as in the flash attention kernels, whose tile numerics these reuse);
- dQ: the same grid, dQ in scratch, dBias tiles written where visited (zeros elsewhere);
- dK/dV: grid `(B, Hkv, k blocks, group, Wq)`, walking each query head of the group over the query
  blocks the transposed table lists, dK and dV in scratch.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ejkernel.kernels._common.attention import Operands, RefReader, join_sink, sum_to_bias_shape
from ejkernel.kernels._common.sparse_attention.masks import position_allowed
from ejkernel.kernels._pallas.tpu.flash_attention._bwd import NN_DIMS, TN_DIMS
from ejkernel.kernels._pallas.tpu.flash_attention._fwd import (
    LANES,
    SUBLANES,
    allowed_tile,
    compiler_params,
    lanes,
    logits,
    side_args,
    side_specs,
)


@dataclasses.dataclass(frozen=True)
class TpuBlockSparseStatic:
    """Everything fixed at trace time (hashable: it keys the custom VJP)."""

    softmax_scale: float
    soft_cap: float | None
    causal: bool
    window: tuple[int, int] | None
    chunk_size: int | None
    q_len: int
    kv_len: int
    num_heads: int
    num_kv_heads: int
    block_q: int
    block_k: int
    table_batch: bool  # the table differs per batch row / per head (else one for all)
    table_heads: bool
    num_q_blocks: int
    num_k_blocks: int
    interpret: object  # False, or the `pltpu.InterpretParams` to run the kernels with

    @property
    def group(self) -> int:
        return self.num_heads // self.num_kv_heads


def table_row(st: TpuBlockSparseStatic, b, h, block, num_blocks: int):
    """Flat index of the table row of (batch b, head h, block): rows are `[Bt, Ht, num_blocks]`."""
    bt = b if st.table_batch else 0
    ht = h if st.table_heads else 0
    return (bt * (st.num_heads if st.table_heads else 1) + ht) * num_blocks + block


def _tile(st: TpuBlockSparseStatic, ops: Operands, edge: bool, q_start, k_start, refs, *, kv_len_padded: int):
    """Logits of a `[block_q, block_k]` tile (-inf where masked on an edge tile) and the cap's tanh."""
    q_ref, k_ref, bias_ref, q_seg_ref, kv_seg_ref, mask_ref = refs
    s, t = logits(q_ref[...], k_ref[...], bias_ref[...] if ops.bias else None, st)
    if edge:
        shape = s.shape
        rows = q_start + lax.broadcasted_iota(jnp.int32, shape, 0)
        cols = k_start + lax.broadcasted_iota(jnp.int32, shape, 1)
        allowed = position_allowed(rows, cols, causal=st.causal, window=st.window, chunk_size=st.chunk_size)
        if st.kv_len != kv_len_padded:
            allowed = cols < st.kv_len if allowed is None else allowed & (cols < st.kv_len)
        others = allowed_tile(
            st,
            ops,
            False,
            q_start,
            k_start,
            shape,
            kv_len_padded=kv_len_padded,
            q_seg_ref=q_seg_ref,
            kv_seg_ref=kv_seg_ref,
            mask_ref=mask_ref,
        )
        if others is not True:
            allowed = others if allowed is None else allowed & others
        if allowed is not None:
            s = jnp.where(allowed, s, -jnp.inf)
    return s, t


def _walk(w, count, edges, body):
    """Runs `body(edge)` for a listed step: edge entries with the token mask, full ones without."""
    pl.when(w < edges)(lambda: body(True))
    pl.when(jnp.logical_and(w >= edges, w < count))(lambda: body(False))


def _forward_kernel(
    blocks_ref, counts_ref, edges_ref, *refs, st: TpuBlockSparseStatic, ops: Operands, kv_len_padded: int
):
    read = RefReader(refs)
    q_ref, k_ref, v_ref = read(), read(), read()
    bias_ref, mask_ref = read(ops.bias), read(ops.mask)
    q_seg_ref, kv_seg_ref = read(ops.segments), read(ops.segments)
    sinks_ref = read(ops.sinks)
    o_ref, lse_ref, m_scratch, l_scratch, acc_scratch = read.rest()

    b, h, qi, w = (pl.program_id(i) for i in range(4))
    row = table_row(st, b, h, qi, st.num_q_blocks)
    width = pl.num_programs(3)

    @pl.when(w == 0)
    def _init():
        m_scratch[...] = jnp.full(m_scratch.shape, -jnp.inf, jnp.float32)
        l_scratch[...] = jnp.zeros(l_scratch.shape, jnp.float32)
        acc_scratch[...] = jnp.zeros(acc_scratch.shape, jnp.float32)

    def body(edge: bool):
        k_start = blocks_ref[row * width + w] * st.block_k
        refs = (q_ref, k_ref, bias_ref, q_seg_ref, kv_seg_ref, mask_ref)
        s, _ = _tile(st, ops, edge, qi * st.block_q, k_start, refs, kv_len_padded=kv_len_padded)
        m_prev, l_prev = m_scratch[...], l_scratch[...]  # [block_q, 128]
        m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
        shift = jnp.where(m_next == -jnp.inf, 0.0, m_next)  # nothing allowed yet: no inf - inf
        alpha = jnp.exp(m_prev - shift)
        p = jnp.exp(s - lanes(shift, st.block_k))
        l_scratch[...] = alpha * l_prev + jnp.sum(p, axis=1, keepdims=True)
        m_scratch[...] = m_next
        v = v_ref[...]
        pv = lax.dot_general(p.astype(v.dtype), v, NN_DIMS, preferred_element_type=jnp.float32)
        acc_scratch[...] = acc_scratch[...] * lanes(alpha, v.shape[-1]) + pv

    _walk(w, counts_ref[row], edges_ref[row], body)

    @pl.when(w == width - 1)
    def _finish():
        m, denom, acc = m_scratch[...], l_scratch[...], acc_scratch[...]
        if ops.sinks:  # the sinks join the denominator only
            m, alpha, denom = join_sink(m, denom, sinks_ref[0, h], jnp.exp)
            acc = acc * lanes(alpha, acc.shape[-1])
        empty = denom == 0.0  # no allowed key and no sink: output 0, lse +inf
        denom = jnp.where(empty, 1.0, denom)
        o_ref[...] = (acc * lanes(1.0 / denom, acc.shape[-1])).astype(o_ref.dtype)
        lse_ref[...] = jnp.where(empty, jnp.inf, m + jnp.log(denom))


def _scalar_grid(grid, in_specs, out_specs, scratch_shapes):
    return pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=3, grid=grid, in_specs=in_specs, out_specs=out_specs, scratch_shapes=scratch_shapes
    )


def _listed_k(st: TpuBlockSparseStatic, width: int):
    """(b, h, q block, step) -> the key block the step reads (its table row's entry)."""

    def kb(b, h, qi, w, blocks_ref, *_):
        return blocks_ref[table_row(st, b, h, qi, st.num_q_blocks) * width + w]

    return kb


def forward(st: TpuBlockSparseStatic, q, k, v, bias, sinks, q_seg, kv_seg, mask, table):
    """Padded `[B, H, S, D]` operands -> (output `[B, H, Sqp, Dv]`, lse `[B, H, Sqp, 128]` float32)."""
    blocks, counts, edges = table[:3]
    batch, num_heads, q_len_padded, head_dim = q.shape
    kv_len_padded, value_dim = k.shape[2], v.shape[3]
    bq, bk, group = st.block_q, st.block_k, st.group
    width = blocks.shape[0] // counts.shape[0]
    ops = Operands.of(bias, sinks, q_seg, mask, None)
    if ops.sinks:  # one row per sublane, as SMEM operands are laid out
        sinks = jnp.broadcast_to(sinks.astype(jnp.float32)[None, :], (SUBLANES, num_heads))
    kb = _listed_k(st, width)
    in_specs = [
        pl.BlockSpec((None, None, bq, head_dim), lambda b, h, qi, w, *_: (b, h, qi, 0)),
        pl.BlockSpec((None, None, bk, head_dim), lambda b, h, qi, w, *t: (b, h // group, kb(b, h, qi, w, *t), 0)),
        pl.BlockSpec((None, None, bk, value_dim), lambda b, h, qi, w, *t: (b, h // group, kb(b, h, qi, w, *t), 0)),
        *side_specs(st, ops, block_q=bq, block_k=bk, index=lambda b, h, qi, w, *t: (b, h, qi, kb(b, h, qi, w, *t))),
    ]
    out_specs = [
        pl.BlockSpec((None, None, bq, value_dim), lambda b, h, qi, w, *_: (b, h, qi, 0)),
        pl.BlockSpec((None, None, bq, LANES), lambda b, h, qi, w, *_: (b, h, qi, 0)),
    ]
    scratch = [pltpu.VMEM((bq, LANES), jnp.float32), pltpu.VMEM((bq, LANES), jnp.float32)]
    scratch.append(pltpu.VMEM((bq, value_dim), jnp.float32))
    return pl.pallas_call(
        functools.partial(_forward_kernel, st=st, ops=ops, kv_len_padded=kv_len_padded),
        grid_spec=_scalar_grid((batch, num_heads, q_len_padded // bq, width), in_specs, out_specs, scratch),
        out_shape=[
            jax.ShapeDtypeStruct((batch, num_heads, q_len_padded, value_dim), q.dtype),
            jax.ShapeDtypeStruct((batch, num_heads, q_len_padded, LANES), jnp.float32),
        ],
        compiler_params=compiler_params(4),
        interpret=st.interpret,
        name="ejkernel_tpu_blocksparse_fwd",
    )(blocks, counts, edges, q, k, v, *side_args(ops, bias, mask, q_seg, kv_seg, sinks))


def _tile_grads(st, ops, edge, q_start, k_start, refs, *, kv_len_padded):
    """(P, dS before the cap, dS through the cap) of one `[block_q, block_k]` tile."""
    q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, bias_ref, mask_ref, q_seg_ref, kv_seg_ref = refs
    logit_refs = (q_ref, k_ref, bias_ref, q_seg_ref, kv_seg_ref, mask_ref)
    s, t = _tile(st, ops, edge, q_start, k_start, logit_refs, kv_len_padded=kv_len_padded)
    p = jnp.exp(s - lanes(lse_ref[...], st.block_k))  # lse = +inf on empty rows: p = 0 there
    dp = lax.dot_general(do_ref[...], v_ref[...], (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    ds = p * (dp - lanes(delta_ref[...], st.block_k))
    return p, ds, (ds if t is None else ds * (1.0 - t * t))


def _dq_kernel(blocks_ref, counts_ref, edges_ref, *refs, st: TpuBlockSparseStatic, ops: Operands, kv_len_padded: int):
    read = RefReader(refs)
    q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref = (read() for _ in range(6))
    bias_ref, mask_ref = read(ops.bias), read(ops.mask)
    q_seg_ref, kv_seg_ref = read(ops.segments), read(ops.segments)
    _ = read(ops.bias)  # the zeroed dBias buffer, aliased to the dbias output
    dq_ref = read()
    dbias_ref = read(ops.bias)
    (dq_scratch,) = read.rest()

    b, h, qi, w = (pl.program_id(i) for i in range(4))
    row = table_row(st, b, h, qi, st.num_q_blocks)
    width = pl.num_programs(3)
    count = counts_ref[row]
    refs = (q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, bias_ref, mask_ref, q_seg_ref, kv_seg_ref)

    @pl.when(w == 0)
    def _init():
        dq_scratch[...] = jnp.zeros(dq_scratch.shape, jnp.float32)
        if ops.bias:  # a row listing nothing still writes back the tile of its (repeated) entry: zeros

            @pl.when(count == 0)
            def _zero():
                dbias_ref[...] = jnp.zeros(dbias_ref.shape, dbias_ref.dtype)

    def body(edge: bool):
        k_start = blocks_ref[row * width + w] * st.block_k
        _, ds, ds_logits = _tile_grads(st, ops, edge, qi * st.block_q, k_start, refs, kv_len_padded=kv_len_padded)
        if ops.bias:
            dbias_ref[...] = ds.astype(dbias_ref.dtype)
        k = k_ref[...]
        dq_scratch[...] += lax.dot_general(ds_logits.astype(k.dtype), k, NN_DIMS, preferred_element_type=jnp.float32)

    _walk(w, count, edges_ref[row], body)

    @pl.when(w == width - 1)
    def _finish():
        dq_ref[...] = (dq_scratch[...] * st.softmax_scale).astype(dq_ref.dtype)


def _dkv_kernel(blocks_ref, counts_ref, edges_ref, *refs, st: TpuBlockSparseStatic, ops: Operands, kv_len_padded: int):
    read = RefReader(refs)
    q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref = (read() for _ in range(6))
    bias_ref, mask_ref = read(ops.bias), read(ops.mask)
    q_seg_ref, kv_seg_ref = read(ops.segments), read(ops.segments)
    dk_ref, dv_ref, dk_scratch, dv_scratch = read.rest()

    b, hkv, ki, g, w = (pl.program_id(i) for i in range(5))
    row = table_row(st, b, hkv * st.group + g, ki, st.num_k_blocks)
    width = pl.num_programs(4)
    refs = (q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, bias_ref, mask_ref, q_seg_ref, kv_seg_ref)

    @pl.when(jnp.logical_and(g == 0, w == 0))
    def _init():
        dk_scratch[...] = jnp.zeros(dk_scratch.shape, jnp.float32)
        dv_scratch[...] = jnp.zeros(dv_scratch.shape, jnp.float32)

    def body(edge: bool):
        q_start = blocks_ref[row * width + w] * st.block_q
        p, _, ds_logits = _tile_grads(st, ops, edge, q_start, ki * st.block_k, refs, kv_len_padded=kv_len_padded)
        q, do = q_ref[...], do_ref[...]
        dv_scratch[...] += lax.dot_general(p.astype(do.dtype), do, TN_DIMS, preferred_element_type=jnp.float32)
        dk_scratch[...] += lax.dot_general(ds_logits.astype(q.dtype), q, TN_DIMS, preferred_element_type=jnp.float32)

    _walk(w, counts_ref[row], edges_ref[row], body)

    @pl.when(jnp.logical_and(g == pl.num_programs(3) - 1, w == width - 1))
    def _finish():
        dk_ref[...] = (dk_scratch[...] * st.softmax_scale).astype(dk_ref.dtype)
        dv_ref[...] = dv_scratch[...].astype(dv_ref.dtype)


def _row_specs(bq, head_dim, value_dim, index):
    """Specs of q, dO, lse, delta for the query tile `index(*grid, *tables) -> (b, h, q block)`."""
    return [
        pl.BlockSpec((None, None, bq, head_dim), lambda *g: (*index(*g), 0)),
        pl.BlockSpec((None, None, bq, value_dim), lambda *g: (*index(*g), 0)),
        pl.BlockSpec((None, None, bq, LANES), lambda *g: (*index(*g), 0)),
        pl.BlockSpec((None, None, bq, LANES), lambda *g: (*index(*g), 0)),
    ]


def _dq_and_dbias(st, ops, q, k, v, do, lse, delta, bias, q_seg, kv_seg, mask, table):
    blocks, counts, edges = table[:3]
    batch, num_heads, q_len_padded, head_dim = q.shape
    kv_len_padded, value_dim = k.shape[2], v.shape[3]
    bq, bk, group = st.block_q, st.block_k, st.group
    width = blocks.shape[0] // counts.shape[0]
    kb = _listed_k(st, width)
    in_specs = _row_specs(bq, head_dim, value_dim, lambda b, h, qi, w, *_: (b, h, qi))
    in_specs[1:1] = [
        pl.BlockSpec((None, None, bk, head_dim), lambda b, h, qi, w, *t: (b, h // group, kb(b, h, qi, w, *t), 0)),
        pl.BlockSpec((None, None, bk, value_dim), lambda b, h, qi, w, *t: (b, h // group, kb(b, h, qi, w, *t), 0)),
    ]
    tile = lambda b, h, qi, w, *t: (b, h, qi, kb(b, h, qi, w, *t))
    in_specs += side_specs(st, ops, block_q=bq, block_k=bk, index=tile)
    args = [q, k, v, do, lse, delta, *side_args(ops, bias, mask, q_seg, kv_seg)]
    out_specs = [pl.BlockSpec((None, None, bq, head_dim), lambda b, h, qi, w, *_: (b, h, qi, 0))]
    out_shape = [jax.ShapeDtypeStruct(q.shape, q.dtype)]
    aliases = {}
    if ops.bias:  # dBias is dense: tiles no step visits keep the zeros of this buffer
        in_specs.append(pl.BlockSpec(memory_space=pl.ANY))
        args.append(jnp.zeros((batch, num_heads, q_len_padded, kv_len_padded), jnp.float32))
        out_specs.append(pl.BlockSpec((None, None, bq, bk), tile))
        out_shape.append(jax.ShapeDtypeStruct(args[-1].shape, jnp.float32))
        aliases = {3 + len(args) - 1: 1}
    outs = pl.pallas_call(
        functools.partial(_dq_kernel, st=st, ops=ops, kv_len_padded=kv_len_padded),
        grid_spec=_scalar_grid(
            (batch, num_heads, q_len_padded // bq, width),
            in_specs,
            out_specs,
            [pltpu.VMEM((bq, head_dim), jnp.float32)],
        ),
        out_shape=out_shape,
        input_output_aliases=aliases,
        compiler_params=compiler_params(4),
        interpret=st.interpret,
        name="ejkernel_tpu_blocksparse_bwd_dq",
    )(blocks, counts, edges, *args)
    return outs[0], (outs[1] if ops.bias else None)


def _dk_dv(st, ops, q, k, v, do, lse, delta, bias, q_seg, kv_seg, mask, table):
    blocks, counts, edges = table[3:]
    head_dim = q.shape[3]
    batch, num_kv_heads, kv_len_padded, value_dim = *k.shape[:3], v.shape[3]
    bq, bk, group = st.block_q, st.block_k, st.group
    width = blocks.shape[0] // counts.shape[0]

    def q_tile(b, hkv, ki, g, w, blocks_ref, *_):
        h = hkv * group + g
        return b, h, blocks_ref[table_row(st, b, h, ki, st.num_k_blocks) * width + w]

    kv_block = lambda b, hkv, ki, g, w, *_: (b, hkv, ki, 0)
    in_specs = _row_specs(bq, head_dim, value_dim, q_tile)
    kv_specs = [pl.BlockSpec((None, None, bk, head_dim), kv_block), pl.BlockSpec((None, None, bk, value_dim), kv_block)]
    in_specs[1:1] = kv_specs
    in_specs += side_specs(st, ops, block_q=bq, block_k=bk, index=lambda *g: (*q_tile(*g), g[2]))
    scratch = [pltpu.VMEM((bk, head_dim), jnp.float32), pltpu.VMEM((bk, value_dim), jnp.float32)]
    return pl.pallas_call(
        functools.partial(_dkv_kernel, st=st, ops=ops, kv_len_padded=kv_len_padded),
        grid_spec=_scalar_grid(
            (batch, num_kv_heads, kv_len_padded // bk, group, width),
            in_specs,
            kv_specs,
            scratch,
        ),
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
        compiler_params=compiler_params(5, sequential=2),
        interpret=st.interpret,
        name="ejkernel_tpu_blocksparse_bwd_dkv",
    )(blocks, counts, edges, q, k, v, do, lse, delta, *side_args(ops, bias, mask, q_seg, kv_seg))


def backward(st: TpuBlockSparseStatic, residuals, do):
    """Cotangent of the padded output -> (dq, dk, dv, dbias | None, dsinks | None)."""
    q, k, v, bias, sinks, q_seg, kv_seg, mask, table, out, lse = residuals
    do = do.astype(out.dtype)
    delta = jnp.sum(out.astype(jnp.float32) * do.astype(jnp.float32), axis=-1)  # [B, H, Sqp]
    delta_lanes = jnp.broadcast_to(delta[..., None], lse.shape)
    ops = Operands.of(bias, None, q_seg, mask, None)
    operands = (q, k, v, do, lse, delta_lanes, bias, q_seg, kv_seg, mask, table)
    dq, dbias = _dq_and_dbias(st, ops, *operands)
    dk, dv = _dk_dv(st, ops, *operands)
    if dbias is not None:
        dbias = sum_to_bias_shape(dbias, bias)
    dsinks = None
    if sinks is not None:  # d lse / d sink = exp(sink - lse), d out / d lse = -out
        p_sink = jnp.exp(sinks.astype(jnp.float32)[None, :, None] - lse[..., 0])
        dsinks = -jnp.sum(p_sink * delta, axis=(0, 2)).astype(sinks.dtype)
    return dq, dk, dv, dbias, dsinks
