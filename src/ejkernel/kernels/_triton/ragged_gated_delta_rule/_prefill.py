"""The chunked delta rule of packed requests (prefill and mixed batches) in Pallas-Triton kernels, forward only.

The requests are laid out as `ChunkLayout.packed` lays packed sequences out (each starting on a chunk boundary,
zeros between them), one batch row of `NC·C` tokens. From there it is the Triton gated delta rule's chunked
form (`linear_attention._delta`): the WY transform of every chunk in XLA, the cumulative gates and the outputs
in the GLA kernels of a gate per head (`cumulative_gates`, `chunk_outputs` making each chunk's scores itself),
and one sequential pass of its own, `_states_kernel`, which walks the chunks of one request per program
(grid: request x head x value tile, as the dense form's batch rows), entering from the request's slot of the
pool and leaving its final state. Matmul operands are in the inputs' dtype (float32 in full precision for
float32 inputs), as in `gated_delta_rule`'s Triton path.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from ejkernel.kernels._common.linear_attention.layout import ChunkLayout
from ejkernel.kernels._common.linear_attention.numerics import wy_transform
from ejkernel.kernels._common.vma import out_struct
from ejkernel.kernels._triton._helpers import dot
from ejkernel.kernels._triton.linear_attention._gla_common import F32, TritonGlaTiling, call_pallas, tile_slice
from ejkernel.kernels._triton.linear_attention._gla_forward import chunk_outputs, cumulative_gates


def _states_kernel(
    first_ref, count_ref, slot_ref, k_ref, w_ref, u_ref, g_ref, pool_ref, e_ref, values_ref, final_ref, **s
):
    """Request `n`'s chunks in order from its slot's state `h`: store h (the chunk's entry state); `U = u − w h`
    (stored); `h ← e^{g_C} h + (k ⊙ e^{g_C − g})ᵀ U`. Its final state is h after its last chunk (the slot's
    state for an empty request)."""
    chunk, mm, bv = s["chunk"], s["mm"], s["block_v"]
    n, head, tile = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    cols = tile_slice(tile, bv)
    first = first_ref[n]
    one = pl.ds(0, 1)

    def step(i, h):
        c = first + i
        e_ref[0, c, head, :, cols] = h.astype(e_ref.dtype)
        start = pl.multiple_of(c * chunk, chunk)
        rows = pl.ds(start, chunk)
        g, g_last = g_ref[0, rows, head, one], g_ref[0, start + chunk - 1, head, one]
        values = u_ref[0, rows, head, cols].astype(F32) - dot(w_ref[0, rows, head, :].astype(mm), h.astype(mm))
        values_ref[0, rows, head, cols] = values.astype(values_ref.dtype)
        k = (k_ref[0, rows, head, :].astype(F32) * jnp.exp(g_last[None, :] - g)).astype(mm)
        return jnp.exp(g_last) * h + dot(k, values.astype(mm), trans_a=True)

    init = pool_ref[slot_ref[n], head, :, cols].astype(F32)
    final_ref[n, head, :, cols] = lax.fori_loop(0, count_ref[n], step, init)


def _states(t: TritonGlaTiling, block_v: int, warps: int, chunk: int, first, count, slots, k, w, u, g, pool):
    """`(entry states [1, NC, H, Dk, Dv], values U [1, NC·C, H, Dv] (u's dtype), final states [N, H, Dk, Dv]
    float32)`; chunks of no request are left unwritten (their outputs are never read)."""
    _, seq, heads, dk = k.shape
    dv = u.shape[-1]
    bv = min(block_v, dv)
    args = (first, count, slots, k, w, u, g, pool)
    return call_pallas(
        _states_kernel,
        t,
        warps,
        (first.shape[0], heads, dv // bv),
        None,
        None,
        [
            out_struct((1, seq // chunk, heads, dk, dv), t.state_dtype(k.dtype), *args),
            out_struct(u.shape, u.dtype, *args),
            out_struct((first.shape[0], heads, dk, dv), F32, *args),
        ],
        "ejkernel_ragged_delta_states",
        chunk=chunk,
        mm=t.mm(k.dtype),
        block_v=bv,
    )(*args)


def packed_delta(t: TritonGlaTiling, block_v: int, warps: int, chunk: int, q, k, v, beta, decay, pool, slots, cu):
    """`(out [T, H, Dv] in v's dtype, final states [N, H, Dk, Dv] float32)` of the requests `cu [N+1]` (exact
    bounds covering the T tokens) entering from `pool[slots]` (slots in range).

    q (scaled), k `[T, H, Dk]` and v `[T, H, Dv]` in the matmuls' dtype; beta and the log decays `[T, H]`
    float32; zero tokens where no live request is."""
    num_tokens = q.shape[0]
    layout = ChunkLayout.packed(cu, num_tokens, chunk)
    q, k, v, beta, decay = (layout.pad(x[None]) for x in (q, k, v, beta, decay))
    chunks = ChunkLayout.dense(1, q.shape[1], chunk)  # the padded row, cut at its chunk boundaries
    gates = jnp.cumsum(chunks.to_chunks(decay), axis=-1)
    u, w = (chunks.from_chunks(x) for x in wy_transform(*(chunks.to_chunks(x) for x in (k, v, beta)), gates))
    lengths = cu[1:] - cu[:-1]
    count = (lengths + chunk - 1) // chunk
    first = jnp.cumsum(count) - count
    g = cumulative_gates(t, chunk, decay[..., None])
    e, values, final = _states(
        t, block_v, warps, chunk, first, count, slots, k, w.astype(k.dtype), u.astype(v.dtype), g, pool
    )
    out = chunk_outputs(t, chunk, 1.0, q, values, g, e, k=k)
    return layout.unpad(out)[0], final
