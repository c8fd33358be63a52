"""The GLA forward kernels (`_gla` tells the story): the sequential pass that leaves every chunk's entry
state, the gates' cumulative sums, the intra-chunk scores `A` and the outputs."""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from ejkernel.kernels._common.vma import out_struct
from ejkernel.kernels._triton._helpers import dot
from ejkernel.kernels._triton.linear_attention._gla_common import (
    F32,
    SUB,
    TritonGlaTiling,
    call_pallas,
    chunk_loop,
    everywhere,
    gate_columns,
    group_of,
    group_ratio,
    iota,
    masked_exp,
    own_keys,
    pair_decays,
    separable,
    tile_slice,
)

# ---- sequential passes over chunks (one program per batch row, head and state tile) ----


def _states_kernel(starts_ref, ends_ref, owners_ref, k_ref, v_ref, g_ref, init_ref, *refs, **s):
    """`h ← init[start]` where a sequence starts; store h (the chunk's entry state); `h ← e^{g_C} ⊙ h +
    (k ⊙ e^{g_C − g})ᵀ v`; store h as its sequence's final state where the sequence ends. Unpacked
    (`packed` False), row b is one sequence: init[b] before the first chunk, the final state after the last.
    With `value_scaled`, `refs` starts with `vs [B, T, H, 1]`: the values are `vs ⊙ v` (taken into k's rows)."""
    vs_ref, e_ref, final_ref = refs if s["value_scaled"] else (None, *refs)
    chunk, mm, bk, bv, packed = s["chunk"], s["mm"], s["bk"], s["bv"], s["packed"]
    b, head, kt, vt = (pl.program_id(i) for i in range(4))
    k_head, v_head = group_of(head, s["k_ratio"]), group_of(head, s["v_ratio"])
    keys, cols = tile_slice(kt, bk), tile_slice(vt, bv)
    gates = gate_columns(g_ref, keys)

    def step(c, h):
        if packed:
            start = starts_ref[c, b]
            at = init_ref.at[jnp.maximum(start, 0), head, keys, cols]
            h = jnp.where(start >= 0, plgpu.load(at, mask=everywhere(start >= 0, (bk, bv)), other=0.0), h)
        e_ref[b, c, head, keys, cols] = h.astype(e_ref.dtype)
        first = pl.multiple_of(c * chunk, chunk)
        rows = pl.ds(first, chunk)
        g_last = g_ref[b, first + chunk - 1, head, gates]
        k = k_ref[b, rows, k_head, keys].astype(F32) * jnp.exp(g_last[None, :] - g_ref[b, rows, head, gates])
        if vs_ref is not None:
            k = k * vs_ref[b, rows, head, pl.ds(0, 1)]
        h = jnp.exp(g_last)[:, None] * h + dot(k.astype(mm), v_ref[b, rows, v_head, cols].astype(mm), trans_a=True)
        if packed:
            end = everywhere(ends_ref[c, b] > 0, (bk, bv))
            plgpu.store(final_ref.at[owners_ref[c, b], head, keys, cols], h, mask=end)
        return h

    loop = functools.partial(chunk_loop, e_ref.shape[1], step, unroll=s["unroll"])
    if packed:
        loop(jnp.zeros((bk, bv), F32))
    else:
        final_ref[b, head, keys, cols] = loop(init_ref[b, head, keys, cols])


def chunk_states(t: TritonGlaTiling, packed: bool, k, v, g, init, starts, ends, owners, v_scale=None):
    """`(entry states [B, NC, H, Dk, Dv] (`state_dtype`), final states [N, H, Dk, Dv] float32; unwritten for
    sequences without tokens)`. `v_scale [B, T, H, 1]` float32 (optional): the values are `v_scale ⊙ v`."""
    batch, seq, heads, _ = g.shape
    dk, dv = k.shape[-1], v.shape[-1]
    chunks = starts.shape[0]
    args = (starts, ends, owners, k, v, g, init) + (() if v_scale is None else (v_scale,))
    return call_pallas(
        _states_kernel,
        t,
        t.state_warps,
        (batch, heads, dk // t.state_k, dv // t.state_v),
        None,
        None,
        [
            out_struct((batch, chunks, heads, dk, dv), t.state_dtype(k.dtype), *args),
            out_struct(init.shape, F32, *args),
        ],
        "ejkernel_gla_states",
        chunk=seq // chunks,
        k_ratio=group_ratio(heads, k),
        v_ratio=group_ratio(heads, v),
        packed=packed,
        value_scaled=v_scale is not None,
        bk=t.state_k,
        bv=t.state_v,
        mm=t.mm(k.dtype),
        unroll=t.state_unroll,
    )(*args)


# ---- per-chunk kernels ----


def _cumulative_kernel(a_ref, g_ref):
    g_ref[...] = jnp.cumsum(a_ref[...], axis=0)


def cumulative_gates(t: TritonGlaTiling, chunk: int, a):
    """The cumulative log gates within each chunk, `[B, T, H, Dk or 1]` float32."""
    batch, seq, heads, width = a.shape
    spec = pl.BlockSpec((None, chunk, None, width), lambda c, b, h: (b, c, h, 0))
    return call_pallas(
        _cumulative_kernel,
        t,
        4,
        (seq // chunk, batch, heads),
        [spec],
        spec,
        out_struct(a.shape, F32, a),
        "ejkernel_gla_cumulative",
    )(a)


def _scores_kernel(q_ref, k_ref, g_ref, a_ref, *, chunk: int, mm):
    """Row block `i` of a chunk's `A` (`[SUB, C]`, zeros right of the diagonal): the keys before it (and,
    where its gates are `separable`, its own) by one matmul, through the gate r at its first row."""
    first = pl.multiple_of(lax.rem(pl.program_id(0), jnp.int32(chunk // SUB)) * SUB, SUB)
    q = q_ref[...].astype(F32)
    g = g_ref[pl.ds(first, SUB), :]
    r = g_ref[first, :][None, :]
    col = iota((1, chunk), 1)

    def through_r(own: bool):  # the products with the keys before the block (own: and the block's own)
        taken = iota((chunk, 1), 0) < first + (SUB if own else 0)
        keys = k_ref[...].astype(F32) * masked_exp(r - g_ref[...], taken)
        scores = dot((q * jnp.exp(g - r)).astype(mm), keys.astype(mm), trans_b=True)
        return jnp.where(col <= first + iota((SUB, 1), 0), scores, 0.0) if own else scores

    def diagonal(j, decay, scores):  # key `first + j`, one of the block's own rows
        weights = jnp.sum(q * k_ref[first + j, :].astype(F32)[None, :] * decay, axis=1, keepdims=True)
        return jnp.where(col == first + j, weights, scores)

    exact = lambda: own_keys(g_ref, first, diagonal, through_r(False))
    scores = lax.cond(separable(g), lambda: through_r(True), exact)
    a_ref[...] = scores.astype(a_ref.dtype)


def chunk_scores(t: TritonGlaTiling, chunk: int, q, k, g):
    """`A` `[B, T, H, C]` (row t of a chunk: its weights on the chunk's keys), in q's dtype (float32 if precise)."""
    if g.shape[-1] == 1:
        return head_scores(t, chunk, q, k, g)
    batch, seq, heads, _ = g.shape
    dk = q.shape[-1]
    q_ratio, k_ratio = group_ratio(heads, q), group_ratio(heads, k)
    per_chunk = lambda i: lax.div(i, jnp.int32(chunk // SUB))
    block = lambda width: (None, chunk, None, width)
    return call_pallas(
        _scores_kernel,
        t,
        t.scores_warps,
        (seq // SUB, batch, heads),
        [
            pl.BlockSpec((None, SUB, None, dk), lambda i, b, h: (b, i, group_of(h, q_ratio), 0)),
            pl.BlockSpec(block(dk), lambda i, b, h: (b, per_chunk(i), group_of(h, k_ratio), 0)),
            pl.BlockSpec(block(g.shape[-1]), lambda i, b, h: (b, per_chunk(i), h, 0)),
        ],
        pl.BlockSpec((None, SUB, None, chunk), lambda i, b, h: (b, i, h, 0)),
        out_struct((batch, seq, heads, chunk), t.mm(q.dtype), q, k, g),
        "ejkernel_gla_scores",
        chunk=chunk,
        mm=t.mm(q.dtype),
    )(q, k, g)


def _outputs_kernel(q_ref, g_ref, a_ref, v_ref, e_ref, o_ref, *, scale: float, mm):
    q = (q_ref[...].astype(F32) * jnp.exp(g_ref[...])).astype(mm)
    out = dot(q, e_ref[...].astype(mm)) + dot(a_ref[...].astype(mm), v_ref[...].astype(mm))
    o_ref[...] = (scale * out).astype(o_ref.dtype)


def _head_outputs_kernel(q_ref, g_ref, k_ref, g_row_ref, *refs, scale: float, mm, value_scaled: bool):
    """`_outputs_kernel` with the chunk's scores made here (a gate per head): `(q kᵀ ⊙ D) v` beside `(q ⊙ e^g) e`.
    With `value_scaled`, `refs` starts with `vs_row [C]` and `skip [C]` (the head's skip weight on every row):
    the values are `vs ⊙ v` (taken into the scores' columns) and `skip ⊙ v` is added to the outputs."""
    vs_row_ref, skip_ref, v_ref, e_ref, o_ref = refs if value_scaled else (None, None, *refs)
    g = g_ref[...]
    scores = dot(q_ref[...].astype(mm), k_ref[...].astype(mm), trans_b=True) * pair_decays(g, g_row_ref[...][None, :])
    if value_scaled:
        scores = scores * vs_row_ref[...][None, :]
    q = (q_ref[...].astype(F32) * jnp.exp(g)).astype(mm)
    out = scale * (dot(q, e_ref[...].astype(mm)) + dot(scores.astype(mm), v_ref[...].astype(mm)))
    if value_scaled:
        out = out + skip_ref[...][:, None] * v_ref[...].astype(F32)
    o_ref[...] = out.astype(o_ref.dtype)


def chunk_outputs(t: TritonGlaTiling, chunk: int, scale, q, v, g, e, *, a=None, k=None, v_scale=None, skip=None):
    """The outputs from the scores `a`; with `k` instead (a gate per head, `TritonGlaTiling.fuse_head_scores`)
    the kernel makes each chunk's scores itself, and `A` is never in memory. With `k`, `v_scale [B, T, H, 1]`
    and `skip [H]` (float32, both or neither; Mamba-2's dt and D) make the outputs those of the values
    `v_scale ⊙ v`, plus `skip ⊙ v`."""
    batch, seq, heads, _ = g.shape
    dk, dv = q.shape[-1], v.shape[-1]
    q_ratio, v_ratio = group_ratio(heads, q), group_ratio(heads, v)
    block = lambda width: (None, chunk, None, width)
    static = {}
    if a is not None:
        kernel, name, scores = _outputs_kernel, "ejkernel_gla_outputs", [a]
        scores_specs = [pl.BlockSpec(block(chunk), lambda c, b, h, j: (b, c, h, 0))]
    else:
        kernel, name, scores = _head_outputs_kernel, "ejkernel_gla_head_outputs", [k, jnp.swapaxes(g[..., 0], 1, 2)]
        k_ratio = group_ratio(heads, k)
        row = pl.BlockSpec((None, None, chunk), lambda c, b, h, j: (b, h, c))
        scores_specs = [pl.BlockSpec(block(dk), lambda c, b, h, j: (b, c, group_of(h, k_ratio), 0)), row]
        static["value_scaled"] = v_scale is not None
        if v_scale is not None:
            scores += [jnp.swapaxes(v_scale[..., 0], 1, 2), jnp.broadcast_to(skip[None, :, None], (1, heads, chunk))]
            scores_specs += [row, pl.BlockSpec((None, None, chunk), lambda c, b, h, j: (0, h, 0))]
    return call_pallas(
        kernel,
        t,
        t.output_warps,
        (seq // chunk, batch, heads, dv // t.block_v),
        [
            pl.BlockSpec(block(dk), lambda c, b, h, j: (b, c, group_of(h, q_ratio), 0)),
            pl.BlockSpec(block(g.shape[-1]), lambda c, b, h, j: (b, c, h, 0)),
            *scores_specs,
            pl.BlockSpec(block(t.block_v), lambda c, b, h, j: (b, c, group_of(h, v_ratio), j)),
            pl.BlockSpec((None, None, None, dk, t.block_v), lambda c, b, h, j: (b, c, h, 0, j)),
        ],
        pl.BlockSpec(block(t.block_v), lambda c, b, h, j: (b, c, h, j)),
        out_struct((batch, seq, heads, dv), v.dtype, q, v, g, e, *scores),
        name,
        scale=scale,
        mm=t.mm(q.dtype),
        **static,
    )(q, g, *scores, v, e)


# ---- the in-chunk kernels of a gate per head ----
#
# With one gate per head, `A = (q kᵀ) ⊙ D` with `D[t, s] = e^{g_t − g_s}` (s <= t): the decays form a
# `[C, C]` matrix of their own, every exponent <= 0 for decaying gates, and each product is one matmul
# over whole row blocks. The gates enter twice, as a column (`g`, `[C, 1]`) and as a row (`g_rows`: the
# cumulative gates transposed, `[B, H, T]`).


def _head_scores_kernel(q_ref, k_ref, g_ref, g_row_ref, a_ref, *, chunk: int, mm):
    """Rows `[R, C]` of a chunk's `A` (zeros right of the diagonal)."""
    rows = a_ref.shape[0]
    first = lax.rem(pl.program_id(0), jnp.int32(chunk // rows)) * rows
    scores = dot(q_ref[...].astype(mm), k_ref[...].astype(mm), trans_b=True)
    a_ref[...] = (scores * pair_decays(g_ref[...], g_row_ref[...][None, :], first)).astype(a_ref.dtype)


def head_scores(t: TritonGlaTiling, chunk: int, q, k, g):
    """`chunk_scores` for a gate per head: programs of `min(C, 64)` rows."""
    batch, seq, heads, _ = g.shape
    dk, rows = q.shape[-1], min(chunk, 64)
    q_ratio, k_ratio = group_ratio(heads, q), group_ratio(heads, k)
    per_chunk = lambda i: lax.div(i, jnp.int32(chunk // rows))
    g_rows = jnp.swapaxes(g[..., 0], 1, 2)
    return call_pallas(
        _head_scores_kernel,
        t,
        t.head_scores_warps,
        (seq // rows, batch, heads),
        [
            pl.BlockSpec((None, rows, None, dk), lambda i, b, h: (b, i, group_of(h, q_ratio), 0)),
            pl.BlockSpec((None, chunk, None, dk), lambda i, b, h: (b, per_chunk(i), group_of(h, k_ratio), 0)),
            pl.BlockSpec((None, rows, None, 1), lambda i, b, h: (b, i, h, 0)),
            pl.BlockSpec((None, None, chunk), lambda i, b, h: (b, h, per_chunk(i))),
        ],
        pl.BlockSpec((None, rows, None, chunk), lambda i, b, h: (b, i, h, 0)),
        out_struct((batch, seq, heads, chunk), t.mm(q.dtype), q, k, g),
        "ejkernel_gla_scores",
        chunk=chunk,
        mm=t.mm(q.dtype),
    )(q, k, g, g_rows)
