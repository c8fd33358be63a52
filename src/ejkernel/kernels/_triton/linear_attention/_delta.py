"""The chunked delta rule (gated delta rule, kernel delta attention) in Pallas-Triton kernels, token layout.

Per chunk entered with state `h`, the WY transform (`wy_transform`, in XLA: it is local to each chunk)
gives `u = T (β v)` and `w = T (β e^{b} k)`, `T = (I + L)⁻¹`, and the chunk's effective values are
`U = u − w h`. From there the chunk is the gated recurrence with a gate per head and values U: outputs
`scale · ((q ⊙ e^{g}) h + A U)`, exit state `e^{g_C} h + (k ⊙ e^{g_C − g})ᵀ U` (`_gla` tells that
story). So the delta rule runs GLA's kernels of a gate per head (`cumulative_gates`, `head_scores`, `chunk_outputs`,
`head_grads`) around two sequential passes of its own, which carry U's dependence on h:

- forward (`_delta_states`): per chunk, `U = u − w h` (stored), then the exit state;
- backward (`_delta_state_grads`), in reverse from the final state's gradient `d`: the chunk's
  `dU = scale Aᵀ do + (k ⊙ e^{g_C − g}) d` (stored), then the entry state's gradient
  `e^{g_C} d + scale (q ⊙ e^{g})ᵀ do − wᵀ dU`.

The rest of the backward: dq, dk and the gate's gradient through GLA's `head_grads` (with values U),
`dw = −dU hᵀ`, and the pullback of the WY transform (XLA, kept from the forward) for the rest of dk, dv,
dβ and the gate's.
One sequence per batch row (no restarts, no packing: those take the XLA chunk parts); T a multiple of
the chunk; matmul operands in the inputs' dtype (float32 in full precision when `precise`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from ejkernel.kernels._common.linear_attention.layout import ChunkLayout
from ejkernel.kernels._common.linear_attention.numerics import wy_transform
from ejkernel.kernels._common.vma import out_struct
from ejkernel.kernels._triton._helpers import dot
from ejkernel.kernels._triton.linear_attention._gla_backward import head_grads
from ejkernel.kernels._triton.linear_attention._gla_common import (
    F32,
    TritonGlaTiling,
    call_pallas,
    tile_slice,
    tiles_sum,
)
from ejkernel.kernels._triton.linear_attention._gla_forward import chunk_outputs, cumulative_gates, head_scores
from ejkernel.kernels._triton.linear_attention._state_passes import TritonStatePassTiling

# ---- the WY transform, per chunk in XLA ----


def _chunks(x, chunk: int) -> ChunkLayout:
    """The layout of `x [B, T, H, ...]` cut into chunks (T a multiple of `chunk`)."""
    return ChunkLayout.dense(x.shape[0], x.shape[1], chunk)


def _wy(chunk: int, k, v, beta, a):
    """`(u, w)` `[B, T, H, D]` float32 of every chunk (products in k's and v's dtype, the system solved in
    float32); `a [B, T, H]` the log gates (summed within chunks here)."""
    layout = _chunks(k, chunk)
    gates = jnp.cumsum(layout.to_chunks(a), axis=-1)
    u, w = wy_transform(*(layout.to_chunks(x) for x in (k, v, beta)), gates)
    return layout.from_chunks(u), layout.from_chunks(w)


# ---- the sequential passes (one program per batch row, head and tile of value columns) ----


def _chunk_gates(g_ref, b, head, first: int, chunk: int):
    """`(g [C, 1], g at the chunk's last row [1])` of the chunk at `first`."""
    one = pl.ds(0, 1)
    return g_ref[b, pl.ds(first, chunk), head, one], g_ref[b, first + chunk - 1, head, one]


def _delta_states_kernel(k_ref, w_ref, u_ref, g_ref, init_ref, e_ref, values_ref, final_ref, *, chunk, mm, bv):
    """Per chunk: store h (its entry state); `U = u − w h` (stored); `h ← e^{g_C} h + (k ⊙ e^{g_C − g})ᵀ U`."""
    b, head, vt = (pl.program_id(i) for i in range(3))
    cols = tile_slice(vt, bv)

    def step(c, h):
        e_ref[b, c, head, :, cols] = h.astype(e_ref.dtype)
        first = pl.multiple_of(c * chunk, chunk)
        rows = pl.ds(first, chunk)
        g, g_last = _chunk_gates(g_ref, b, head, first, chunk)
        values = u_ref[b, rows, head, cols].astype(F32) - dot(w_ref[b, rows, head, :].astype(mm), h.astype(mm))
        values_ref[b, rows, head, cols] = values.astype(values_ref.dtype)
        k = (k_ref[b, rows, head, :].astype(F32) * jnp.exp(g_last[None, :] - g)).astype(mm)
        return jnp.exp(g_last) * h + dot(k, values.astype(mm), trans_a=True)

    final_ref[b, head, :, cols] = lax.fori_loop(0, e_ref.shape[1], step, init_ref[b, head, :, cols])


def _delta_states(t: TritonGlaTiling, passes: TritonStatePassTiling, chunk: int, k, w, u, g, init):
    """`(entry states [B, NC, H, Dk, Dv] (`state_dtype`), values U [B, T, H, Dv] (u's dtype), final states
    [B, H, Dk, Dv] float32)`."""
    batch, seq, heads, dk = k.shape
    dv = u.shape[-1]
    bv = min(passes.block_v, dv)
    args = (k, w, u, g, init)
    return call_pallas(
        _delta_states_kernel,
        t,
        passes.num_warps,
        (batch, heads, dv // bv),
        None,
        None,
        [
            out_struct((batch, seq // chunk, heads, dk, dv), t.state_dtype(k.dtype), *args),
            out_struct(u.shape, u.dtype, *args),
            out_struct(init.shape, F32, *args),
        ],
        "ejkernel_delta_states",
        chunk=chunk,
        mm=t.mm(k.dtype),
        bv=bv,
    )(*args)


def _delta_state_grads_kernel(
    q_ref, k_ref, w_ref, g_ref, do_ref, a_ref, e_ref, d_final_ref, dh_ref, d_init_ref, rs_ref, du_ref, **s
):
    """In reverse from `d = d_final`: store d (the chunk's exit-state gradient) and `Σ_v h_in ⊙ d`;
    `dU = scale Aᵀ do + (k ⊙ e^{g_C − g}) d` (stored); `d ← e^{g_C} d + scale (q ⊙ e^{g})ᵀ do − wᵀ dU`."""
    chunk, scale, mm, bv = s["chunk"], s["scale"], s["mm"], s["bv"]
    b, head, vt = (pl.program_id(i) for i in range(3))
    cols = tile_slice(vt, bv)
    num_chunks = dh_ref.shape[1]

    def step(i, d):
        c = num_chunks - 1 - i
        dh_ref[b, c, head, :, cols] = d.astype(dh_ref.dtype)
        rs_ref[vt, b, c, head, :] = jnp.sum(e_ref[b, c, head, :, cols].astype(F32) * d, axis=1)
        first = pl.multiple_of(c * chunk, chunk)
        rows = pl.ds(first, chunk)
        g, g_last = _chunk_gates(g_ref, b, head, first, chunk)
        do = do_ref[b, rows, head, cols].astype(mm)
        k = (k_ref[b, rows, head, :].astype(F32) * jnp.exp(g_last[None, :] - g)).astype(mm)
        du = scale * dot(a_ref[b, rows, head, :].astype(mm), do, trans_a=True) + dot(k, d.astype(mm))
        du_ref[b, rows, head, cols] = du
        q = (q_ref[b, rows, head, :].astype(F32) * jnp.exp(g)).astype(mm)
        d = jnp.exp(g_last) * d + scale * dot(q, do, trans_a=True)
        return d - dot(w_ref[b, rows, head, :].astype(mm), du.astype(mm), trans_a=True)

    d_init_ref[b, head, :, cols] = lax.fori_loop(0, num_chunks, step, d_final_ref[b, head, :, cols])


def _delta_state_grads(
    t: TritonGlaTiling, passes: TritonStatePassTiling, chunk: int, scale, q, k, w, g, do, a, e, d_final
):
    """`(exit-state gradients [B, NC, H, Dk, Dv] (e's dtype), initial-state gradients [B, H, Dk, Dv] float32,
    Σ_v h_in ⊙ d_exit [B, NC, H, Dk] float32, dU [B, T, H, Dv] float32)`."""
    batch, seq, heads, dk = q.shape
    dv = do.shape[-1]
    bv = min(passes.block_v, dv)
    chunks = seq // chunk
    args = (q, k, w, g, do, a, e, d_final)
    dh, d_init, rs, du = call_pallas(
        _delta_state_grads_kernel,
        t,
        passes.num_warps,
        (batch, heads, dv // bv),
        None,
        None,
        [
            out_struct(e.shape, e.dtype, *args),
            out_struct(d_final.shape, F32, *args),
            out_struct((dv // bv, batch, chunks, heads, dk), F32, *args),
            out_struct((batch, seq, heads, dv), F32, *args),
        ],
        "ejkernel_delta_state_grads",
        chunk=chunk,
        scale=scale,
        mm=t.mm(q.dtype),
        bv=bv,
    )(*args)
    return dh, d_init, jnp.sum(rs, axis=0), du


# ---- the differentiable whole ----


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def delta_chunked(
    tiling: TritonGlaTiling, passes: TritonStatePassTiling, scale: float, chunk: int, q, k, v, a, beta, init
):
    """`(out [B, T, H, Dv] in v's dtype, final states [B, H, Dk, Dv] float32)` of the chunked delta rule.

    q, k `[B, T, H, Dk]`, v `[B, T, H, Dv]` (T a multiple of `chunk`), a `[B, T, H]` float32 log gates per
    head, beta `[B, T, H]` float32, init `[B, H, Dk, Dv]` float32. Differentiable w.r.t. q, k, v, a, beta
    and init."""
    return _forward(tiling, passes, scale, chunk, q, k, v, a, init, *_wy(chunk, k, v, beta, a))[0]


def _forward(tiling, passes, scale, chunk, q, k, v, a, init, u, w):
    t = tiling.fit(q.shape[-1], v.shape[-1])
    g = cumulative_gates(t, chunk, a[..., None])
    w = w.astype(k.dtype)
    e, values, final = _delta_states(t, passes, chunk, k, w, u.astype(v.dtype), g, init)
    scores = head_scores(t, chunk, q, k, g)
    out = chunk_outputs(t, chunk, scale, q, values, g, e, a=scores)
    return (out, final), (w, g, e, values, scores)


def _fwd(tiling, passes, scale, chunk, q, k, v, a, beta, init):
    """The forward, keeping the WY transform's pullback (its inverses and products: not solved again)."""
    (u, w), wy_vjp = jax.vjp(functools.partial(_wy, chunk), k, v, beta, a)
    outputs, kept = _forward(tiling, passes, scale, chunk, q, k, v, a, init, u, w)
    return outputs, (q, k, wy_vjp, *kept)


def _bwd(tiling, passes, scale, chunk, residuals, cotangents):
    q, k, wy_vjp, w, g, e, values, scores = residuals
    d_out, d_final = cotangents
    t = tiling.fit(q.shape[-1], values.shape[-1])
    dh, d_init, rs, du = _delta_state_grads(t, passes, chunk, scale, q, k, w, g, d_out, scores, e, d_final)
    dq, dk, _, da = head_grads(t, chunk, scale, q, k, values, g, d_out, scores, e, dh, rs, values_grad=False)
    mm = t.mm(q.dtype)
    layout = _chunks(du, chunk)  # dw = −dU hᵀ with h the chunk's entry state
    dw = -jnp.einsum("nbhcv,bnhkv->nbhck", layout.to_chunks(du.astype(mm)), e.astype(mm), preferred_element_type=F32)
    dk_wy, dv, d_beta, da_wy = wy_vjp((du, layout.from_chunks(dw)))
    dk = (dk.astype(F32) + dk_wy).astype(k.dtype)
    return dq.astype(q.dtype), dk, dv, tiles_sum(da)[..., 0] + da_wy, d_beta, d_init


delta_chunked.defvjp(_fwd, _bwd)
