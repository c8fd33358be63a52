"""The chunked gated linear recurrence (GLA, lightning, recurrent) in Pallas-Triton kernels.

Inputs stay in their token layout `[B, T, H, D]` and dtype (T: the sequence cut into chunks of C tokens,
`ChunkLayout.pad`); kernels index chunks through BlockSpecs or `pl.ds`. Matmul operands are in the
inputs' dtype (bfloat16 / float16 on tensor cores; float32 in full precision), accumulated in float32.
`g` is the cumulative log gate within each chunk (float32, `[B, T, H, Dk]`, or `[B, T, H, 1]` for a gate
per head: every formula below broadcasts it over the key channels). Heads: the gate's H state heads run
one state each; q, k and v may each have fewer heads (a divisor of H), read by groups of consecutive state
heads (`group_of`: grouped-query attention shares k and v, Mamba-2's SSD shares q and k), and their
gradients are summed over each group.

Recurrence per chunk entered with state `h` (`[Dk, Dv]`), unscaled (outputs are `scale ·` it):
`o = (q ⊙ e^{g}) h + A v`, exit state `e^{g_C} ⊙ h + (k ⊙ e^{g_C − g})ᵀ v`,
`A[t,s] = Σ_d q_td k_sd e^{g_td − g_sd}` for `s <= t`. `A` is built by row blocks of `SUB` tokens: keys
of earlier blocks through the gate `r` at the block's first row, `(q_t e^{g_t − r})·(k_s e^{r − g_s})`
(one matmul), keys of its own block one at a time, exactly; every exponent is <= 0 for decaying gates.
The backward's intra-chunk products take the same three routes (earlier keys, later queries, own block).
A gate per head (lightning, Mamba-2) has kernels of its own for both (`head_scores`, `head_grads`):
its decays form one `[C, C]` matrix, and every in-chunk product is a matmul over whole chunks.

Launches. Forward: `cumulative_gates` (the gates' cumulative sums), `chunk_states` (sequential over chunks: every
chunk's entry state, and each sequence's final state), `chunk_scores` (`A`, per row block), `chunk_outputs` (with a
gate per head and `TritonGlaTiling.fuse_head_scores`, a call that is not differentiated runs `chunk_outputs` alone,
its kernel making the scores; `head_gate_forward` is that forward for Mamba-2, with dt and the D skip
taken in the kernels).
Backward: `state_grads` (sequential, in reverse: the gradient of every chunk's exit state, and of the
initial states), `chunk_grads` (per chunk: dq, dk, dv, and the gate's gradient, summed back from the
cumulative gate's `q ⊙ dq − k ⊙ dk` and the exit state's share). Residuals: the cumulative gates, the
entry states (bfloat16 for bfloat16 inputs) and `A`.

Here: the differentiable whole. The kernels are in `_gla_forward` and `_gla_backward`, the tiling and
what both share in `_gla_common`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ejkernel.kernels._triton.linear_attention._gla_backward import chunk_grads, state_grads
from ejkernel.kernels._triton.linear_attention._gla_common import TritonGlaTiling, tiles_sum
from ejkernel.kernels._triton.linear_attention._gla_forward import (
    chunk_outputs,
    chunk_scores,
    chunk_states,
    cumulative_gates,
)

# ---- the differentiable whole ----


def group_sum(x, shared_heads: int, dtype):
    """Per-state-head gradients `[B, T, H, D]` of an input with `shared_heads` heads (each read by a group of
    consecutive state heads), summed over each group."""
    batch, seq, heads, dim = x.shape
    if heads == shared_heads:
        return x.astype(dtype)
    return jnp.sum(x.reshape(batch, seq, shared_heads, heads // shared_heads, dim), axis=3).astype(dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def gla_chunked(tiling: TritonGlaTiling, scale: float, packed: bool, q, k, v, a, init, starts, ends, owners, empty):
    """`(out [B, T, H, Dv] in v's dtype, final states [N, H, Dk, Dv] float32)` of the chunked gated recurrence.

    a `[B, T, H, Dk]` float32 log gates (or `[B, T, H, 1]`: one per head) of the H state heads; q, k
    `[B, T, Hq | Hk, Dk]`, v `[B, T, Hv, Dv]` with heads that divide H, each read by groups of consecutive
    state heads (T a multiple of the chunk): grouped-query attention shares k and v (Hq = H), Mamba-2
    shares q and k (= C and B, one per group; Hv = H); init `[N, H, Dk, Dv]`;
    starts / ends / owners `[NC, B]` int32 (`ChunkLayout`), empty `[N]` (sequences without tokens keep
    their initial state); `packed`: sequences packed in a row (else row b is sequence b, N = B).
    Differentiable w.r.t. q, k, v, a and init.
    """
    return _forward(tiling, scale, packed, q, k, v, a, init, starts, ends, owners, empty, residuals=False)[0]


def head_gate_forward(tiling: TritonGlaTiling, chunk: int, q, k, v, a, init, v_scale, skip):
    """A plain (not differentiated) forward with a gate per head, one sequence per batch row of a length that
    is a multiple of `chunk`, scale 1, in three kernels: the outputs `[B, S, H, Dv]` (v's dtype) of the values
    `v_scale ⊙ v` plus `skip ⊙ v`, and the final states `[B, H, Dk, Dv]` float32. `a [B, S, H, 1]` the log
    gates, `v_scale [B, S, H, 1]` and `skip [H]` float32 (Mamba-2: dt and D, so that neither dt ⊙ x nor the
    skip takes a pass over memory of its own)."""
    t = tiling.fit(q.shape[-1], v.shape[-1])
    batch, seq = a.shape[:2]
    starts = jnp.full((seq // chunk, batch), -1, jnp.int32).at[0].set(jnp.arange(batch, dtype=jnp.int32))
    g = cumulative_gates(t, chunk, a)
    e, final = chunk_states(t, False, k, v, g, init, starts, starts, starts, v_scale)  # (unpacked: no ends, owners)
    return chunk_outputs(t, chunk, 1.0, q, v, g, e, k=k, v_scale=v_scale, skip=skip), final


def _fitted(tiling: TritonGlaTiling, q, v, starts):
    return tiling.fit(q.shape[-1], v.shape[-1]), q.shape[1] // starts.shape[0]


def _forward(tiling, scale, packed, q, k, v, a, init, starts, ends, owners, empty, residuals=True):
    """`(outputs, (g, e, A))`; without `residuals` (no backward to come) `A` may stay unwritten (None)."""
    t, chunk = _fitted(tiling, q, v, starts)
    g = cumulative_gates(t, chunk, a)
    e, final = chunk_states(t, packed, k, v, g, init, starts, ends, owners)
    if t.fuse_head_scores and g.shape[-1] == 1 and not residuals:
        scores, out = None, chunk_outputs(t, chunk, scale, q, v, g, e, k=k)
    else:
        scores = chunk_scores(t, chunk, q, k, g)
        out = chunk_outputs(t, chunk, scale, q, v, g, e, a=scores)
    return (out, jnp.where(empty[:, None, None, None], init, final)), (g, e, scores)


def _fwd(tiling, scale, packed, q, k, v, a, init, starts, ends, owners, empty):
    outputs, kept = _forward(tiling, scale, packed, q, k, v, a, init, starts, ends, owners, empty)
    return outputs, (q, k, v, starts, ends, owners, empty, *kept)


def _bwd(tiling, scale, packed, residuals, cotangents):
    q, k, v, starts, ends, owners, empty, g, e, scores = residuals
    d_out, d_final = cotangents
    t, chunk = _fitted(tiling, q, v, starts)
    dh, d_init, rs = state_grads(t, packed, scale, q, g, d_out, e, d_final, starts, ends, owners)
    dq, dk, dv, da = chunk_grads(t, chunk, scale, q, k, v, g, d_out, scores, e, dh, rs)
    if da.ndim == 5:  # a gate per head: summed over the tiles of key channels
        da = tiles_sum(da)
    d_init = jnp.where(empty[:, None, None, None], d_final, d_init)
    dq, dk = group_sum(dq, q.shape[2], q.dtype), group_sum(dk, k.shape[2], k.dtype)
    dv = group_sum(tiles_sum(dv), v.shape[2], v.dtype)
    return dq, dk, dv, da, d_init, None, None, None, None


gla_chunked.defvjp(_fwd, _bwd)
