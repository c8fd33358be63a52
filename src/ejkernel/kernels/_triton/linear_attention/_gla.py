"""The chunked gated linear recurrence (GLA, lightning, recurrent) in Pallas-Triton kernels.

Inputs stay in their token layout `[B, T, H, D]` and dtype (T: the sequence cut into chunks of C tokens,
`ChunkLayout.pad`); kernels index chunks through BlockSpecs or `pl.ds`. Matmul operands are in the
inputs' dtype (bfloat16 / float16 on tensor cores; float32 in full precision), accumulated in float32.
`g` is the cumulative log gate within each chunk (float32, `[B, T, H, Dk]`, or `[B, T, H, 1]` for a gate
per head: every formula below broadcasts it over the key channels). Heads: the gate's H state heads run
one state each; q, k and v may each have fewer heads (a divisor of H), read by groups of consecutive state
heads (`_shared`: grouped-query attention shares k and v, Mamba-2's SSD shares q and k), and their
gradients are summed over each group.

Recurrence per chunk entered with state `h` (`[Dk, Dv]`), unscaled (outputs are `scale ·` it):
`o = (q ⊙ e^{g}) h + A v`, exit state `e^{g_C} ⊙ h + (k ⊙ e^{g_C − g})ᵀ v`,
`A[t,s] = Σ_d q_td k_sd e^{g_td − g_sd}` for `s <= t`. `A` is built by row blocks of `SUB` tokens: keys
of earlier blocks through the gate `r` at the block's first row, `(q_t e^{g_t − r})·(k_s e^{r − g_s})`
(one matmul), keys of its own block one at a time, exactly; every exponent is <= 0 for decaying gates.
The backward's intra-chunk products take the same three routes (earlier keys, later queries, own block).
A gate per head (lightning, Mamba-2) has kernels of its own for both (`_head_scores`, `_head_grads`):
its decays form one `[C, C]` matrix, and every in-chunk product is a matmul over whole chunks.

Launches. Forward: `_cumulative` (the gates' cumulative sums), `_states` (sequential over chunks: every
chunk's entry state, and each sequence's final state), `_scores` (`A`, per row block), `_outputs` (with a
gate per head and `GlaTiling.fuse_head_scores`, a call that is not differentiated runs `_outputs` alone,
its kernel making the scores; `head_gate_forward` is that forward for Mamba-2, with dt and the D skip
taken in the kernels).
Backward: `_state_grads` (sequential, in reverse: the gradient of every chunk's exit state, and of the
initial states), `_grads` (per chunk: dq, dk, dv, and the gate's gradient, summed back from the
cumulative gate's `q ⊙ dq − k ⊙ dk` and the exit state's share). Residuals: the cumulative gates, the
entry states (bfloat16 for bfloat16 inputs) and `A`.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from ejkernel.kernels._common.vma import out_struct
from ejkernel.kernels._triton._helpers import dot

SUB = 16  # tokens per row block of the intra-chunk product (the smallest matmul edge)
F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class GlaTiling:
    """Tiles and warps of the GLA kernels (each clipped to the head dims).

    `state_k` x `state_v`: the state tile one program of the sequential passes carries; `block_v`: value
    columns per program of the output kernel; `block_k`: key channels per program of the gradient
    kernel (below Dk, dv is summed over programs in XLA); `head_span`: state heads per program of the
    per-head gradient kernel where they share q and k (Mamba-2: their dq and dk summed in the kernel;
    a power of two). `precise`: float32 inputs, float32 matmuls. `fuse_head_scores`: with a gate per head,
    a call that is not differentiated makes each chunk's scores inside the output kernel (`_head_outputs_kernel`)
    instead of writing `A` to memory and reading it back (H100, Mamba-2 forward at B=2 S=16384 H=32 P=64
    N=128: 1.066 against 1.122 ms).
    """

    state_k: int = 64
    state_v: int = 64
    block_v: int = 128
    block_k: int = 128
    head_span: int = 8
    state_warps: int = 4
    scores_warps: int = 4
    output_warps: int = 4
    grads_warps: int = 8
    num_stages: int = 2
    interpret: bool = False
    precise: bool = True
    fuse_head_scores: bool = True

    def fit(self, dk: int, dv: int) -> GlaTiling:
        return dataclasses.replace(
            self,
            state_k=min(self.state_k, dk),
            state_v=min(self.state_v, dv),
            block_v=min(self.block_v, dv),
            block_k=min(self.block_k, dk),
        )

    def mm(self, dtype):
        """The dtype of matmul operands: the inputs' own, or float32 when precise."""
        return F32 if self.precise else jnp.dtype(dtype)

    def state_dtype(self, dtype):
        """Chunk states in memory: bfloat16 for bfloat16 inputs (the matmuls read them so), else float32."""
        return jnp.dtype(dtype) if not self.precise and jnp.dtype(dtype) == jnp.bfloat16 else F32


def _call(kernel, t: GlaTiling, warps: int, grid, in_specs, out_specs, out_shape, name: str, **static):
    """`pallas_call` of `kernel(**static)`; specs None: whole arrays (the sequential passes index chunks themselves)."""
    specs = {} if in_specs is None else dict(in_specs=in_specs, out_specs=out_specs)
    return pl.pallas_call(
        functools.partial(kernel, **static),
        grid=grid,
        **specs,
        out_shape=out_shape,
        compiler_params=plgpu.CompilerParams(num_warps=warps, num_stages=t.num_stages),
        interpret=t.interpret,
        name=name,
    )


def _tile(i, size: int):
    return pl.ds(pl.multiple_of(i * size, size), size)


def _iota(shape, axis: int):
    return lax.broadcasted_iota(jnp.int32, shape, axis)


def _masked_exp(x, keep):
    """`e^x` where `keep`, else 0 (the exponent masked first: no overflow where it is dropped)."""
    return jnp.where(keep, jnp.exp(jnp.where(keep, x, 0.0)), 0.0)


def _everywhere(cond, shape):
    return jnp.full(shape, cond)


def _ratio(heads: int, x) -> int:
    """How many state heads share each head of `x` (`[B, T, Hx, D]`, Hx a divisor of the state heads)."""
    return heads // x.shape[2]


def _shared(head, ratio: int):
    """The head of an input shared by groups of `ratio` state heads that state head `head` reads."""
    return head if ratio == 1 else lax.div(head, jnp.int32(ratio))


def _gate_columns(g_ref, keys):
    """The gate columns of a tile of key channels: the same ones, or the head's only one."""
    return keys if g_ref.shape[-1] > 1 else pl.ds(0, 1)


# ---- sequential passes over chunks (one program per batch row, head and state tile) ----


def _states_kernel(starts_ref, ends_ref, owners_ref, k_ref, v_ref, g_ref, init_ref, *refs, **s):
    """`h ← init[start]` where a sequence starts; store h (the chunk's entry state); `h ← e^{g_C} ⊙ h +
    (k ⊙ e^{g_C − g})ᵀ v`; store h as its sequence's final state where the sequence ends. Unpacked
    (`packed` False), row b is one sequence: init[b] before the first chunk, the final state after the last.
    With `value_scaled`, `refs` starts with `vs [B, T, H, 1]`: the values are `vs ⊙ v` (taken into k's rows)."""
    vs_ref, e_ref, final_ref = refs if s["value_scaled"] else (None, *refs)
    chunk, mm, bk, bv, packed = s["chunk"], s["mm"], s["bk"], s["bv"], s["packed"]
    b, head, kt, vt = (pl.program_id(i) for i in range(4))
    k_head, v_head = _shared(head, s["k_ratio"]), _shared(head, s["v_ratio"])
    keys, cols = _tile(kt, bk), _tile(vt, bv)
    gates = _gate_columns(g_ref, keys)

    def step(c, h):
        if packed:
            start = starts_ref[c, b]
            at = init_ref.at[jnp.maximum(start, 0), head, keys, cols]
            h = jnp.where(start >= 0, plgpu.load(at, mask=_everywhere(start >= 0, (bk, bv)), other=0.0), h)
        e_ref[b, c, head, keys, cols] = h.astype(e_ref.dtype)
        first = pl.multiple_of(c * chunk, chunk)
        rows = pl.ds(first, chunk)
        g_last = g_ref[b, first + chunk - 1, head, gates]
        k = k_ref[b, rows, k_head, keys].astype(F32) * jnp.exp(g_last[None, :] - g_ref[b, rows, head, gates])
        if vs_ref is not None:
            k = k * vs_ref[b, rows, head, pl.ds(0, 1)]
        h = jnp.exp(g_last)[:, None] * h + dot(k.astype(mm), v_ref[b, rows, v_head, cols].astype(mm), trans_a=True)
        if packed:
            end = _everywhere(ends_ref[c, b] > 0, (bk, bv))
            plgpu.store(final_ref.at[owners_ref[c, b], head, keys, cols], h, mask=end)
        return h

    if packed:
        lax.fori_loop(0, e_ref.shape[1], step, jnp.zeros((bk, bv), F32))
    else:
        final_ref[b, head, keys, cols] = lax.fori_loop(0, e_ref.shape[1], step, init_ref[b, head, keys, cols])


def _states(t: GlaTiling, packed: bool, k, v, g, init, starts, ends, owners, v_scale=None):
    """`(entry states [B, NC, H, Dk, Dv] (`state_dtype`), final states [N, H, Dk, Dv] float32; unwritten for
    sequences without tokens)`. `v_scale [B, T, H, 1]` float32 (optional): the values are `v_scale ⊙ v`."""
    batch, seq, heads, _ = g.shape
    dk, dv = k.shape[-1], v.shape[-1]
    chunks = starts.shape[0]
    args = (starts, ends, owners, k, v, g, init) + (() if v_scale is None else (v_scale,))
    return _call(
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
        k_ratio=_ratio(heads, k),
        v_ratio=_ratio(heads, v),
        packed=packed,
        value_scaled=v_scale is not None,
        bk=t.state_k,
        bv=t.state_v,
        mm=t.mm(k.dtype),
    )(*args)


def _state_grads_kernel(
    starts_ref, ends_ref, owners_ref, q_ref, g_ref, do_ref, e_ref, d_final_ref, dh_ref, d_init_ref, rs_ref, **s
):
    """In reverse: `d ← d_final[seq]` where a sequence ends (else the next chunk's entry gradient); store d
    (the chunk's exit-state gradient) and `Σ_v h_in ⊙ d`; `d ← e^{g_C} ⊙ d + scale (q ⊙ e^{g})ᵀ do`; store d
    as the initial state's gradient where the sequence starts (unpacked: d_final[b] first, d_init[b] last)."""
    chunk, mm, bk, bv, packed = s["chunk"], s["mm"], s["bk"], s["bv"], s["packed"]
    b, head, kt, vt = (pl.program_id(i) for i in range(4))
    q_head = _shared(head, s["q_ratio"])
    keys, cols = _tile(kt, bk), _tile(vt, bv)
    gates = _gate_columns(g_ref, keys)
    num_chunks = dh_ref.shape[1]

    def step(i, d):
        c = num_chunks - 1 - i
        if packed:
            end = ends_ref[c, b] > 0
            at = d_final_ref.at[owners_ref[c, b], head, keys, cols]
            d = jnp.where(end, plgpu.load(at, mask=_everywhere(end, (bk, bv)), other=0.0), d)
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
            plgpu.store(at, d, mask=_everywhere(start >= 0, (bk, bv)))
        return d

    if packed:
        lax.fori_loop(0, num_chunks, step, jnp.zeros((bk, bv), F32))
    else:
        d_init_ref[b, head, keys, cols] = lax.fori_loop(0, num_chunks, step, d_final_ref[b, head, keys, cols])


def _state_grads(t: GlaTiling, packed: bool, scale, q, g, do, e, d_final, starts, ends, owners):
    """`(exit-state gradients [B, NC, H, Dk, Dv] (e's dtype), initial-state gradients [N, H, Dk, Dv] float32
    (sequences without a chunk left unwritten), Σ_v h_in ⊙ d_exit [B, NC, H, Dk] float32)`."""
    batch, seq, heads, _ = g.shape
    dk, dv = q.shape[-1], do.shape[-1]
    chunks = starts.shape[0]
    args = (starts, ends, owners, q, g, do, e, d_final)
    dh, d_init, rs = _call(
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
        q_ratio=_ratio(heads, q),
        scale=scale,
        packed=packed,
        bk=t.state_k,
        bv=t.state_v,
        mm=t.mm(q.dtype),
    )(*args)
    return dh, d_init, jnp.sum(rs, axis=0)


# ---- per-chunk kernels ----


def _cumulative_kernel(a_ref, g_ref):
    g_ref[...] = jnp.cumsum(a_ref[...], axis=0)


def _cumulative(t: GlaTiling, chunk: int, a):
    """The cumulative log gates within each chunk, `[B, T, H, Dk or 1]` float32."""
    batch, seq, heads, width = a.shape
    spec = pl.BlockSpec((None, chunk, None, width), lambda c, b, h: (b, c, h, 0))
    return _call(
        _cumulative_kernel,
        t,
        4,
        (seq // chunk, batch, heads),
        [spec],
        spec,
        out_struct(a.shape, F32, a),
        "ejkernel_gla_cumulative",
    )(a)


def _own_keys(g_ref, first: int, body, carry):
    """`body(j, decay, carry)` for the keys j = SUB − 1, ..., 0 of the row block at `first`, in a loop, with
    `decay [SUB, D]` = `e^{g_t − g_j}` for its rows t >= j (0 above). Built key by key, `decay_j =
    e^{g_{j+1} − g_j} ⊙ decay_{j+1}` (1 on row j): one exponential per key and channel, each of one
    token's gate (every factor <= 1 for decaying gates)."""
    row = _iota((SUB, 1), 0)

    def step(i, state):
        decay, g_next, carry = state
        j = SUB - 1 - i
        g_j = g_ref[first + j, :][None, :]
        decay = jnp.where(row == j, 1.0, decay * jnp.exp(g_next - g_j))
        return decay, g_j, body(j, decay, carry)

    start = (jnp.zeros((SUB, g_ref.shape[-1]), F32), g_ref[first + SUB - 1, :][None, :], carry)
    return lax.fori_loop(0, SUB, step, start)[2]


def _scores_kernel(q_ref, k_ref, g_ref, a_ref, *, chunk: int, mm):
    """Row block `i` of a chunk's `A` (`[SUB, C]`, zeros right of the diagonal)."""
    first = pl.multiple_of(lax.rem(pl.program_id(0), jnp.int32(chunk // SUB)) * SUB, SUB)
    q = q_ref[...].astype(F32)
    g = g_ref[pl.ds(first, SUB), :]
    r = g_ref[first, :][None, :]  # the gate at the block's first row
    before = _iota((chunk, 1), 0) < first
    keys = k_ref[...].astype(F32) * _masked_exp(r - g_ref[...], before)
    scores = dot((q * jnp.exp(g - r)).astype(mm), keys.astype(mm), trans_b=True)
    col = _iota((1, chunk), 1)

    def diagonal(j, decay, scores):  # key `first + j`, one of the block's own rows
        weights = jnp.sum(q * k_ref[first + j, :].astype(F32)[None, :] * decay, axis=1, keepdims=True)
        return jnp.where(col == first + j, weights, scores)

    a_ref[...] = _own_keys(g_ref, first, diagonal, scores).astype(a_ref.dtype)


def _scores(t: GlaTiling, chunk: int, q, k, g):
    """`A` `[B, T, H, C]` (row t of a chunk: its weights on the chunk's keys), in q's dtype (float32 if precise)."""
    if g.shape[-1] == 1:
        return _head_scores(t, chunk, q, k, g)
    batch, seq, heads, _ = g.shape
    dk = q.shape[-1]
    q_ratio, k_ratio = _ratio(heads, q), _ratio(heads, k)
    per_chunk = lambda i: lax.div(i, jnp.int32(chunk // SUB))
    block = lambda width: (None, chunk, None, width)
    return _call(
        _scores_kernel,
        t,
        t.scores_warps,
        (seq // SUB, batch, heads),
        [
            pl.BlockSpec((None, SUB, None, dk), lambda i, b, h: (b, i, _shared(h, q_ratio), 0)),
            pl.BlockSpec(block(dk), lambda i, b, h: (b, per_chunk(i), _shared(h, k_ratio), 0)),
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
    scores = dot(q_ref[...].astype(mm), k_ref[...].astype(mm), trans_b=True) * _decays(g, g_row_ref[...][None, :])
    if value_scaled:
        scores = scores * vs_row_ref[...][None, :]
    q = (q_ref[...].astype(F32) * jnp.exp(g)).astype(mm)
    out = scale * (dot(q, e_ref[...].astype(mm)) + dot(scores.astype(mm), v_ref[...].astype(mm)))
    if value_scaled:
        out = out + skip_ref[...][:, None] * v_ref[...].astype(F32)
    o_ref[...] = out.astype(o_ref.dtype)


def _outputs(t: GlaTiling, chunk: int, scale, q, v, g, e, *, a=None, k=None, v_scale=None, skip=None):
    """The outputs from the scores `a`; with `k` instead (a gate per head, `GlaTiling.fuse_head_scores`)
    the kernel makes each chunk's scores itself, and `A` is never in memory. With `k`, `v_scale [B, T, H, 1]`
    and `skip [H]` (float32, both or neither; Mamba-2's dt and D) make the outputs those of the values
    `v_scale ⊙ v`, plus `skip ⊙ v`."""
    batch, seq, heads, _ = g.shape
    dk, dv = q.shape[-1], v.shape[-1]
    q_ratio, v_ratio = _ratio(heads, q), _ratio(heads, v)
    block = lambda width: (None, chunk, None, width)
    static = {}
    if a is not None:
        kernel, name, scores = _outputs_kernel, "ejkernel_gla_outputs", [a]
        scores_specs = [pl.BlockSpec(block(chunk), lambda c, b, h, j: (b, c, h, 0))]
    else:
        kernel, name, scores = _head_outputs_kernel, "ejkernel_gla_head_outputs", [k, jnp.swapaxes(g[..., 0], 1, 2)]
        k_ratio = _ratio(heads, k)
        row = pl.BlockSpec((None, None, chunk), lambda c, b, h, j: (b, h, c))
        scores_specs = [pl.BlockSpec(block(dk), lambda c, b, h, j: (b, c, _shared(h, k_ratio), 0)), row]
        static["value_scaled"] = v_scale is not None
        if v_scale is not None:
            scores += [jnp.swapaxes(v_scale[..., 0], 1, 2), jnp.broadcast_to(skip[None, :, None], (1, heads, chunk))]
            scores_specs += [row, pl.BlockSpec((None, None, chunk), lambda c, b, h, j: (0, h, 0))]
    return _call(
        kernel,
        t,
        t.output_warps,
        (seq // chunk, batch, heads, dv // t.block_v),
        [
            pl.BlockSpec(block(dk), lambda c, b, h, j: (b, c, _shared(h, q_ratio), 0)),
            pl.BlockSpec(block(g.shape[-1]), lambda c, b, h, j: (b, c, h, 0)),
            *scores_specs,
            pl.BlockSpec(block(t.block_v), lambda c, b, h, j: (b, c, _shared(h, v_ratio), j)),
            pl.BlockSpec((None, None, None, dk, t.block_v), lambda c, b, h, j: (b, c, h, 0, j)),
        ],
        pl.BlockSpec(block(t.block_v), lambda c, b, h, j: (b, c, h, j)),
        out_struct((batch, seq, heads, dv), v.dtype, q, v, g, e, *scores),
        name,
        scale=scale,
        mm=t.mm(q.dtype),
        **static,
    )(q, g, *scores, v, e)


def _from_earlier(m: int, q_ref, k_ref, g_ref, v_ref, do, g, scale, mm):
    """dq of row block m through the keys of the earlier blocks (the gate r at the block's first row)."""
    n = m * SUB
    keys = pl.ds(0, pl.next_power_of_2(n))
    r = g_ref[n, :][None, :]
    weights = k_ref[keys, :].astype(F32) * _masked_exp(r - g_ref[keys, :], _iota((keys.size, 1), 0) < n)
    d_scores = scale * dot(do, v_ref[keys, :].astype(mm), trans_b=True)  # [SUB, keys]
    return dot(d_scores.astype(mm), weights.astype(mm)) * jnp.exp(g - r)


def _from_later(m: int, q_ref, g_ref, v, do_ref, g, scale, mm, chunk: int):
    """dk of row block m through the queries of the later blocks (the gate r at the block's last row)."""
    n = (m + 1) * SUB
    size = pl.next_power_of_2(chunk - n)
    queries = pl.ds(chunk - size, size)
    r = g_ref[n - 1, :][None, :]
    later = chunk - size + _iota((size, 1), 0) >= n
    weights = q_ref[queries, :].astype(F32) * _masked_exp(g_ref[queries, :] - r, later)
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
    row, col = _iota((SUB, 1), 0), _iota((1, SUB), 1)
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
            dq += _from_earlier(m, q_ref, k_ref, g_ref, v_ref, do, g, scale, mm)
        if m < num_blocks - 1:
            dk += _from_later(m, q_ref, g_ref, v, do_ref, g, scale, mm, chunk)
        d_scores = scale * dot(do, v, trans_b=True)  # [SUB, SUB]: the block's own keys

        def diagonal(j, decay, grads, m=m, q=q, d_scores=d_scores):
            dq, dk = grads
            w = jnp.sum(jnp.where(col == j, d_scores, 0.0), axis=1, keepdims=True) * decay
            dq += w * k_ref[m * SUB + j, :].astype(F32)[None, :]
            return dq, dk + jnp.where(row == j, jnp.sum(w * q, axis=0, keepdims=True), 0.0)

        dq, dk = _own_keys(g_ref, m * SUB, diagonal, (dq, dk))
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


def _grads(t: GlaTiling, chunk: int, scale, q, k, v, g, do, a, e, dh, rs):
    """`(dq, dk, dv, da)` `[B, T, H, ·]` per state head (H: the gate's heads); da: the gradient of the gate
    (before its cumulative sum). An input shared by groups of state heads gets its gradient per state
    head in float32 (the caller sums each group), but for q and k of Mamba-2's layout with a gate per head
    (per q / k head: `_head_grads`); dv, and da for a gate per head, come per tile of key channels
    `[tiles, ...]` (the caller sums)."""
    if g.shape[-1] == 1:
        return _head_grads(t, chunk, scale, q, k, v, g, do, a, e, dh, rs)
    batch, seq, heads, _ = g.shape
    dk, dv = q.shape[-1], v.shape[-1]
    ratios = [_ratio(heads, x) for x in (q, k, v)]
    q_head, k_head, v_head = (functools.partial(_shared, ratio=r) for r in ratios)
    tiles = dk // t.block_k
    block = lambda width: (None, chunk, None, width)
    keys = pl.BlockSpec(block(t.block_k), lambda c, b, h, j: (b, c, h, j))
    state = pl.BlockSpec((None, None, None, t.block_k, dv), lambda c, b, h, j: (b, c, h, j, 0))
    per_tile = lambda width: pl.BlockSpec((None, None, chunk, None, width), lambda c, b, h, j: (j, b, c, h, 0))
    args = (q, k, v, g, do, a, e, dh, rs)
    q_ratio, k_ratio, v_ratio = ratios
    return _call(
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


def _decays(g_col, g_row, first: int = 0):
    """`D [R, C]` for the rows `first + r` of a chunk: `e^{g_t − g_s}` where s <= t, else 0."""
    rows, cols = g_col.shape[0], g_row.shape[-1]
    keep = first + _iota((rows, 1), 0) >= _iota((1, cols), 1)
    return _masked_exp(g_col - g_row, keep)


def _head_scores_kernel(q_ref, k_ref, g_ref, g_row_ref, a_ref, *, chunk: int, mm):
    """Rows `[R, C]` of a chunk's `A` (zeros right of the diagonal)."""
    rows = a_ref.shape[0]
    first = lax.rem(pl.program_id(0), jnp.int32(chunk // rows)) * rows
    scores = dot(q_ref[...].astype(mm), k_ref[...].astype(mm), trans_b=True)
    a_ref[...] = (scores * _decays(g_ref[...], g_row_ref[...][None, :], first)).astype(a_ref.dtype)


def _head_scores(t: GlaTiling, chunk: int, q, k, g):
    """`_scores` for a gate per head: programs of `min(C, 64)` rows."""
    batch, seq, heads, _ = g.shape
    dk, rows = q.shape[-1], min(chunk, 64)
    q_ratio, k_ratio = _ratio(heads, q), _ratio(heads, k)
    per_chunk = lambda i: lax.div(i, jnp.int32(chunk // rows))
    g_rows = jnp.swapaxes(g[..., 0], 1, 2)
    return _call(
        _head_scores_kernel,
        t,
        t.scores_warps,
        (seq // rows, batch, heads),
        [
            pl.BlockSpec((None, rows, None, dk), lambda i, b, h: (b, i, _shared(h, q_ratio), 0)),
            pl.BlockSpec((None, chunk, None, dk), lambda i, b, h: (b, per_chunk(i), _shared(h, k_ratio), 0)),
            pl.BlockSpec((None, rows, None, 1), lambda i, b, h: (b, i, h, 0)),
            pl.BlockSpec((None, None, chunk), lambda i, b, h: (b, h, per_chunk(i))),
        ],
        pl.BlockSpec((None, rows, None, chunk), lambda i, b, h: (b, i, h, 0)),
        out_struct((batch, seq, heads, chunk), t.mm(q.dtype), q, k, g),
        "ejkernel_gla_scores",
        chunk=chunk,
        mm=t.mm(q.dtype),
    )(q, k, g, g_rows)


def _head_grads_kernel(
    q_ref, k_ref, v_ref, g_ref, g_row_ref, do_ref, a_ref, e_ref, dh_ref, rs_ref, dq_ref, dk_ref, dv_ref, da_ref, **s
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
    of the last gate `e^{g_C} Σ rs + Σ k ⊙ dk_exit` on every row.
    """
    chunk, scale, mm, span = s["chunk"], s["scale"], s["mm"], s["span"]
    own_tile = pl.program_id(3) == 0  # the program that adds the key-tile-free terms
    total = lambda x: jnp.sum(jnp.sum(x, axis=1, keepdims=True), axis=0, keepdims=True)  # [1, 1]
    eye = _iota((chunk, 1), 0) == _iota((1, chunk), 1)
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
        dv = jnp.where(own_tile, scale * dot(a.astype(mm), do, trans_a=True), 0.0)
        d_scores = (d_products * _decays(g, g_row_ref[i, :][None, :])).astype(mm)
        dq = scale * dot(do, e_ref[i, :, :].astype(mm), trans_b=True) * jnp.exp(g)
        dg += jnp.sum(q.astype(F32) * dq, axis=1, keepdims=True)
        dq += dot(d_scores, k.astype(mm))
        to_exit = jnp.exp(g_last - g)
        dh = dh_ref[i, :, :].astype(mm)
        dk = dot(v, dh, trans_b=True) * to_exit  # dk_exit
        exits = jnp.sum(k.astype(F32) * dk, axis=1, keepdims=True)
        dg -= exits
        dk += dot(d_scores, q.astype(mm), trans_a=True)
        dv += dot((k.astype(F32) * to_exit).astype(mm), dh)
        dv_ref[:, i, :] = dv.astype(dv_ref.dtype)
        later = jnp.exp(g_last) * jnp.sum(rs_ref[i, :][None, :], axis=1, keepdims=True) + total(exits)
        da_ref[:, i, :] = later + total(dg) - jnp.cumsum(dg, axis=0) + dg
        return grads[0] + dq, grads[1] + dk

    zeros = jnp.zeros(q.shape, F32)
    dq, dk = one_head(0, (zeros, zeros)) if span == 1 else lax.fori_loop(0, span, one_head, (zeros, zeros))
    dq_ref[...] = dq.astype(dq_ref.dtype)
    dk_ref[...] = dk.astype(dk_ref.dtype)


def _head_grads(t: GlaTiling, chunk: int, scale, q, k, v, g, do, a, e, dh, rs):
    """`_grads` for a gate per head: one program per chunk, batch row, tile of key channels and span of
    state heads. Where q and k are shared by groups of state heads (and v is not: Mamba-2), a span is
    `gcd(t.head_span, group)` heads of one group and dq, dk come per q / k head, summed over the group in
    the kernel (over its spans in XLA); else a span is one head, dq and dk per state head."""
    batch, seq, heads, _ = g.shape
    dk, dv = q.shape[-1], v.shape[-1]
    q_ratio, k_ratio, v_ratio = (_ratio(heads, x) for x in (q, k, v))
    shared = q_ratio == k_ratio > 1 and v_ratio == 1
    span = math.gcd(t.head_span, q_ratio) if shared else 1
    parts = q_ratio // span if shared else 1  # spans per q / k head: their partial sums of dq and dk
    tiles = dk // t.block_k
    block = lambda width: (None, chunk, span, width)
    per_head = lambda width: pl.BlockSpec(block(width), lambda c, b, p, j: (b, c, p, 0))
    state = pl.BlockSpec((None, None, span, t.block_k, dv), lambda c, b, p, j: (b, c, p, j, 0))
    if shared:  # program p: span p of the state heads, part p % parts of q / k head p // parts
        q_head = k_head = out_head = functools.partial(_shared, ratio=parts)
    else:  # program p: state head p
        q_head, k_head = (functools.partial(_shared, ratio=r) for r in (q_ratio, k_ratio))
        out_head = lambda p: p
    part = (lambda p: lax.rem(p, jnp.int32(parts))) if parts > 1 else (lambda p: 0)
    sums = pl.BlockSpec((None, None, chunk, None, t.block_k), lambda c, b, p, j: (part(p), b, c, out_head(p), j))
    per_tile = lambda width: pl.BlockSpec((None, None, chunk, span, width), lambda c, b, p, j: (j, b, c, p, 0))
    args = (q, k, v, g, jnp.swapaxes(g[..., 0], 1, 2), do, a, e, dh, rs)

    def summed(x, ratio: int):
        out_heads = x.shape[2] if shared else heads
        dtype = x.dtype if (shared and parts == 1) or (not shared and ratio == 1) else F32
        return out_struct((parts, batch, seq, out_heads, dk), dtype, *args)

    dq, dk_, dv_, da = _call(
        _head_grads_kernel,
        t,
        t.grads_warps,
        (seq // chunk, batch, heads // span, tiles),
        [
            pl.BlockSpec((None, chunk, None, t.block_k), lambda c, b, p, j: (b, c, q_head(p), j)),
            pl.BlockSpec((None, chunk, None, t.block_k), lambda c, b, p, j: (b, c, k_head(p), j)),
            pl.BlockSpec(block(dv), lambda c, b, p, j: (b, c, _shared(p, v_ratio), 0)),
            per_head(1),
            pl.BlockSpec((None, span, chunk), lambda c, b, p, j: (b, p, c)),
            per_head(dv),
            per_head(chunk),
            state,
            state,
            pl.BlockSpec((None, None, span, t.block_k), lambda c, b, p, j: (b, c, p, j)),
        ],
        [sums, pl.BlockSpec(sums.block_shape, sums.index_map), per_tile(dv), per_tile(1)],
        [
            summed(q, q_ratio),
            summed(k, k_ratio),
            out_struct((tiles, batch, seq, heads, dv), F32 if v_ratio > 1 or tiles > 1 else v.dtype, *args),
            out_struct((tiles, *g.shape), F32, *args),
        ],
        "ejkernel_gla_grads",
        chunk=chunk,
        scale=scale,
        mm=t.mm(q.dtype),
        span=span,
    )(*args)
    return _tiles_sum(dq), _tiles_sum(dk_), dv_, da


# ---- the differentiable whole ----


def _tiles_sum(x):
    """Partial sums `[tiles, ...]` over the tiles of key channels, added up."""
    return x[0] if x.shape[0] == 1 else jnp.sum(x, axis=0)


def _group_sum(x, shared_heads: int, dtype):
    """Per-state-head gradients `[B, T, H, D]` of an input with `shared_heads` heads (each read by a group of
    consecutive state heads), summed over each group."""
    batch, seq, heads, dim = x.shape
    if heads == shared_heads:
        return x.astype(dtype)
    return jnp.sum(x.reshape(batch, seq, shared_heads, heads // shared_heads, dim), axis=3).astype(dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def gla_chunked(tiling: GlaTiling, scale: float, packed: bool, q, k, v, a, init, starts, ends, owners, empty):
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


def head_gate_forward(tiling: GlaTiling, chunk: int, q, k, v, a, init, v_scale, skip):
    """A plain (not differentiated) forward with a gate per head, one sequence per batch row of a length that
    is a multiple of `chunk`, scale 1, in three kernels: the outputs `[B, S, H, Dv]` (v's dtype) of the values
    `v_scale ⊙ v` plus `skip ⊙ v`, and the final states `[B, H, Dk, Dv]` float32. `a [B, S, H, 1]` the log
    gates, `v_scale [B, S, H, 1]` and `skip [H]` float32 (Mamba-2: dt and D, so that neither dt ⊙ x nor the
    skip takes a pass over memory of its own)."""
    t = tiling.fit(q.shape[-1], v.shape[-1])
    batch, seq = a.shape[:2]
    starts = jnp.full((seq // chunk, batch), -1, jnp.int32).at[0].set(jnp.arange(batch, dtype=jnp.int32))
    g = _cumulative(t, chunk, a)
    e, final = _states(t, False, k, v, g, init, starts, starts, starts, v_scale)  # (unpacked: no ends, owners)
    return _outputs(t, chunk, 1.0, q, v, g, e, k=k, v_scale=v_scale, skip=skip), final


def _fitted(tiling: GlaTiling, q, v, starts):
    return tiling.fit(q.shape[-1], v.shape[-1]), q.shape[1] // starts.shape[0]


def _forward(tiling, scale, packed, q, k, v, a, init, starts, ends, owners, empty, residuals=True):
    """`(outputs, (g, e, A))`; without `residuals` (no backward to come) `A` may stay unwritten (None)."""
    t, chunk = _fitted(tiling, q, v, starts)
    g = _cumulative(t, chunk, a)
    e, final = _states(t, packed, k, v, g, init, starts, ends, owners)
    if t.fuse_head_scores and g.shape[-1] == 1 and not residuals:
        scores, out = None, _outputs(t, chunk, scale, q, v, g, e, k=k)
    else:
        scores = _scores(t, chunk, q, k, g)
        out = _outputs(t, chunk, scale, q, v, g, e, a=scores)
    return (out, jnp.where(empty[:, None, None, None], init, final)), (g, e, scores)


def _fwd(tiling, scale, packed, q, k, v, a, init, starts, ends, owners, empty):
    outputs, kept = _forward(tiling, scale, packed, q, k, v, a, init, starts, ends, owners, empty)
    return outputs, (q, k, v, starts, ends, owners, empty, *kept)


def _bwd(tiling, scale, packed, residuals, cotangents):
    q, k, v, starts, ends, owners, empty, g, e, scores = residuals
    d_out, d_final = cotangents
    t, chunk = _fitted(tiling, q, v, starts)
    dh, d_init, rs = _state_grads(t, packed, scale, q, g, d_out, e, d_final, starts, ends, owners)
    dq, dk, dv, da = _grads(t, chunk, scale, q, k, v, g, d_out, scores, e, dh, rs)
    if da.ndim == 5:  # a gate per head: summed over the tiles of key channels
        da = _tiles_sum(da)
    d_init = jnp.where(empty[:, None, None, None], d_final, d_init)
    dq, dk = _group_sum(dq, q.shape[2], q.dtype), _group_sum(dk, k.shape[2], k.dtype)
    dv = _group_sum(_tiles_sum(dv), v.shape[2], v.dtype)
    return dq, dk, dv, da, d_init, None, None, None, None


gla_chunked.defvjp(_fwd, _bwd)
