"""Chunked linear attention with a scalar decay per head, forward only, as two Pallas-Triton kernels.

The recurrence `h_t = exp(g_t) h_{t-1} + k_t v_tᵀ`, `o_t = q_tᵀ h_t` (state `[K, V]` per head) in its
chunked form. With `G` the cumulative log decay inside a chunk of `L` tokens:

1. `chunk_states` (one program per chunk, batch row, head): the state a chunk builds from zero,
   `Σ_l exp(G_last - G_l) k_l v_lᵀ`, as `[K, L] @ [L, V]` matmuls over row blocks;
2. XLA passes the states from chunk to chunk (`chunk_entries`, `S / L` steps of `[b, H, K, V]`);
3. `chunk_outputs` (one program per row block of a chunk): `exp(G_l) q_l h_in` plus the masked
   intra-chunk products `Σ_{s <= l} exp(G_l - G_s) (q_l · k_s) v_s` over the blocks up to the diagonal.

Every exponential is of a non-positive number when the gates are (the mask is applied first). Heads:
q and k may have fewer heads than the output and v may have fewer too (a divisor of H each); output
head h reads head `h // (H // heads)` of each.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from ejkernel.kernels._common.state_space import chunk_entries
from ejkernel.kernels._triton._helpers import dot
from ejkernel.kernels._triton.state_space_v1._fwd import call


@dataclasses.dataclass(frozen=True)
class Tiling:
    chunk: int
    block: int  # rows per matmul tile inside a chunk
    num_warps: int
    num_stages: int


def _chunk_states_kernel(k_ref, v_ref, g_ref, out_ref, *, chunk: int, block: int):
    last = g_ref[chunk - 1]

    def body(j, acc):
        rows = pl.ds(pl.multiple_of(j * block, block), block)
        k = k_ref[rows, :]
        weighted = (k.astype(jnp.float32) * jnp.exp(last - g_ref[rows])[:, None]).astype(k.dtype)
        return acc + dot(weighted, v_ref[rows, :], trans_a=True)

    out_ref[...] = lax.fori_loop(0, chunk // block, body, jnp.zeros(out_ref.shape, jnp.float32))


def _chunk_outputs_kernel(q_ref, k_ref, v_ref, g_ref, h_ref, o_ref, *, chunk: int, block: int):
    i = lax.rem(pl.program_id(0), jnp.int32(chunk // block))  # row block inside the chunk
    rows = pl.ds(pl.multiple_of(i * block, block), block)
    q = q_ref[rows, :]
    g_q = g_ref[rows]
    acc = dot(q, h_ref[...].astype(q.dtype)) * jnp.exp(g_q)[:, None]
    row_ids = i * block + lax.broadcasted_iota(jnp.int32, (block, block), 0)
    col_iota = lax.broadcasted_iota(jnp.int32, (block, block), 1)

    def body(j, acc):
        cols = pl.ds(pl.multiple_of(j * block, block), block)
        allowed = row_ids >= j * block + col_iota
        decay = jnp.exp(jnp.where(allowed, g_q[:, None] - g_ref[cols][None, :], -jnp.inf))
        scores = dot(q, k_ref[cols, :], trans_b=True) * decay
        return acc + dot(scores.astype(v_ref.dtype), v_ref[cols, :])

    o_ref[...] = lax.fori_loop(0, i + 1, body, acc)


def _forward(q, k, v, g_cum, h0, heads: int, t: Tiling, interpret: bool):
    """On padded inputs (S a multiple of the chunk, K and V powers of two >= 16)."""
    batch, seq, _, key_dim = q.shape
    value_dim = v.shape[-1]
    chunks, row_blocks = seq // t.chunk, t.chunk // t.block

    def per_head(a, rows, by_row_block=False):
        ratio = heads // a.shape[2]
        if by_row_block:
            return pl.BlockSpec(
                (None, rows, None, a.shape[3]), lambda i, b, h: (b, lax.div(i, row_blocks), h // ratio, 0)
            )
        return pl.BlockSpec((None, rows, None, a.shape[3]), lambda c, b, h: (b, c, h // ratio, 0))

    gates = pl.BlockSpec((None, None, t.chunk), lambda c, b, h: (b, h, c))
    state = pl.BlockSpec((None, None, None, key_dim, value_dim), lambda c, b, h: (c, b, h, 0, 0))
    local = call(
        _chunk_states_kernel,
        t,
        (chunks, batch, heads),
        [per_head(k, t.chunk), per_head(v, t.chunk), gates],
        state,
        jax.ShapeDtypeStruct((chunks, batch, heads, key_dim, value_dim), jnp.float32),
        interpret,
        "ejkernel_ssd_chunk_states",
        chunk=t.chunk,
        block=t.block,
    )(k, v, g_cum)
    decays = jnp.exp(jnp.moveaxis(g_cum[:, :, t.chunk - 1 :: t.chunk], 2, 0))[..., None, None]
    entries, h_last = chunk_entries(local, decays, h0)
    by_rows = lambda i, b, h: (lax.div(i, row_blocks), b, h, 0, 0)
    out = call(
        _chunk_outputs_kernel,
        t,
        (seq // t.block, batch, heads),
        [
            per_head(q, t.chunk, True),
            per_head(k, t.chunk, True),
            per_head(v, t.chunk, True),
            pl.BlockSpec((None, None, t.chunk), lambda i, b, h: (b, h, lax.div(i, row_blocks))),
            pl.BlockSpec((None, None, None, key_dim, value_dim), by_rows),
        ],
        pl.BlockSpec((None, t.block, None, value_dim), lambda i, b, h: (b, i, h, 0)),
        jax.ShapeDtypeStruct((batch, seq, heads, value_dim), jnp.float32),
        interpret,
        "ejkernel_ssd_chunk_outputs",
        chunk=t.chunk,
        block=t.block,
    )(q, k, v, g_cum, entries)
    return out, h_last


def chunked_forward(q, k, v, g, h0, *, heads: int, tiling: Tiling, interpret: bool):
    """`(o [b, S, H, V], final state [b, H, K, V])`, both float32.

    `q, k [b, S, Hq|Hk, K]`, `v [b, S, Hv, V]` (any float dtype, multiplied as given), `g [b, S, H]` the
    log decays, `h0 [b, H, K, V]` (float32) the initial state.
    """
    batch, seq = q.shape[:2]
    key_dim, value_dim = q.shape[-1], v.shape[-1]
    pad_seq = -seq % tiling.chunk
    padded_k, padded_v = max(16, pl.next_power_of_2(key_dim)), max(16, pl.next_power_of_2(value_dim))

    def pad(a, dim):
        return jnp.pad(a, [(0, 0), (0, pad_seq)] + [(0, 0)] * (a.ndim - 3) + [(0, dim - a.shape[-1])])

    q, k, v = pad(q, padded_k), pad(k, padded_k), pad(v, padded_v)
    g = jnp.pad(g.astype(jnp.float32), [(0, 0), (0, pad_seq), (0, 0)])
    g_cum = jnp.cumsum(g.reshape(batch, -1, tiling.chunk, heads), axis=2).reshape(batch, -1, heads)
    h0 = jnp.pad(h0, [(0, 0), (0, 0), (0, padded_k - key_dim), (0, padded_v - value_dim)])
    out, h_last = _forward(q, k, v, jnp.swapaxes(g_cum, 1, 2), h0, heads, tiling, interpret)
    return out[:, :seq, :, :value_dim], h_last[:, :, :key_dim, :value_dim]
