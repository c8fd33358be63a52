"""The GLA backward kernels (`_gla` tells the story): the reverse sequential pass that leaves every
chunk's exit-state gradient, and the per-chunk gradients of q, k, v and the gates."""

from __future__ import annotations

import functools
import math

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
    tiles_sum,
)

# ---- the reverse sequential pass (one program per batch row, head and state tile) ----


def _state_grads_kernel(
    starts_ref, ends_ref, owners_ref, q_ref, g_ref, do_ref, e_ref, d_final_ref, dh_ref, d_init_ref, rs_ref, **s
):
    """In reverse: `d ← d_final[seq]` where a sequence ends (else the next chunk's entry gradient); store d
    (the chunk's exit-state gradient) and `Σ_v h_in ⊙ d`; `d ← e^{g_C} ⊙ d + scale (q ⊙ e^{g})ᵀ do`; store d
    as the initial state's gradient where the sequence starts (unpacked: d_final[b] first, d_init[b] last)."""
    chunk, mm, bk, bv, packed = s["chunk"], s["mm"], s["bk"], s["bv"], s["packed"]
    b, head, kt, vt = (pl.program_id(i) for i in range(4))
    q_head = group_of(head, s["q_ratio"])
    keys, cols = tile_slice(kt, bk), tile_slice(vt, bv)
    gates = gate_columns(g_ref, keys)
    num_chunks = dh_ref.shape[1]

    def step(i, d):
        c = num_chunks - 1 - i
        if packed:
            end = ends_ref[c, b] > 0
            at = d_final_ref.at[owners_ref[c, b], head, keys, cols]
            d = jnp.where(end, plgpu.load(at, mask=everywhere(end, (bk, bv)), other=0.0), d)
        dh_ref[b, c, head, keys, cols] = d.astype(dh_ref.dtype)
        rs_ref[vt, b, c, head, keys] = jnp.sum(e_ref[b, c, head, keys, cols].astype(F32) * d, axis=1)
        first = pl.multiple_of(c * chunk, chunk)
        rows = pl.ds(first, chunk)
        g_last = g_ref[b, first + chunk - 1, head, gates]
        q = (q_ref[b, rows, q_head, keys].astype(F32) * jnp.exp(g_ref[b, rows, head, gates])).astype(mm)
        d = jnp.exp(g_last)[:, None] * d + s["scale"] * dot(q, do_ref[b, rows, head, cols].astype(mm), trans_a=True)
        if packed:
            start = starts_ref[c, b]
            at = d_init_ref.at[jnp.maximum(start, 0), head, keys, cols]
            plgpu.store(at, d, mask=everywhere(start >= 0, (bk, bv)))
        return d

    loop = functools.partial(chunk_loop, num_chunks, step, unroll=s["unroll"])
    if packed:
        loop(jnp.zeros((bk, bv), F32))
    else:
        d_init_ref[b, head, keys, cols] = loop(d_final_ref[b, head, keys, cols])


def state_grads(t: TritonGlaTiling, packed: bool, scale, q, g, do, e, d_final, starts, ends, owners):
    """`(exit-state gradients [B, NC, H, Dk, Dv] (e's dtype), initial-state gradients [N, H, Dk, Dv] float32
    (sequences without a chunk left unwritten), Σ_v h_in ⊙ d_exit [B, NC, H, Dk] float32)`."""
    batch, seq, heads, _ = g.shape
    dk, dv = q.shape[-1], do.shape[-1]
    chunks = starts.shape[0]
    args = (starts, ends, owners, q, g, do, e, d_final)
    dh, d_init, rs = call_pallas(
        _state_grads_kernel,
        t,
        t.state_warps,
        (batch, heads, dk // t.state_k, dv // t.state_v),
        None,
        None,
        [
            out_struct(e.shape, e.dtype, *args),
            out_struct(d_final.shape, F32, *args),
            out_struct((dv // t.state_v, batch, chunks, heads, dk), F32, *args),
        ],
        "ejkernel_gla_state_grads",
        chunk=seq // chunks,
        q_ratio=group_ratio(heads, q),
        scale=scale,
        packed=packed,
        bk=t.state_k,
        bv=t.state_v,
        mm=t.mm(q.dtype),
        unroll=t.state_unroll,
    )(*args)
    return dh, d_init, jnp.sum(rs, axis=0)


# ---- per-chunk gradients ----


def _from_earlier(m: int, k_ref, g_ref, v_ref, do, g, scale, mm):
    """dq of row block m through the keys of the earlier blocks (the gate r at the block's first row)."""
    n = m * SUB
    keys = pl.ds(0, pl.next_power_of_2(n))
    r = g_ref[n, :][None, :]
    weights = k_ref[keys, :].astype(F32) * masked_exp(r - g_ref[keys, :], iota((keys.size, 1), 0) < n)
    d_scores = scale * dot(do, v_ref[keys, :].astype(mm), trans_b=True)  # [SUB, keys]
    return dot(d_scores.astype(mm), weights.astype(mm)) * jnp.exp(g - r)


def _from_later(m: int, q_ref, g_ref, v, do_ref, g, scale, mm, chunk: int):
    """dk of row block m through the queries of the later blocks (the gate r at the block's last row)."""
    n = (m + 1) * SUB
    size = pl.next_power_of_2(chunk - n)
    queries = pl.ds(chunk - size, size)
    r = g_ref[n - 1, :][None, :]
    later = chunk - size + iota((size, 1), 0) >= n
    weights = q_ref[queries, :].astype(F32) * masked_exp(g_ref[queries, :] - r, later)
    d_scores = scale * dot(do_ref[queries, :].astype(mm), v, trans_b=True)  # [queries, SUB]
    return dot(d_scores.astype(mm), weights.astype(mm), trans_a=True) * jnp.exp(r - g)


def _grads_kernel(
    q_ref, k_ref, v_ref, g_ref, do_ref, a_ref, e_ref, dh_ref, rs_ref, dq_ref, dk_ref, dv_ref, da_ref, **s
):
    """One chunk's dq, dk and gate gradient on a tile of key channels, and its share of dv, row block by
    row block from the last.

    `e`: the entry state, `dh`: the exit state's gradient, `rs`: `Σ_v e ⊙ dh`. The exit state
    `X = e^{g_C} ⊙ e + (k ⊙ e^{g_C − g})ᵀ v` gives dk its `dk_exit = (v dhᵀ) ⊙ e^{g_C − g}`, dv its
    `(k ⊙ e^{g_C − g}) dh`, and the gate at the last row `Σ_v X ⊙ dh = e^{g_C} ⊙ rs + Σ_s k_s ⊙ dk_exit_s`.
    The cumulative gate's gradient is `q ⊙ dq − k ⊙ dk` (plus that on the last row); the gate's is its sum
    over the rows at or after each (the block's own by `total − cumsum + own`, the later blocks' carried).
    (A gate per head takes `_head_grads_kernel`.)
    """
    chunk, scale, mm = s["chunk"], s["scale"], s["mm"]
    own_tile = pl.program_id(3) == 0  # the program that adds Aᵀ do to dv
    g_last = g_ref[chunk - 1, :][None, :]
    row, col = iota((SUB, 1), 0), iota((1, SUB), 1)
    num_blocks = chunk // SUB
    dk_exit = []  # kept from the first pass over the blocks (the exit's share of the last gate) to the second
    later = jnp.exp(g_last) * rs_ref[...][None, :]  # Σ over the rows after a block (all blocks: the exit's share)
    for m in range(num_blocks):
        rows = pl.ds(m * SUB, SUB)
        to_exit = jnp.exp(g_last - g_ref[rows, :])
        dk_exit.append(dot(v_ref[rows, :].astype(mm), dh_ref[...].astype(mm), trans_b=True) * to_exit)
        later += jnp.sum(k_ref[rows, :].astype(F32) * dk_exit[m], axis=0, keepdims=True)
    for m in reversed(range(num_blocks)):
        rows = pl.ds(m * SUB, SUB)
        q, k, g = q_ref[rows, :].astype(F32), k_ref[rows, :].astype(F32), g_ref[rows, :]
        do, v = do_ref[rows, :].astype(mm), v_ref[rows, :].astype(mm)
        dq = scale * dot(do, e_ref[...].astype(mm), trans_b=True) * jnp.exp(g)
        dk = dk_exit[m]
        if m > 0:
            dq += _from_earlier(m, k_ref, g_ref, v_ref, do, g, scale, mm)
        if m < num_blocks - 1:
            dk += _from_later(m, q_ref, g_ref, v, do_ref, g, scale, mm, chunk)
        d_scores = scale * dot(do, v, trans_b=True)  # [SUB, SUB]: the block's own keys

        def by_matmul(grads, m=m, q=q, k=k, g=g, d_scores=d_scores):  # gates of a narrow span (`separable`)
            r = g_ref[m * SUB, :][None, :]
            down, up = jnp.exp(g - r), jnp.exp(r - g)
            lower = jnp.where(row >= col, d_scores, 0.0).astype(mm)
            dq = grads[0] + dot(lower, (k * up).astype(mm)) * down
            return dq, grads[1] + dot(lower, (q * down).astype(mm), trans_a=True) * up

        def diagonal(j, decay, grads, m=m, q=q, d_scores=d_scores):
            dq, dk = grads
            w = jnp.sum(jnp.where(col == j, d_scores, 0.0), axis=1, keepdims=True) * decay
            dq += w * k_ref[m * SUB + j, :].astype(F32)[None, :]
            return dq, dk + jnp.where(row == j, jnp.sum(w * q, axis=0, keepdims=True), 0.0)

        exact = lambda grads, m=m, diagonal=diagonal: own_keys(g_ref, m * SUB, diagonal, grads)
        dq, dk = lax.cond(separable(g), by_matmul, exact, (dq, dk))
        dv = dot((k * jnp.exp(g_last - g)).astype(mm), dh_ref[...].astype(mm))
        intra = scale * dot(a_ref[:, rows].astype(mm), do_ref[...].astype(mm), trans_a=True)
        dv += jnp.where(own_tile, intra, 0.0)
        dg = q * dq - k * dk
        total = jnp.sum(dg, axis=0, keepdims=True)
        da_ref[rows, :] = later + total - jnp.cumsum(dg, axis=0) + dg
        later += total
        dq_ref[rows, :] = dq.astype(dq_ref.dtype)
        dk_ref[rows, :] = dk.astype(dk_ref.dtype)
        dv_ref[rows, :] = dv.astype(dv_ref.dtype)


def chunk_grads(t: TritonGlaTiling, chunk: int, scale, q, k, v, g, do, a, e, dh, rs):
    """`(dq, dk, dv, da)` `[B, T, H, ·]` per state head (H: the gate's heads); da: the gradient of the gate
    (before its cumulative sum). An input shared by groups of state heads gets its gradient per state
    head in float32 (the caller sums each group), but for q and k of Mamba-2's layout with a gate per head
    (per q / k head: `head_grads`); dv, and da for a gate per head, come per tile of key channels
    `[tiles, ...]` (the caller sums)."""
    if g.shape[-1] == 1:
        return head_grads(t, chunk, scale, q, k, v, g, do, a, e, dh, rs)
    batch, seq, heads, _ = g.shape
    dk, dv = q.shape[-1], v.shape[-1]
    ratios = [group_ratio(heads, x) for x in (q, k, v)]
    q_head, k_head, v_head = (functools.partial(group_of, ratio=r) for r in ratios)
    tiles = dk // t.block_k
    block = lambda width: (None, chunk, None, width)
    keys = pl.BlockSpec(block(t.block_k), lambda c, b, h, j: (b, c, h, j))
    state = pl.BlockSpec((None, None, None, t.block_k, dv), lambda c, b, h, j: (b, c, h, j, 0))
    per_tile = lambda width: pl.BlockSpec((None, None, chunk, None, width), lambda c, b, h, j: (j, b, c, h, 0))
    args = (q, k, v, g, do, a, e, dh, rs)
    q_ratio, k_ratio, v_ratio = ratios
    return call_pallas(
        _grads_kernel,
        t,
        t.grads_warps,
        (seq // chunk, batch, heads, tiles),
        [
            pl.BlockSpec(block(t.block_k), lambda c, b, h, j: (b, c, q_head(h), j)),
            pl.BlockSpec(block(t.block_k), lambda c, b, h, j: (b, c, k_head(h), j)),
            pl.BlockSpec(block(dv), lambda c, b, h, j: (b, c, v_head(h), 0)),
            keys,
            pl.BlockSpec(block(dv), lambda c, b, h, j: (b, c, h, 0)),
            pl.BlockSpec(block(chunk), lambda c, b, h, j: (b, c, h, 0)),
            state,
            state,
            pl.BlockSpec((None, None, None, t.block_k), lambda c, b, h, j: (b, c, h, j)),
        ],
        [keys, keys, per_tile(dv), keys],
        [
            out_struct((batch, seq, heads, dk), F32 if q_ratio > 1 else q.dtype, *args),
            out_struct((batch, seq, heads, dk), F32 if k_ratio > 1 else k.dtype, *args),
            out_struct((tiles, batch, seq, heads, dv), F32 if v_ratio > 1 or tiles > 1 else v.dtype, *args),
            out_struct((batch, seq, heads, dk), F32, *args),
        ],
        "ejkernel_gla_grads",
        chunk=chunk,
        scale=scale,
        mm=t.mm(q.dtype),
    )(*args)


# ---- the in-chunk kernels of a gate per head ----
#
# With one gate per head, `A = (q kᵀ) ⊙ D` with `D[t, s] = e^{g_t − g_s}` (s <= t): the decays form a
# `[C, C]` matrix of their own, every exponent <= 0 for decaying gates, and each product is one matmul
# over whole row blocks. The gates enter twice, as a column (`g`, `[C, 1]`) and as a row (`g_rows`: the
# cumulative gates transposed, `[B, H, T]`).


def _head_grads_kernel(
    q_ref, k_ref, v_ref, g_ref, g_row_ref, do_ref, a_ref, e_ref, dh_ref, rs_ref, dq_ref, dk_ref, *out_refs, **s
):
    """`_grads_kernel` for a gate per head, on whole chunks, for a span of state heads that read one q and k
    (per-head refs `[..., span, ...]`, the heads walked in a loop): `dS = (scale do vᵀ) ⊙ D`; dq = `dS k`
    + the entry state's `scale (do eᵀ) ⊙ e^{g}`, dk = `dSᵀ q` + the exit's `dk_exit`, both summed over the
    span; dv = `scale Aᵀ do` (key tile 0) + `(k ⊙ e^{g_C − g}) dh` per head.

    The cumulative gate's gradient, `Σ_d (q ⊙ dq − k ⊙ dk)` on each row, sums pairs of tokens on one side
    of a row that cancel in the gate's (its sum over the rows at or after each), and with them the rounding
    of dq and dk's in-chunk parts (bfloat16 products) would not: the in-chunk part is taken instead from
    `M = (scale do vᵀ) ⊙ A` in float32, `Σ_s M[t, s] − Σ_s M[s, t]`, where each pair's one value cancels
    exactly (key tile 0; a gate's total over a sequence, as Mamba-2's dA, can be a thousandth of its terms);
    the entry and exit states' shares from the exact `q ⊙ dq_entry` and `k ⊙ dk_exit`, and the exit's share
    of the last gate `e^{g_C} Σ rs + Σ k ⊙ dk_exit` on every row. `out_refs`: (dv_ref, da_ref), or (da_ref,)
    without `values_grad` (the delta rule, whose values are not an input).
    """
    chunk, scale, mm, span, values_grad = s["chunk"], s["scale"], s["mm"], s["span"], s["values_grad"]
    dv_ref, da_ref = out_refs if values_grad else (None, *out_refs)
    own_tile = pl.program_id(3) == 0  # the program that adds the key-tile-free terms
    total = lambda x: jnp.sum(jnp.sum(x, axis=1, keepdims=True), axis=0, keepdims=True)  # [1, 1]
    eye = iota((chunk, 1), 0) == iota((1, chunk), 1)
    q, k = q_ref[...], k_ref[...]

    def one_head(i, grads):
        g = g_ref[:, i, :]  # [C, 1]
        g_last = g_ref[chunk - 1, i, :][None, :]  # [1, 1]
        do, v = do_ref[:, i, :].astype(mm), v_ref[:, i, :].astype(mm)
        d_products = scale * dot(do, v, trans_b=True)  # [C, C]: the gradient of q kᵀ ⊙ D, before D
        a = a_ref[:, i, :]
        products = d_products * a.astype(F32)  # M
        columns = jnp.sum(jnp.where(eye, jnp.sum(products, axis=0, keepdims=True), 0.0), axis=1, keepdims=True)
        dg = jnp.where(own_tile, jnp.sum(products, axis=1, keepdims=True) - columns, 0.0)
        d_scores = (d_products * pair_decays(g, g_row_ref[i, :][None, :])).astype(mm)
        dq = scale * dot(do, e_ref[i, :, :].astype(mm), trans_b=True) * jnp.exp(g)
        dg += jnp.sum(q.astype(F32) * dq, axis=1, keepdims=True)
        dq += dot(d_scores, k.astype(mm))
        to_exit = jnp.exp(g_last - g)
        dh = dh_ref[i, :, :].astype(mm)
        dk = dot(v, dh, trans_b=True) * to_exit  # dk_exit
        exits = jnp.sum(k.astype(F32) * dk, axis=1, keepdims=True)
        dg -= exits
        dk += dot(d_scores, q.astype(mm), trans_a=True)
        if values_grad:
            dv = jnp.where(own_tile, scale * dot(a.astype(mm), do, trans_a=True), 0.0)
            dv += dot((k.astype(F32) * to_exit).astype(mm), dh)
            dv_ref[:, i, :] = dv.astype(dv_ref.dtype)
        later = jnp.exp(g_last) * jnp.sum(rs_ref[i, :][None, :], axis=1, keepdims=True) + total(exits)
        da_ref[:, i, :] = later + total(dg) - jnp.cumsum(dg, axis=0) + dg
        return grads[0] + dq, grads[1] + dk

    zeros = jnp.zeros(q.shape, F32)
    dq, dk = one_head(0, (zeros, zeros)) if span == 1 else lax.fori_loop(0, span, one_head, (zeros, zeros))
    dq_ref[...] = dq.astype(dq_ref.dtype)
    dk_ref[...] = dk.astype(dk_ref.dtype)


def head_grads(t: TritonGlaTiling, chunk: int, scale, q, k, v, g, do, a, e, dh, rs, values_grad: bool = True):
    """`chunk_grads` for a gate per head: one program per chunk, batch row, tile of key channels and span of
    state heads. Where q and k are shared by groups of state heads (and v is not: Mamba-2), a span is
    `gcd(t.head_span, group)` heads of one group and dq, dk come per q / k head, summed over the group in
    the kernel (over its spans in XLA); else a span is one head, dq and dk per state head. Without
    `values_grad` no dv is computed (None in its place)."""
    batch, seq, heads, _ = g.shape
    dk, dv = q.shape[-1], v.shape[-1]
    q_ratio, k_ratio, v_ratio = (group_ratio(heads, x) for x in (q, k, v))
    shared = q_ratio == k_ratio > 1 and v_ratio == 1
    span = math.gcd(t.head_span, q_ratio) if shared else 1
    parts = q_ratio // span if shared else 1  # spans per q / k head: their partial sums of dq and dk
    tiles = dk // t.head_block_k
    block = lambda width: (None, chunk, span, width)
    per_head = lambda width: pl.BlockSpec(block(width), lambda c, b, p, j: (b, c, p, 0))
    state = pl.BlockSpec((None, None, span, t.head_block_k, dv), lambda c, b, p, j: (b, c, p, j, 0))
    if shared:  # program p: span p of the state heads, part p % parts of q / k head p // parts
        q_head = k_head = out_head = functools.partial(group_of, ratio=parts)
    else:  # program p: state head p
        q_head, k_head = (functools.partial(group_of, ratio=r) for r in (q_ratio, k_ratio))
        out_head = lambda p: p
    part = (lambda p: lax.rem(p, jnp.int32(parts))) if parts > 1 else (lambda p: 0)
    sums = pl.BlockSpec((None, None, chunk, None, t.head_block_k), lambda c, b, p, j: (part(p), b, c, out_head(p), j))
    per_tile = lambda width: pl.BlockSpec((None, None, chunk, span, width), lambda c, b, p, j: (j, b, c, p, 0))
    args = (q, k, v, g, jnp.swapaxes(g[..., 0], 1, 2), do, a, e, dh, rs)

    def summed(x, ratio: int):
        out_heads = x.shape[2] if shared else heads
        dtype = x.dtype if (shared and parts == 1) or (not shared and ratio == 1) else F32
        return out_struct((parts, batch, seq, out_heads, dk), dtype, *args)

    dv_spec = [per_tile(dv)] if values_grad else []
    dv_dtype = F32 if v_ratio > 1 or tiles > 1 else v.dtype
    dv_out = [out_struct((tiles, batch, seq, heads, dv), dv_dtype, *args)] if values_grad else []
    dq, dk_, *dv_, da = call_pallas(
        _head_grads_kernel,
        t,
        t.head_grads_warps,
        (seq // chunk, batch, heads // span, tiles),
        [
            pl.BlockSpec((None, chunk, None, t.head_block_k), lambda c, b, p, j: (b, c, q_head(p), j)),
            pl.BlockSpec((None, chunk, None, t.head_block_k), lambda c, b, p, j: (b, c, k_head(p), j)),
            pl.BlockSpec(block(dv), lambda c, b, p, j: (b, c, group_of(p, v_ratio), 0)),
            per_head(1),
            pl.BlockSpec((None, span, chunk), lambda c, b, p, j: (b, p, c)),
            per_head(dv),
            per_head(chunk),
            state,
            state,
            pl.BlockSpec((None, None, span, t.head_block_k), lambda c, b, p, j: (b, c, p, j)),
        ],
        [sums, pl.BlockSpec(sums.block_shape, sums.index_map), *dv_spec, per_tile(1)],
        [
            summed(q, q_ratio),
            summed(k, k_ratio),
            *dv_out,
            out_struct((tiles, *g.shape), F32, *args),
        ],
        "ejkernel_gla_grads",
        chunk=chunk,
        scale=scale,
        mm=t.mm(q.dtype),
        span=span,
        values_grad=values_grad,
    )(*args)
    return tiles_sum(dq), tiles_sum(dk_), dv_[0] if values_grad else None, da
