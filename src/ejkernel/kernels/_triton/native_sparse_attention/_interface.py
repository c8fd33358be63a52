"""Native sparse attention with its selected branch on Pallas-Triton kernels.

The shared part (`_common.sparse_attention.native_sparse.native_selection`: checks, the compressed
branch in jnp and the choice of blocks) runs first. This wrapper then lists each token's blocks valid-first, pads the
query heads of a key/value head to at least 16 rows (the matmuls' minimum) and the head dims to
powers of two, sorts the selections by block for the dK/dV kernel, and calls the kernels
(`_kernel.py`) under a custom VJP.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from ejkernel.kernels._common.attention import pad_axes
from ejkernel.kernels._common.sparse_attention.native_sparse import gate_branches, native_selection, sliding_branch
from ejkernel.kernels._triton._helpers import resolve_interpret
from ejkernel.kernels._triton.blocksparse_attention import blocksparse_attention_triton
from ejkernel.kernels._triton.native_sparse_attention import _kernel
from ejkernel.ops.config import BwdParams, FwdParams

SUPPORTED_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
MAX_HEAD_DIM = 256
MIN_ROWS = 16  # smallest matmul tile edge
WHO = "triton native_sparse_attention"


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _selected(st, q, k, v, info, idx, slots, tokens, positions):
    return _kernel.forward(st, q, k, v, info, idx)[0]


def _selected_fwd(st, q, k, v, info, idx, slots, tokens, positions):
    out, lse = _kernel.forward(st, q, k, v, info, idx)
    return out, (q, k, v, info, idx, slots, tokens, positions, out, lse)


def _selected_bwd(st, residuals, do):
    q, k, v, info, idx, slots, tokens, positions, out, lse = residuals
    do = do.astype(out.dtype)
    delta = jnp.sum(out.astype(jnp.float32) * do.astype(jnp.float32), axis=-1)
    dq = _kernel.dq(st, q, k, v, do, lse, delta, info, idx)
    dk_slots, dv_slots = _kernel.dk_dv(st, q, k, v, do, lse, delta, slots, tokens, positions)
    # Slot s covers key rows [start_s, start_s + block): add every slot into the padded rows.
    rows = slots[0, 0, :, 0][:, None] + jnp.arange(st.block_size)[None, :]
    add = lambda x, like: (
        jnp.zeros((like.shape[0], like.shape[1], like.shape[2], x.shape[-1]), jnp.float32)
        .at[:, rows]
        .add(jnp.moveaxis(x, 1, 3))
        .astype(like.dtype)
    )
    return dq, add(dk_slots, k), add(dv_slots, v), None, None, None, None, None


_selected.defvjp(_selected_fwd, _selected_bwd)


def _block_slots(pack, indices, cu_seqlens, padded_len: int):
    """The dK/dV kernel's plan: (slots [B, Hkv, n, 4] = key start, block, first entry, count; tokens
    [B, Hkv, E] sorted by the slot they selected). Slot = one block of one sequence."""
    batch, seq_len, kv_heads, n_sel = indices.shape
    bs = pack.block_size
    t = jnp.arange(seq_len, dtype=jnp.int32)
    if cu_seqlens is None:
        n_slots = -(-seq_len // bs)
        first_slot = jnp.zeros((batch, seq_len), jnp.int32)
        slot = jnp.arange(n_slots, dtype=jnp.int32)
        key_start, block = slot * bs, slot
    else:
        cu = jnp.asarray(cu_seqlens, jnp.int32)
        per_seq = -(-(cu[1:] - cu[:-1]) // bs)
        firsts = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(per_seq)])
        n_slots = -(-seq_len // bs) + cu.shape[0] - 1  # a static bound of sum(ceil(L / bs))
        first_slot = firsts[jnp.searchsorted(cu[1:], t, side="right")][None]
        slot = jnp.arange(n_slots, dtype=jnp.int32)
        seq = jnp.minimum(jnp.searchsorted(firsts[1:], slot, side="right"), cu.shape[0] - 2)
        block = slot - firsts[seq]
        key_start = cu[seq] + block * bs
    key_start = jnp.clip(key_start, 0, padded_len - bs)
    entry_slot = jnp.where(indices >= 0, first_slot[:, :, None, None] + indices, n_slots)
    entry_slot = jnp.moveaxis(entry_slot, 2, 1).reshape(batch, kv_heads, seq_len * n_sel)
    tokens = (jnp.argsort(entry_slot, axis=-1, stable=True) // n_sel).astype(jnp.int32)
    counts = jax.vmap(jax.vmap(lambda s: jnp.zeros(n_slots + 1, jnp.int32).at[s].add(1)))(entry_slot)[..., :n_slots]
    firsts_in_list = jnp.cumsum(counts, axis=-1) - counts
    fixed = jnp.broadcast_to(jnp.stack([key_start, block], -1), (batch, kv_heads, n_slots, 2))
    return jnp.concatenate([fixed, firsts_in_list[..., None], counts[..., None]], -1).astype(jnp.int32), tokens


def native_sparse_attention_triton(
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
    interpret: bool | None = None,
):
    """Native sparse attention `[B, S, H, D] -> [B, S, H, Dv]`, the selected branch on Triton kernels (the
    sliding branch on the block-sparse Triton kernels).

    Takes the public options of `ejkernel.modules.native_sparse_attention`; `block_size` must be a
    power of two >= 16 here. Warps and stages from `fwd_params` (forward) and
    `bwd_params` (dQ and dK/dV). Any head ratio (the query heads of a key/value head are padded to 16
    rows). `interpret=None` compiles for the GPU (off a GPU: an error; `interpret=True` interprets).
    """
    for name, x in (("query", query), ("key", key), ("value", value)):
        if jnp.dtype(getattr(x, "dtype", None)) not in SUPPORTED_DTYPES:
            raise NotImplementedError(f"{WHO} takes float32/bfloat16/float16, got {name} {x.dtype}")
    if not query.dtype == key.dtype == value.dtype:
        raise NotImplementedError(f"{WHO} needs one dtype for query/key/value")
    if max(query.shape[-1], value.shape[-1]) > MAX_HEAD_DIM:
        raise NotImplementedError(f"{WHO} supports head dims up to {MAX_HEAD_DIM}")
    if not isinstance(block_size, int) or block_size < MIN_ROWS or block_size & (block_size - 1):
        raise NotImplementedError(f"{WHO} needs a power-of-two block_size >= {MIN_ROWS}, got {block_size!r}")
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
    batch, seq_len, heads, dim = query.shape
    kv_heads, value_dim = key.shape[2], value.shape[3]
    group = heads // kv_heads
    warps = lambda p, default: p.num_warps if p is not None and p.num_warps else default
    stages = lambda p, default: p.num_stages if p is not None and p.num_stages else default
    st = _kernel.TritonNativeSparseStatic(
        softmax_scale=sel.softmax_scale,
        block_size=block_size,
        fwd_warps=warps(fwd_params, 4),
        fwd_stages=stages(fwd_params, 2),
        bwd_warps=warps(bwd_params, 4),
        bwd_stages=stages(bwd_params, 2),
        interpret=resolve_interpret(interpret, WHO),
    )

    # Valid entries first, in their order; `count` of them.
    idx = sel.indices
    idx = jnp.take_along_axis(idx, jnp.argsort(idx < 0, axis=-1, stable=True), axis=-1)
    count = jnp.sum(idx >= 0, axis=-1, dtype=jnp.int32)
    start = jnp.broadcast_to(sel.pack.start[..., None], count.shape)
    position = jnp.broadcast_to(sel.pack.position[..., None], count.shape)
    info = jnp.stack([start, position, count, jnp.zeros_like(count)], axis=-1)
    idx = pad_axes(idx, {3: pl.next_power_of_2(idx.shape[-1]) - idx.shape[-1]})

    rows = max(MIN_ROWS, pl.next_power_of_2(group))
    d_pad = max(MIN_ROWS, pl.next_power_of_2(dim)) - dim
    dv_pad = max(MIN_ROWS, pl.next_power_of_2(value_dim)) - value_dim
    q = pad_axes(query.reshape(batch, seq_len, kv_heads, group, dim), {3: rows - group, 4: d_pad})
    k = pad_axes(key, {1: block_size, 3: d_pad})  # a listed block may reach past the last row
    v = pad_axes(value, {1: block_size, 3: dv_pad})
    slots, tokens = _block_slots(sel.pack, sel.indices, cu_seqlens, seq_len + block_size)
    out = _selected(st, q, k, v, info, idx, slots, tokens, sel.pack.position.astype(jnp.int32))
    selected = out[:, :, :, :group, :value_dim].reshape(batch, seq_len, heads, value_dim)
    sliding = None
    if g_swa is not None:
        attend = functools.partial(blocksparse_attention_triton, interpret=st.interpret)
        sliding = sliding_branch(attend, query, key, value, cu_seqlens, sel.pack, window_size, sel.softmax_scale)
    return gate_branches(selected, g_slc, sel.compressed, g_cmp, query.dtype, sliding, g_swa)
