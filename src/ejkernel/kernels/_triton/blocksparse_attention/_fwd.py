"""Block-sparse attention forward: one Pallas-Triton program per (query block, batch, query head).

Each program reads its row of the block table, `[count, edges, block, block, ...]`, and streams only
the listed key blocks: the first `edges` of them with the token mask (positional rules, key length,
segments, dense mask), the rest (full tiles) without any. Online softmax in float32 with base-2
exponentials; the outputs are the attention output and each row's base-2 logsumexp (+inf for a row
with nothing allowed and no sink), which is all the backward needs.

Layout `[B, H, S, D]`; arrays arrive padded to tile multiples and power-of-two head dims. Grouped
heads read their key/value head through the index maps.
"""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from ejkernel.kernels._common.attention import LOG2E, Operands, RefReader, join_sink
from ejkernel.kernels._common.sparse_attention.masks import position_allowed
from ejkernel.kernels._common.vma import out_struct
from ejkernel.kernels._triton._helpers import and_masks, dot, exp2
from ejkernel.kernels._triton.flash_attention._fwd import bias_like_spec, logits_base2


@dataclasses.dataclass(frozen=True)
class TritonBlockSparseStatic:
    """Everything fixed at trace time (hashable: it keys the custom VJP)."""

    softmax_scale: float
    soft_cap: float | None
    fast_tanh: bool  # the soft cap's hardware tanh (16-bit inputs on a GPU)
    causal: bool
    window: tuple[int, int] | None
    chunk_size: int | None
    q_len: int  # true lengths, before padding
    kv_len: int
    num_heads: int
    num_kv_heads: int
    block_q: int  # the block table's tiles, shared by every kernel
    block_k: int
    table_batch: bool  # the table differs per batch row / per head (else one for all)
    table_heads: bool
    fwd_warps: int
    fwd_stages: int
    bwd_warps: int
    bwd_stages: int
    interpret: bool

    @property
    def group(self) -> int:
        return self.num_heads // self.num_kv_heads


def allowed_tile(
    st: TritonBlockSparseStatic, ops: Operands, q_pos, k_pos, q_seg, kv_seg, mask_tile, kv_len_padded: int
):
    """The token mask of an edge tile (positions broadcast into its shape), or None when nothing masks."""
    return and_masks(
        position_allowed(q_pos, k_pos, causal=st.causal, window=st.window, chunk_size=st.chunk_size),
        (k_pos < st.kv_len) if st.kv_len != kv_len_padded else None,
        ((q_seg == kv_seg) & (q_seg >= 0)) if ops.segments else None,
        (mask_tile != 0) if ops.mask else None,
    )


def listed_loop(lists_ref, index, step, carry):
    """`step(block, carry, edge)` over the blocks a table row lists: edge tiles first, then full ones.

    `index(i)` locates entry i of the row in `lists_ref` (the row is `[count, edges, blocks...]`).
    """
    count, edges = lists_ref[index(0)], lists_ref[index(1)]
    carry = lax.fori_loop(0, edges, lambda j, c: step(lists_ref[index(j + 2)], c, True), carry)
    return lax.fori_loop(edges, count, lambda j, c: step(lists_ref[index(j + 2)], c, False), carry)


def lists_spec(st: TritonBlockSparseStatic, width: int, block_of):
    """BlockSpec of a packed table `[Bt, Ht, blocks, width]` for a grid (block, batch, head)."""
    return pl.BlockSpec(
        (None, None, None, width),
        lambda i, b, h: (b if st.table_batch else 0, h if st.table_heads else 0, block_of(i), 0),
    )


def row_operands(st: TritonBlockSparseStatic, ops: Operands, kv_len_padded: int, bias, mask, q_seg, kv_seg):
    """(BlockSpecs, arrays) of bias, mask and segment ids for a grid over (query block, batch, head)."""
    specs, arrays = [], []
    rows = lambda i, b, h: (i, 0)
    for present, on_batch, on_heads, x in (
        (ops.bias, ops.bias_batch, ops.bias_heads, bias),
        (ops.mask, ops.mask_batch, ops.mask_heads, mask),
    ):
        if present:
            specs.append(bias_like_spec(on_batch, on_heads, (st.block_q, kv_len_padded), rows))
            arrays.append(x)
    if ops.segments:
        specs += [
            pl.BlockSpec((None, st.block_q), lambda i, b, h: (b, i)),
            pl.BlockSpec((None, kv_len_padded), lambda i, b, h: (b, 0)),
        ]
        arrays += [q_seg, kv_seg]
    return specs, arrays


def _forward_kernel(*refs, st: TritonBlockSparseStatic, ops: Operands, kv_len_padded: int):
    read = RefReader(refs)
    lists_ref, q_ref, k_ref, v_ref = read(), read(), read(), read()
    bias_ref, mask_ref = read(ops.bias), read(ops.mask)
    q_seg_ref, kv_seg_ref = read(ops.segments), read(ops.segments)
    sink_ref = read(ops.sinks)
    o_ref, lse_ref = read.rest()

    bq, bk = st.block_q, st.block_k
    h = pl.program_id(2)
    q_pos = pl.program_id(0) * bq + jnp.arange(bq, dtype=jnp.int32)[:, None]
    q = q_ref[...]
    q_seg = q_seg_ref[...][:, None] if ops.segments else None

    def step(kb, carry, edge: bool):
        acc, m_prev, l_prev = carry
        cols = pl.ds(pl.multiple_of(kb * bk, bk), bk)
        x, _ = logits_base2(dot(q, k_ref[cols, :], trans_b=True), bias_ref[:, cols] if ops.bias else None, st)
        if edge:
            k_pos = kb * bk + jnp.arange(bk, dtype=jnp.int32)[None, :]
            kv_seg = kv_seg_ref[cols][None, :] if ops.segments else None
            mask_tile = mask_ref[:, cols] if ops.mask else None
            allowed = allowed_tile(st, ops, q_pos, k_pos, q_seg, kv_seg, mask_tile, kv_len_padded)
            if allowed is not None:
                x = jnp.where(allowed, x, -jnp.inf)
        m_next = jnp.maximum(m_prev, jnp.max(x, axis=1))
        shift = jnp.where(m_next == -jnp.inf, 0.0, m_next)  # nothing allowed yet: no inf - inf
        alpha = exp2(m_prev - shift, interpret=st.interpret)
        p = exp2(x - shift[:, None], interpret=st.interpret)
        v = v_ref[cols, :]
        return acc * alpha[:, None] + dot(p.astype(v.dtype), v), m_next, l_prev * alpha + jnp.sum(p, axis=1)

    carry = (
        jnp.zeros((bq, o_ref.shape[-1]), jnp.float32),
        jnp.full((bq,), -jnp.inf, jnp.float32),
        jnp.zeros((bq,), jnp.float32),
    )
    acc, m, denom = listed_loop(lists_ref, lambda j: j, step, carry)
    if ops.sinks:  # the sinks join the denominator only
        sink = sink_ref[pl.ds(h, 1)] * LOG2E  # this head's log-sum-exp of its sinks
        m, alpha, denom = join_sink(m, denom, sink, functools.partial(exp2, interpret=st.interpret))
        acc = acc * alpha[:, None]
    empty = denom == 0.0  # no allowed key and no sink: output 0, lse +inf (every p recomputes to 0)
    denom = jnp.where(empty, 1.0, denom)
    o_ref[...] = (acc / denom[:, None]).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(empty, jnp.inf, m + jnp.log2(denom))


def forward(st: TritonBlockSparseStatic, q, k, v, bias, sinks, q_seg, kv_seg, mask, fwd_lists):
    """Padded operands -> (output [B, H, Sqp, Dvp] in q.dtype, base-2 lse [B, H, Sqp] float32)."""
    batch, num_heads, q_len_padded, head_dim = q.shape
    kv_len_padded, value_dim = k.shape[2], v.shape[3]
    group, bq = st.group, st.block_q
    ops = Operands.of(bias, sinks, q_seg, mask, None)
    in_specs = [
        lists_spec(st, fwd_lists.shape[-1], lambda i: i),
        pl.BlockSpec((None, None, bq, head_dim), lambda i, b, h: (b, h, i, 0)),
        pl.BlockSpec((None, None, kv_len_padded, head_dim), lambda i, b, h: (b, h // group, 0, 0)),
        pl.BlockSpec((None, None, kv_len_padded, value_dim), lambda i, b, h: (b, h // group, 0, 0)),
    ]
    args = [fwd_lists, q, k, v]
    specs, arrays = row_operands(st, ops, kv_len_padded, bias, mask, q_seg, kv_seg)
    in_specs += specs
    args += arrays
    if ops.sinks:
        in_specs.append(pl.BlockSpec((num_heads,), lambda i, b, h: (0,)))
        args.append(sinks)
    return pl.pallas_call(
        functools.partial(_forward_kernel, st=st, ops=ops, kv_len_padded=kv_len_padded),
        grid=(q_len_padded // bq, batch, num_heads),
        in_specs=in_specs,
        out_specs=[
            pl.BlockSpec((None, None, bq, value_dim), lambda i, b, h: (b, h, i, 0)),
            pl.BlockSpec((None, None, bq), lambda i, b, h: (b, h, i)),
        ],
        out_shape=[
            out_struct((batch, num_heads, q_len_padded, value_dim), q.dtype, *args),
            out_struct((batch, num_heads, q_len_padded), jnp.float32, *args),
        ],
        compiler_params=plgpu.CompilerParams(num_warps=st.fwd_warps, num_stages=st.fwd_stages),
        interpret=st.interpret,
        name="ejkernel_blocksparse_fwd",
    )(*args)
