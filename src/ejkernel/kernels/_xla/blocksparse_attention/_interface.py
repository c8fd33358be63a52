"""Block-sparse attention in plain JAX: the block table's lists walked by the gathered-block core.

Semantics are those of `ejkernel.reference.blocksparse_attention`. The call is checked and its mask
put in canonical form once (`_common.sparse_attention.checked_call`), the block table is built for
this tiling, and the core (`_core.py`) walks it: group (batch, head, query block), step w = the w-th
listed key block of the group. The backward is one fused pass (dQ, dK, dV and dbias in the same walk).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from ejkernel.kernels._common.attention import pad_axes, round_up
from ejkernel.kernels._common.sparse_attention.block_table import BlockTable, build_block_table
from ejkernel.kernels._common.sparse_attention.checked_call import blocksparse_call
from ejkernel.kernels._common.sparse_attention.masks import position_allowed
from ejkernel.kernels._common.vma import sum_to_vma
from ejkernel.ops.config import BwdParams, FwdParams

from . import _core

DEFAULT_BLOCK = 128


@dataclasses.dataclass(frozen=True)
class XlaBlockSparseStatic:
    """The static part of a call (hashable): logits, positional rules, lengths, and the step count."""

    logits: _core.Logits
    causal: bool
    window: tuple[int, int] | None
    chunk_size: int | None
    q_len: int
    kv_len: int
    steps: int | None  # the longest list when the table is concrete, else None (read at run time)


def _tiles(x, n_q: int, block_q: int, n_k: int, block_k: int, fill):
    """[X, Y, Sq, Sk] -> padded [X, Y, nQ, nK, block_q, block_k]."""
    x = pad_axes(x, {2: n_q * block_q - x.shape[2], 3: n_k * block_k - x.shape[3]}, fill)
    return x.reshape(*x.shape[:2], n_q, block_q, n_k, block_k).transpose(0, 1, 2, 4, 3, 5)


class TableWalk:
    """The walk of a block table over `[B, H, Sq, D]` queries: group (b, h, query block), one key block a step."""

    def __init__(self, st: XlaBlockSparseStatic, table: BlockTable, batch, heads, kv_heads, q_seg, kv_seg, mask, bias):
        self.st, bq, bk = st, table.block_q, table.block_k
        n_q, n_k = table.num_q_blocks, table.num_k_blocks
        shape = (batch, heads, n_q)
        width = table.kv_blocks.shape[-1]
        self.blocks = jnp.broadcast_to(table.kv_blocks, (*shape, width)).reshape(-1, width)
        self.counts = jnp.broadcast_to(table.kv_counts, shape).reshape(-1)
        self.steps = st.steps if st.steps is not None else jnp.max(self.counts)
        b, h, qb = (
            jnp.broadcast_to(x, shape).reshape(-1) for x in np.ix_(np.arange(batch), np.arange(heads), np.arange(n_q))
        )
        self.batch_index, self.head_index, self.q_block = b, h, qb
        self.k_base = (b * kv_heads + h // (heads // kv_heads)) * (n_k * bk)
        self.block_k = bk
        self.q_pos = qb[:, None] * bq + jnp.arange(bq)[None, :]
        self.q_seg = self.kv_seg = None
        if q_seg is not None:
            self.q_seg = pad_axes(q_seg, {1: n_q * bq - st.q_len}, -1).reshape(batch, n_q, bq)[b, qb]
            self.kv_seg = pad_axes(kv_seg, {1: n_k * bk - st.kv_len}, -1).reshape(batch, n_k, bk)
        self.mask_tiles = None if mask is None else _tiles(mask, n_q, bq, n_k, bk, False)
        self.bias_tiles = None if bias is None else _tiles(bias, n_q, bq, n_k, bk, 0)

    def _at(self, x, kb):
        """Tile of `x [X, Y, nQ, nK, bq, bk]` for every group at key blocks `kb` (X, Y broadcast)."""
        b = self.batch_index if x.shape[0] > 1 else 0
        h = self.head_index if x.shape[1] > 1 else 0
        return b, h, self.q_block, kb

    def rows(self, w):
        kb = self.blocks[:, w]
        return (self.k_base + kb * self.block_k)[:, None] + jnp.arange(self.block_k)[None, :]

    def mask(self, w):
        st, kb = self.st, self.blocks[:, w]
        k_pos = kb[:, None] * self.block_k + jnp.arange(self.block_k)[None, :]
        ok = (w < self.counts)[:, None, None] & (k_pos < st.kv_len)[:, None, :]
        rules = position_allowed(
            self.q_pos[:, :, None], k_pos[:, None, :], causal=st.causal, window=st.window, chunk_size=st.chunk_size
        )
        if rules is not None:
            ok = ok & rules
        if self.q_seg is not None:
            ks = self.kv_seg[self.batch_index, kb]
            ok = ok & (self.q_seg[:, :, None] == ks[:, None, :]) & (self.q_seg >= 0)[:, :, None]
        if self.mask_tiles is not None:
            ok = ok & self.mask_tiles[self._at(self.mask_tiles, kb)]
        return ok

    def bias(self, w):
        return None if self.bias_tiles is None else self.bias_tiles[self._at(self.bias_tiles, self.blocks[:, w])]

    def add_dbias(self, buf, w, ds):
        return buf.at[self._at(buf, self.blocks[:, w])].add(ds)


def _walk(st, table, q, k, q_seg, kv_seg, mask, bias):
    return TableWalk(st, table, q.shape[0], q.shape[1], k.shape[1], q_seg, kv_seg, mask, bias)


def _padded(x, blocks: int, block: int):
    return pad_axes(x, {2: blocks * block - x.shape[2]})


def _forward(st: XlaBlockSparseStatic, q, k, v, bias, sink, q_seg, kv_seg, mask, table: BlockTable):
    walk = _walk(st, table, q, k, q_seg, kv_seg, mask, bias)
    batch, heads, _, dim = q.shape
    n_q, n_k, bq, bk = table.num_q_blocks, table.num_k_blocks, table.block_q, table.block_k
    q_rows = _padded(q, n_q, bq).reshape(-1, bq, dim)
    k_flat = _padded(k, n_k, bk).reshape(-1, dim)
    v_flat = _padded(v, n_k, bk).reshape(-1, v.shape[-1])
    sink_rows = None if sink is None else jnp.broadcast_to(sink[walk.head_index][:, None], q_rows.shape[:2])
    out, lse = _core.forward(st.logits, walk, q_rows, k_flat, v_flat, sink_rows)
    out = out.reshape(batch, heads, n_q * bq, -1)[:, :, : st.q_len].astype(q.dtype)
    return out, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(st, q, k, v, bias, sink, q_seg, kv_seg, mask, table):
    return _forward(st, q, k, v, bias, sink, q_seg, kv_seg, mask, table)[0]


def _attention_fwd(st, q, k, v, bias, sink, q_seg, kv_seg, mask, table):
    out, lse = _forward(st, q, k, v, bias, sink, q_seg, kv_seg, mask, table)
    return out, (q, k, v, bias, sink, q_seg, kv_seg, mask, table, out, lse)


def _attention_bwd(st: XlaBlockSparseStatic, residuals, d_out):
    q, k, v, bias, sink, q_seg, kv_seg, mask, table, out, lse = residuals
    walk = _walk(st, table, q, k, q_seg, kv_seg, mask, bias)
    batch, heads, _, dim = q.shape
    n_q, n_k, bq, bk = table.num_q_blocks, table.num_k_blocks, table.block_q, table.block_k
    rows = lambda x: _padded(x, n_q, bq).reshape(-1, bq, x.shape[-1])
    sink_rows = None if sink is None else jnp.broadcast_to(sink[walk.head_index][:, None], (batch * heads * n_q, bq))
    dbias = None if bias is None else jnp.zeros((*bias.shape[:2], n_q, n_k, bq, bk), jnp.float32)
    dq, dk, dv, dbias, dsink = _core.backward(
        st.logits,
        walk,
        rows(q),
        _padded(k, n_k, bk).reshape(-1, dim),
        _padded(v, n_k, bk).reshape(-1, v.shape[-1]),
        sink_rows,
        rows(out),
        lse,
        rows(d_out),
        dbias,
    )
    unpad = lambda x, h, length, block, n, like: x.reshape(batch, h, n * block, -1)[:, :, :length].astype(like.dtype)
    dq = unpad(dq, heads, st.q_len, bq, n_q, q)
    dk = unpad(dk, k.shape[1], st.kv_len, bk, n_k, k)
    dv = unpad(dv, v.shape[1], st.kv_len, bk, n_k, v)
    if dbias is not None:
        dbias = dbias.transpose(0, 1, 2, 4, 3, 5).reshape(*bias.shape[:2], n_q * bq, n_k * bk)
        dbias = sum_to_vma(dbias[:, :, : st.q_len, : st.kv_len].astype(bias.dtype), bias)
    if dsink is not None:
        dsink = sum_to_vma(jnp.sum(dsink.reshape(batch, heads, -1), axis=(0, 2)), sink)
    return dq, dk, dv, dbias, dsink, None, None, None, None


_attention.defvjp(_attention_fwd, _attention_bwd)


def blocksparse_attention_xla(
    query,
    key,
    value,
    softmax_aux=None,
    bias=None,
    *,
    fwd_params: FwdParams | None = None,
    bwd_params: BwdParams | None = None,
    **options,
):
    """Block-sparse attention `[B, H, Sq, D] x [B, Hkv, Sk, D] -> [B, H, Sq, Dv]` in plain JAX.

    `**options` are the public options of `ejkernel.modules.blocksparse_attention` (defaults and checks in
    `_common.sparse_attention.checked_call.blocksparse_call`), plus canonical segment ids.
    Tiles are `fwd_params.block_q x block_k` (default 128 x 128, clamped to the lengths; the
    backward walks the same table, so `bwd_params` has nothing to set). Cost follows the number of
    listed blocks; memory is linear in the sequence length apart from a bias or dense mask the
    caller already holds at Sq x Sk.
    """
    del bwd_params
    call = blocksparse_call(
        "xla blocksparse_attention",
        query,
        key,
        value,
        softmax_aux,
        bias,
        fuses_backward=True,
        **options,
    )
    if call.q_len == 0 or call.kv_len == 0:
        return jnp.zeros((call.batch, call.heads, call.q_len, value.shape[-1]), query.dtype)
    block_q = (fwd_params.block_q if fwd_params is not None else None) or DEFAULT_BLOCK
    block_k = (fwd_params.block_k if fwd_params is not None else None) or DEFAULT_BLOCK
    block_q, block_k = min(block_q, round_up(call.q_len, 8)), min(block_k, round_up(call.kv_len, 8))
    mask = call.mask
    table = build_block_table(mask, q_len=call.q_len, kv_len=call.kv_len, block_q=block_q, block_k=block_k)
    counts = table.kv_counts
    st = XlaBlockSparseStatic(
        logits=_core.Logits(call.softmax_scale, call.soft_cap),
        causal=mask.causal,
        window=mask.sliding_window,
        chunk_size=mask.chunk_size,
        q_len=call.q_len,
        kv_len=call.kv_len,
        steps=int(np.asarray(counts).max()) if not isinstance(counts, jax.core.Tracer) else None,
    )
    dense = mask.attention_mask if table.needs_dense_mask else None
    return _attention(
        st, query, key, value, call.bias, call.sink, mask.q_segment_ids, mask.kv_segment_ids, dense, table
    )
