"""Native sparse attention in plain JAX: the selected branch walked by the gathered-block core.

Semantics are those of `ejkernel.reference.native_sparse_attention`. The shared part
(`_common.sparse_attention.native_sparse.native_selection`: checks, the compressed branch and the
choice of blocks) runs in plain jnp, and the sliding branch is XLA block-sparse attention. The selected branch is the
core of `_xla/blocksparse_attention` with one group per (token, key/value head) holding that head's
query heads, and one listed block a step, under a custom VJP whose backward scatter-adds dK and dV.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from ejkernel.kernels._common.attention import pad_axes
from ejkernel.kernels._common.sparse_attention.native_sparse import gate_branches, native_selection, sliding_branch
from ejkernel.kernels._xla.blocksparse_attention import _core
from ejkernel.kernels._xla.blocksparse_attention._interface import blocksparse_attention_xla
from ejkernel.ops.config import BwdParams, FwdParams


@dataclasses.dataclass(frozen=True)
class XlaNativeSparseStatic:
    """What is fixed at trace time (hashable): the logits' rules and the selected blocks' size."""

    logits: _core.Logits
    block_size: int


class SelectionWalk:
    """Group (b, t, key/value head) with its G query heads; step w visits the w-th listed block (-1: none)."""

    def __init__(self, block_size: int, indices, start, position, padded_len: int):
        batch, seq_len, kv_heads, n = indices.shape
        self.block_size, self.steps = block_size, n
        self.blocks = indices.reshape(-1, n)
        b, t, h = (
            jnp.broadcast_to(x, (batch, seq_len, kv_heads)).reshape(-1)
            for x in np.ix_(np.arange(batch), np.arange(seq_len), np.arange(kv_heads))
        )
        self.base = (b * kv_heads + h) * padded_len + jnp.asarray(start)[b, t]
        self.position = jnp.asarray(position)[b, t]

    def rows(self, w):
        block = jnp.maximum(self.blocks[:, w], 0)
        return (self.base + block * self.block_size)[:, None] + jnp.arange(self.block_size)[None, :]

    def mask(self, w):
        block = self.blocks[:, w]
        k_pos = block[:, None] * self.block_size + jnp.arange(self.block_size)[None, :]
        return ((block >= 0)[:, None] & (k_pos <= self.position[:, None]))[:, None, :]

    def bias(self, w):
        return None


def _flat(x, padded_len: int):
    """[B, S, Hkv, D] -> [B * Hkv * padded_len, D] (each head's sequence padded to `padded_len`)."""
    x = pad_axes(jnp.swapaxes(x, 1, 2), {2: padded_len - x.shape[1]})
    return x.reshape(-1, x.shape[-1])


def _operands(st: XlaNativeSparseStatic, q, k, v, indices, start, position):
    batch, seq_len, heads, dim = q.shape
    kv_heads = k.shape[2]
    padded_len = seq_len + st.block_size  # every gathered block stays inside its head's rows
    walk = SelectionWalk(st.block_size, indices, start, position, padded_len)
    q_rows = q.reshape(batch * seq_len * kv_heads, heads // kv_heads, dim)
    return walk, q_rows, _flat(k, padded_len), _flat(v, padded_len), padded_len


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _selected(st, q, k, v, indices, start, position):
    return _selected_fwd(st, q, k, v, indices, start, position)[0]


def _selected_fwd(st, q, k, v, indices, start, position):
    walk, q_rows, k_flat, v_flat, _ = _operands(st, q, k, v, indices, start, position)
    out, lse = _core.forward(st.logits, walk, q_rows, k_flat, v_flat, None)
    out = out.reshape(*q.shape[:3], -1).astype(q.dtype)
    return out, (q, k, v, indices, start, position, out, lse)


def _selected_bwd(st, residuals, d_out):
    q, k, v, indices, start, position, out, lse = residuals
    walk, q_rows, k_flat, v_flat, padded_len = _operands(st, q, k, v, indices, start, position)
    rows = lambda x: x.reshape(q_rows.shape[:2] + x.shape[-1:])
    dq, dk, dv, _, _ = _core.backward(st.logits, walk, q_rows, k_flat, v_flat, None, rows(out), lse, rows(d_out), None)
    batch, seq_len, kv_heads = k.shape[:3]
    unflat = lambda x, like: jnp.swapaxes(x.reshape(batch, kv_heads, padded_len, -1)[:, :, :seq_len], 1, 2).astype(
        like.dtype
    )
    return dq.reshape(q.shape).astype(q.dtype), unflat(dk, k), unflat(dv, v), None, None, None


_selected.defvjp(_selected_fwd, _selected_bwd)


def native_sparse_attention_xla(
    query,
    key,
    value,
    g_cmp=None,
    g_slc=None,
    block_indices=None,
    block_counts=16,
    cu_seqlens=None,
    g_swa=None,
    *,
    softmax_scale=None,
    window_size: int = 0,
    block_size: int = 64,
    fwd_params: FwdParams | None = None,
    bwd_params: BwdParams | None = None,
):
    """Native sparse attention `[B, S, H, D] -> [B, S, H, Dv]` in plain JAX (any head ratio).

    Takes the public options of `ejkernel.modules.native_sparse_attention`, `block_size` among them.
    The selected branch costs in proportion to the listed blocks, the sliding branch (XLA
    block-sparse attention) to the window; the compressed branch is dense over the block means
    (S x S / block_size). Tilings (`fwd_params`, `bwd_params`) have nothing to set here.
    """
    del fwd_params, bwd_params
    sel = native_selection(
        query,
        key,
        value,
        g_cmp,
        g_slc,
        block_indices,
        block_counts,
        cu_seqlens,
        g_swa,
        softmax_scale=softmax_scale,
        window_size=window_size,
        block_size=block_size,
    )
    st = XlaNativeSparseStatic(_core.Logits(sel.softmax_scale, None), block_size)
    selected = _selected(st, query, key, value, sel.indices, sel.pack.start, sel.pack.position)
    sliding = None
    if g_swa is not None:
        attend = blocksparse_attention_xla
        sliding = sliding_branch(attend, query, key, value, cu_seqlens, sel.pack, window_size, sel.softmax_scale)
    return gate_branches(selected, g_slc, sel.compressed, g_cmp, query.dtype, sliding, g_swa)
