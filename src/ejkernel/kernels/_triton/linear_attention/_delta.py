"""The chunked delta rule (gated delta rule, kernel delta attention) in Pallas-Triton kernels, token layout.

Per chunk entered with state `h`, the WY transform (`wy_transform`'s, local to each chunk, in one kernel, two
from 64 tokens a chunk undifferentiated: `_wy_triton`, which keeps the inverse for the backward's pullback,
`_wy_pullback`; a differentiated call runs chunks of at most `RUN_CHUNK`) gives
`u = T (β v)` and `w = T (β e^{b} k)`, `T = (I + L)⁻¹`, and the chunk's effective values are `U = u − w h`. From
there the chunk is the gated recurrence with a gate per head and values U: outputs `scale · ((q ⊙ e^{g}) h + A U)`, exit
state `e^{g_C} h + (k ⊙ e^{g_C − g})ᵀ U` (`_gla` tells that story). So the delta rule runs GLA's kernels of a
gate per head (`cumulative_gates`, `head_scores`, `chunk_outputs`, `head_grads`) around two sequential passes
of its own, which carry U's dependence on h:

- forward (`_delta_states`): per chunk, `U = u − w h` (stored), then the exit state (undifferentiated, where
  `one_pass_outputs` says so, `_delta_outputs` makes the chunk's outputs there instead of storing h and U);
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

from ejkernel.kernels._common.linear_attention.inputs import L2_EPS, l2_normalize
from ejkernel.kernels._common.vma import out_struct
from ejkernel.kernels._triton._helpers import dot
from ejkernel.kernels._triton.linear_attention._gla_backward import head_grads
from ejkernel.kernels._triton.linear_attention._gla_common import (
    F32,
    SUB,
    TritonGlaTiling,
    call_pallas,
    iota,
    masked_exp,
    pair_decays,
    tile_slice,
    tiles_sum,
)
from ejkernel.kernels._triton.linear_attention._gla_forward import chunk_outputs, cumulative_gates, head_scores
from ejkernel.kernels._triton.linear_attention._state_passes import TritonStatePassTiling, matmul

# ---- the WY transform and its pullback, per chunk and head in a kernel each ----


def as_loaded(x, l2norm: bool, dtype, scale: float = 1.0):
    """Rows `x` `[n, D]` as the products take them: L2-normalised along D where `l2norm` (`l2_normalize`'s float32
    arithmetic: the kernels normalise q and k as they load them), times `scale`, rounded to `dtype`."""
    if not l2norm and scale == 1.0:
        return x.astype(dtype)
    x = x.astype(F32)
    if l2norm:
        x = x * lax.rsqrt(jnp.sum(x * x, axis=1, keepdims=True) + L2_EPS)
    return (x * scale).astype(dtype)


def _unit_lower_inverse(lower):
    """`(I + lower)⁻¹` of a strictly lower triangular `[SUB, SUB]` float32 tile, by forward substitution: row r
    of the inverse is `e_r − lower[r] @ inverse`, where only the rows before r (final already) meet lower[r]."""
    rows = iota(lower.shape, 0)
    inverse = (rows == iota(lower.shape, 1)).astype(F32)
    for r in range(1, lower.shape[0]):
        row = jnp.sum(jnp.where(rows == r, lower, 0.0), axis=0)  # lower[r, s], zero for s >= r
        update = jnp.sum(row[:, None] * inverse, axis=0)  # lower[r] @ inverse
        inverse = jnp.where(rows == r, inverse - update[None, :], inverse)
    return inverse


def _inverse_blocks(keys, betas, gates) -> dict:
    """`(I + L)⁻¹` of one chunk and head, `wy_transform`'s system, as its `[SUB, SUB]` float32 blocks `(i, j)`, j <=
    i, from lists over the chunk's blocks of SUB rows: keys `[SUB, Dk]` in the products' dtype, betas and
    cumulative log gates `[SUB]` float32.

    `L` block (i, j), j <= i: `beta_t (k_t · k_s) e^{g_t − g_s}` for s < t. Its inverse is block lower triangular:
    the diagonal blocks' by forward substitution, then `X_ij = −X_ii Σ_{j<=m<i} L_im X_mj` (float32 products)."""
    blocks = len(keys)
    strict = iota((SUB, SUB), 0) > iota((SUB, SUB), 1)
    system = {}
    for i in range(blocks):
        for j in range(i + 1):
            keep = strict if i == j else True
            decay = masked_exp(gates[i][:, None] - gates[j][None, :], keep)
            system[i, j] = betas[i][:, None] * dot(keys[i], keys[j], trans_b=True) * decay
    inverse = {(i, i): _unit_lower_inverse(system[i, i]) for i in range(blocks)}
    for j in range(blocks):
        for i in range(j + 1, blocks):
            inner = sum(dot(system[i, m], inverse[m, j]) for m in range(j, i))
            inverse[i, j] = -dot(inverse[i, i], inner)
    return inverse


def _scaled(betas, gates, keys, values):
    """`(β v, β e^{g} k)` rounded to v's and k's dtypes: the right-hand sides of u and w."""
    scaled_values = (betas[:, None] * values.astype(F32)).astype(values.dtype)
    scaled_keys = ((betas * jnp.exp(gates))[:, None] * keys.astype(F32)).astype(keys.dtype)
    return scaled_values, scaled_keys


def _store_inverse(inverse: dict, inverse_ref) -> None:
    """`_inverse_blocks`'s blocks into `inverse_ref` `[C, C]` (zeros above the diagonal blocks), in its dtype."""
    blocks = 1 + max(i for i, _ in inverse)
    rows = [pl.ds(i * SUB, SUB) for i in range(blocks)]
    for i in range(blocks):
        for j in range(blocks):
            block = inverse[i, j] if j <= i else jnp.zeros((SUB, SUB), F32)
            inverse_ref[rows[i], rows[j]] = block.astype(inverse_ref.dtype)


def wy_blocks(keys, values, betas, gates, u_ref, w_ref, inverse_ref=None):
    """One chunk of one head's WY transform in one program (lists over its blocks of SUB rows, as `_inverse_blocks`;
    values `[SUB, Dv]` in the products' dtype): `_inverse_blocks`, then `u_i = Σ_j X_ij (beta v)_j`, `w_i = Σ_j X_ij
    (beta e^{g} k)_j` into their refs (and the inverse, float32, into `inverse_ref` where given). Products in the
    keys' and values' dtypes, accumulated in float32 and stored in u's and w's dtype (what the state pass reads), as
    `wy_transform` computes them."""
    blocks = len(keys)
    rows = [pl.ds(i * SUB, SUB) for i in range(blocks)]
    inverse = _inverse_blocks(keys, betas, gates)
    scaled = [_scaled(betas[j], gates[j], keys[j], values[j]) for j in range(blocks)]
    for i in range(blocks):
        u = sum(dot(inverse[i, j].astype(values[j].dtype), scaled[j][0]) for j in range(i + 1))
        w = sum(dot(inverse[i, j].astype(keys[j].dtype), scaled[j][1]) for j in range(i + 1))
        u_ref[rows[i], :], w_ref[rows[i], :] = u.astype(u_ref.dtype), w.astype(w_ref.dtype)
    if inverse_ref is not None:
        _store_inverse(inverse, inverse_ref)


def _wy_apply(inverse, keys, values, betas, gates, u_ref, w_ref) -> None:
    """u and w of one chunk and head from its stored inverse X `[C, C]`, a program of their own (`_split_wy`): `u = X
    (beta v)`, `w = X (beta e^{g} k)` as one `[C, C] x [C, D]` product each, rounded as `wy_blocks` rounds them
    (keys `[C, Dk]`, values `[C, Dv]` in the products' dtypes; betas and cumulative gates `[C]` float32)."""
    scaled_values, scaled_keys = _scaled(betas, gates, keys, values)
    u_ref[...] = dot(inverse.astype(values.dtype), scaled_values).astype(u_ref.dtype)
    w_ref[...] = dot(inverse.astype(keys.dtype), scaled_keys).astype(w_ref.dtype)


WY_WARPS = 2  # the one-kernel transform and _split_wy's inverse: cross-warp reductions (8 warps: twice the time)
APPLY_WARPS = 4  # _split_wy's products (H200, chunk 64: 0.5204 ms with the inverse's kernel, 0.5210 at 8)


def _split_wy(chunk: int) -> bool:
    """Whether a chunk's WY transform runs as two kernels, the inverse (`_store_inverse`) then the products
    (`_wy_apply`), rather than all in one program (`wy_blocks`): from 64 tokens, where one program holding every
    block of the system spills. H200, 8 x 2048 tokens, H 32, D 128, bf16 (`exp/s56_wy.py` at `ffe946a`): chunk 64,
    one kernel 0.80-0.85 ms, two 0.52; chunk 32, one kernel 0.346 ms, two 0.417."""
    return chunk >= 64


def _block_gates(a_ref, blocks: int):
    """`(rows, cumulative log gates)`: the chunk's blocks of SUB rows and each block's `[SUB]` gates, summed from
    the chunk's first token (`a_ref` `[C]`, the log gates per token)."""
    rows = [pl.ds(i * SUB, SUB) for i in range(blocks)]
    gates, total = [], jnp.zeros((), F32)
    for r in rows:
        logs = a_ref[r]
        gates.append(jnp.cumsum(logs) + total)
        total = total + jnp.sum(logs)
    return rows, gates


def _wy_kernel(k_ref, v_ref, beta_ref, a_ref, u_ref, w_ref, *inverse_ref, blocks: int, l2norm: bool):
    """`wy_blocks` of one chunk and head from its `[C, ·]` blocks of k (normalised as loaded where `l2norm`, in w's
    dtype), v, beta and the log gates `a` per token."""
    rows, gates = _block_gates(a_ref, blocks)
    keys = [as_loaded(k_ref[r, :], l2norm, w_ref.dtype) for r in rows]
    values = [v_ref[r, :] for r in rows]
    wy_blocks(keys, values, [beta_ref[r] for r in rows], gates, u_ref, w_ref, *inverse_ref)


def _wy_inverse_kernel(k_ref, beta_ref, a_ref, inverse_ref, *, blocks: int):
    """`_inverse_blocks` of one chunk and head, stored `[C, C]`."""
    rows, gates = _block_gates(a_ref, blocks)
    _store_inverse(_inverse_blocks([k_ref[r, :] for r in rows], [beta_ref[r] for r in rows], gates), inverse_ref)


def _wy_apply_kernel(inverse_ref, k_ref, v_ref, beta_ref, a_ref, u_ref, w_ref):
    """`_wy_apply` of one chunk and head."""
    _wy_apply(inverse_ref[...], k_ref[...], v_ref[...], beta_ref[...], jnp.cumsum(a_ref[...]), u_ref, w_ref)


def _chunk_specs(chunk: int):
    """`(rows(width), gate)`: the BlockSpecs of a (chunk, batch row, head) program's `[C, width]` rows of a
    `[B, T, H, width]` array and its `[C]` of a `[B, T, H]` one."""
    rows = lambda width: pl.BlockSpec((None, chunk, None, width), lambda c, b, h: (b, c, h, 0))
    return rows, pl.BlockSpec((None, chunk, None), lambda c, b, h: (b, c, h))


def _wy_triton(t: TritonGlaTiling, chunk: int, k, v, beta, a, with_inverse: bool = False, l2norm: bool = False):
    """`wy_transform`'s `(u, w)` of every chunk, per chunk and head in one Pallas-Triton kernel (two where
    `_split_wy`): k, v `[B, T, H, D]`, beta and the log gates `a` `[B, T, H]` (summed within chunks here); u and w
    `[B, T, H, D]` in v's and k's dtype, and with `with_inverse` the inverse `[B, T, H, C]` float32 too (row t of
    its chunk's `(I + L)⁻¹`, for the pullback). On an H200 (8 x 2048 tokens, H 32, D 128, chunk 64) it took 0.66 ms
    with float32 u and w where XLA's WY transform took 1.36 (chunked copies of the tensors and small batched
    products); stored in the inputs' dtype, u and w save the float32 copies and the two casts after them (0.19 ms at
    chunk 32, session 56). Split (undifferentiated only: the backward runs chunks of at most `RUN_CHUNK`), the
    inverse goes through memory in the wider of k's and v's dtypes (the products round it to theirs). `l2norm` (one
    kernel only): k comes raw and is L2-normalised as loaded, then taken in v's dtype (w too)."""
    batch, seq, heads, _ = k.shape
    rows, gate = _chunk_specs(chunk)
    grid, blocks = (seq // chunk, batch, heads), chunk // SUB
    inverse_shape = (*k.shape[:-1], chunk)
    w_dtype = v.dtype if l2norm else k.dtype
    uw = [rows(v.shape[-1]), rows(k.shape[-1])], [out_struct(v.shape, v.dtype, k), out_struct(k.shape, w_dtype, k)]
    if _split_wy(chunk):
        assert not (l2norm or with_inverse), "the split WY transform is undifferentiated and takes k normalised"
        inverse = call_pallas(
            _wy_inverse_kernel,
            t,
            WY_WARPS,
            grid,
            [rows(k.shape[-1]), gate, gate],
            rows(chunk),
            out_struct(inverse_shape, jnp.promote_types(k.dtype, v.dtype), k),
            "ejkernel_delta_wy_inverse",
            blocks=blocks,
        )(k, beta, a)
        specs = [rows(chunk), rows(k.shape[-1]), rows(v.shape[-1]), gate, gate]
        return call_pallas(_wy_apply_kernel, t, APPLY_WARPS, grid, specs, *uw, "ejkernel_delta_wy_apply")(
            inverse, k, v, beta, a
        )
    specs, outs = [rows(k.shape[-1]), rows(v.shape[-1]), gate, gate], uw
    if with_inverse:
        outs = [outs[0] + [rows(chunk)], outs[1] + [out_struct(inverse_shape, F32, k)]]
    name = "ejkernel_delta_wy"
    return call_pallas(_wy_kernel, t, WY_WARPS, grid, specs, *outs, name, blocks=blocks, l2norm=l2norm)(k, v, beta, a)


def _wy_grads_kernel(
    k_ref, v_ref, beta_ref, a_ref, x_ref, du_ref, e_ref, dk_ref, dv_ref, d_beta_ref, da_ref, *, mm, precise
):
    """One chunk of one head: the WY transform's gradients from the inverse `X` it kept and the cotangents of
    U = u − w h (dU, and dw = −dU hᵀ from the entry state h, formed here). With `a = β v`, `b = β e^{g} k`,
    `u = X a`, `w = X b`: `dX = du aᵀ + dw bᵀ`, `da = Xᵀ du`, `db = Xᵀ dw`, and `dL = −Xᵀ dX Xᵀ` on the strict
    lower triangle, whence k (through `k kᵀ`), β and the cumulative gates g (through `e^{g_t − g_s}`); the log
    gates by g's reverse sums. Products as XLA's WY transform and its autodiff took them: in k's and v's dtype
    where the forward's were, dw's in `mm`, the rest float32 (full precision if `precise`, else TF32, as XLA's
    on a GPU)."""
    product = functools.partial(matmul, precise=precise)
    k, v = k_ref[...], v_ref[...]
    k32, v32 = k.astype(F32), v.astype(F32)
    beta, gates = beta_ref[...], jnp.cumsum(a_ref[...])
    x, du = x_ref[...], du_ref[...]
    dw = -dot(du.astype(mm), e_ref[...].astype(mm), trans_b=True)
    entry = beta * jnp.exp(gates)
    a_rows = (beta[:, None] * v32).astype(v.dtype).astype(F32)
    b_rows = (entry[:, None] * k32).astype(k.dtype).astype(F32)
    d_x = product(du, a_rows, trans_b=True) + product(dw, b_rows, trans_b=True)
    d_a = product(x.astype(v.dtype).astype(F32), du, trans_a=True)
    d_b = product(x.astype(k.dtype).astype(F32), dw, trans_a=True)
    shape = x.shape
    lower = masked_exp(gates[:, None] - gates[None, :], iota(shape, 0) > iota(shape, 1))
    d_lower = -product(product(x, d_x, trans_a=True), x, trans_b=True) * lower  # dL ⊙ e^{g_t − g_s}
    scores = dot(k, k, trans_b=True)
    d_scores = beta[:, None] * d_lower
    pairs = d_scores * scores  # dL ⊙ L: d g_t from row t, minus d g_s from column s
    d_entry = jnp.sum(k32 * d_b, axis=1)
    d_gates = d_entry * entry + jnp.sum(pairs, axis=1) - jnp.sum(pairs, axis=0)
    dk_ref[...] = entry[:, None] * d_b + product(d_scores + d_scores.T, k32)
    dv_ref[...] = (beta[:, None] * d_a).astype(dv_ref.dtype)
    d_beta = jnp.sum(v32 * d_a, axis=1) + d_entry * jnp.exp(gates) + jnp.sum(d_lower * scores, axis=1)
    d_beta_ref[...] = d_beta.astype(d_beta_ref.dtype)
    da_ref[...] = (jnp.sum(d_gates) - jnp.cumsum(d_gates) + d_gates).astype(da_ref.dtype)  # g = cumsum(a)


def _wy_pullback(t: TritonGlaTiling, chunk: int, k, v, beta, a, inverse, du, e):
    """`(dk [B, T, H, Dk] float32, dv, dbeta, da)` of `_wy_triton`'s `(u, w)` in one kernel per chunk and head,
    from the inverse it kept (`[B, T, H, C]`), dU `[B, T, H, Dv]` float32 and the chunks' entry states e
    `[B, NC, H, Dk, Dv]` (dw = −dU hᵀ), rather than back through the inverse's construction. On an H200
    (B 2, T 16384, H 16, D 128, bf16) the gated delta rule's forward+backward took 6.38 ms with it at 4 warps
    (6.81 at 8), 8.15 with XLA's pullback (chunked copies and batched products, about 3 ms of kernels)."""
    batch, seq, heads, dk = k.shape
    dv = v.shape[-1]
    rows, gate = _chunk_specs(chunk)
    state = pl.BlockSpec((None, None, None, dk, dv), lambda c, b, h: (b, c, h, 0, 0))
    specs = [rows(dk), rows(dv), gate, gate, rows(chunk), rows(dv), state], [rows(dk), rows(dv), gate, gate]
    shapes = [(k.shape, F32), (v.shape, v.dtype), (beta.shape, beta.dtype), (a.shape, a.dtype)]
    outs = [out_struct(shape, dtype, k, v, beta, a, inverse, du, e) for shape, dtype in shapes]
    grid = (seq // chunk, batch, heads)
    kernel = functools.partial(_wy_grads_kernel, mm=t.mm(k.dtype), precise=t.precise)
    return call_pallas(kernel, t, 4, grid, *specs, outs, "ejkernel_delta_wy_grads")(k, v, beta, a, inverse, du, e)


# ---- the sequential passes (one program per batch row, head and tile of value columns) ----


def _chunk_gates(g_ref, b, head, first: int, chunk: int):
    """`(g [C, 1], g at the chunk's last row [1])` of the chunk at `first`."""
    one = pl.ds(0, 1)
    return g_ref[b, pl.ds(first, chunk), head, one], g_ref[b, first + chunk - 1, head, one]


def chunk_values(u, w, h, mm):
    """`U = u − w h` `[C, bv]` float32: a chunk's effective values from its entry state h (`[Dk, bv]` float32)."""
    return u.astype(F32) - dot(w.astype(mm), h.astype(mm))


def chunk_exit(keys, g, g_last, values, h, mm):
    """The chunk's exit state `e^{g_C} h + (k ⊙ e^{g_C − g})ᵀ U` (g `[C, 1]` cumulative, g_last `[1]` its last)."""
    k = (keys.astype(F32) * jnp.exp(g_last[None, :] - g)).astype(mm)
    return jnp.exp(g_last) * h + dot(k, values.astype(mm), trans_a=True)


def pass_outputs(q, keys, g, g_row, values, h, *, mm, state_dtype, values_dtype):
    """A chunk's outputs `(q ⊙ e^g) h + (q kᵀ ⊙ D) U` (unscaled) made in the state pass from h and U where they sit,
    rounded as stored copies for an output kernel would be (h in `state_dtype`, U in `values_dtype`); g `[C, 1]`,
    g_row the same gates `[C]`."""
    scores = dot(q.astype(mm), keys.astype(mm), trans_b=True) * pair_decays(g, g_row[None, :])
    decayed = (q.astype(F32) * jnp.exp(g)).astype(mm)
    entry = h.astype(state_dtype).astype(mm)
    return dot(decayed, entry) + dot(scores.astype(mm), values.astype(values_dtype).astype(mm))


def _delta_chunk(k_ref, w_ref, u_ref, g_ref, b, head, cols, c, h, *, chunk: int, mm, l2norm: bool = False):
    """Chunk `c` of batch row `b` and `head` from its entry state h (this program's value columns `cols`): `(rows, g
    [C, 1], keys [C, Dk], U [C, bv] float32, exit state)`, `U = u − w h`, `h ← e^{g_C} h + (k ⊙ e^{g_C − g})ᵀ U`;
    the keys normalised as loaded where `l2norm` (in w's dtype)."""
    first = pl.multiple_of(c * chunk, chunk)
    rows = pl.ds(first, chunk)
    g, g_last = _chunk_gates(g_ref, b, head, first, chunk)
    values = chunk_values(u_ref[b, rows, head, cols], w_ref[b, rows, head, :], h, mm)
    keys = as_loaded(k_ref[b, rows, head, :], l2norm, w_ref.dtype)
    return rows, g, keys, values, chunk_exit(keys, g, g_last, values, h, mm)


def _delta_states_kernel(k_ref, w_ref, u_ref, g_ref, init_ref, e_ref, values_ref, final_ref, *, chunk, mm, bv):
    """Per chunk (`_delta_chunk`): store h (its entry state) and U, for the output kernel and the backward."""
    b, head, vt = (pl.program_id(i) for i in range(3))
    cols = tile_slice(vt, bv)

    def step(c, h):
        e_ref[b, c, head, :, cols] = h.astype(e_ref.dtype)
        rows, _, _, values, h = _delta_chunk(k_ref, w_ref, u_ref, g_ref, b, head, cols, c, h, chunk=chunk, mm=mm)
        values_ref[b, rows, head, cols] = values.astype(values_ref.dtype)
        return h

    final_ref[b, head, :, cols] = lax.fori_loop(0, e_ref.shape[1], step, init_ref[b, head, :, cols])


def _delta_outputs_kernel(q_ref, k_ref, w_ref, u_ref, g_ref, g_row_ref, init_ref, o_ref, final_ref, **s):
    """The undifferentiated forward in one pass: per chunk (`_delta_chunk`), its outputs `scale ((q ⊙ e^g) h +
    (q kᵀ ⊙ D) U)` from h and U where they sit, rounded as `_delta_states_kernel` stores them for the output
    kernel (h in the state dtype, U in u's): neither goes to memory. q and k normalised as loaded where
    `l2norm`."""
    chunk, mm, bv, l2norm = s["chunk"], s["mm"], s["bv"], s["l2norm"]
    b, head, vt = (pl.program_id(i) for i in range(3))
    cols = tile_slice(vt, bv)

    def step(c, h):
        rows, g, keys, values, h_next = _delta_chunk(
            k_ref, w_ref, u_ref, g_ref, b, head, cols, c, h, chunk=chunk, mm=mm, l2norm=l2norm
        )
        q, g_row = q_ref[b, rows, head, :], g_row_ref[b, head, rows]
        q = as_loaded(q, l2norm, w_ref.dtype)
        out = pass_outputs(q, keys, g, g_row, values, h, mm=mm, state_dtype=s["state_dtype"], values_dtype=u_ref.dtype)
        o_ref[b, rows, head, cols] = (s["scale"] * out).astype(o_ref.dtype)
        return h_next

    final_ref[b, head, :, cols] = lax.fori_loop(0, q_ref.shape[1] // chunk, step, init_ref[b, head, :, cols])


def wide_tile(dk: int) -> tuple[int, int, int]:
    """`(value columns, warps, stages)` of the widest forward pass tile: a state tile of 128 x 128 floats."""
    return 16384 // dk, 8, 3


def forward_pass_defaults(dk: int, dv: int, rows: int) -> tuple[int, int, int]:
    """`(value columns a program, warps, stages)` of the forward state pass (dense and ragged) over `rows` (batch
    rows or requests) x heads unless the call sets them: the widest state tile of at most 128 x 128 floats (128, 64
    or 32 columns at Dk 128) that still gives 256 programs (two an H200 SM), else 32 columns. H200, Dk = Dv = 128,
    bf16 (`exp/s56_state_pass.py`, `exp/s56_training.py`): 8 x 2048 tokens, H 32 (256 rows), chunk 32, 0.392 ms at
    128 columns on 8 warps and 3 stages against 0.447 at 64 on 4 and 2, 0.687 at 32 on 4 and 2 (fla's
    `chunk_gated_delta_rule_fwd_kernel_h`: 0.228 ms at chunk 64); B 2 x 16384, H 16 (32 rows), forward+backward
    6.11 ms at 32 columns, 6.73 at 128."""
    for columns, warps, stages in (wide_tile(dk), (64, 4, 2)):
        if columns >= 64 and rows * -(-dv // columns) >= 256:
            return columns, warps, stages
    return 32, 4, 2


def _delta_states(t: TritonGlaTiling, passes: TritonStatePassTiling, chunk: int, k, w, u, g, init):
    """`(entry states [B, NC, H, Dk, Dv] (`state_dtype`), values U [B, T, H, Dv] (u's dtype), final states
    [B, H, Dk, Dv] float32)`."""
    batch, seq, heads, dk = k.shape
    dv = u.shape[-1]
    passes = passes.resolved(dv, *forward_pass_defaults(dk, dv, batch * heads))
    bv = passes.block_v
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
        stages=passes.num_stages,
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


def _delta_outputs(
    t: TritonGlaTiling, passes: TritonStatePassTiling, chunk: int, scale, l2norm: bool, q, k, w, u, g, init
):
    """`(out [B, T, H, Dv] (u's dtype), final states [B, H, Dk, Dv] float32)` of the undifferentiated forward in
    `_delta_outputs_kernel`; q and k raw where `l2norm`. Unless the call sets them, the widest state tile of at most
    128 x 128 floats, 8 warps and 3 stages, at any number of programs: H200 (`exp/s58_one_pass_rows.py`), 4 x 4096
    tokens, H 32, 0.863 ms against 0.908 on the state pass's default for its 128 rows (64 columns, 4 warps, 2
    stages)."""
    batch, _, heads, dk = k.shape
    dv = u.shape[-1]
    passes = passes.resolved(dv, *wide_tile(dk))
    args = (q, k, w, u, g, jnp.swapaxes(g[..., 0], 1, 2), init)
    return call_pallas(
        _delta_outputs_kernel,
        t,
        passes.num_warps,
        (batch, heads, dv // passes.block_v),
        None,
        None,
        [out_struct(u.shape, u.dtype, *args), out_struct(init.shape, F32, *args)],
        "ejkernel_delta_outputs",
        stages=passes.num_stages,
        chunk=chunk,
        mm=t.mm(u.dtype),
        bv=passes.block_v,
        scale=scale,
        state_dtype=t.state_dtype(u.dtype),
        l2norm=l2norm,
    )(*args)


def _delta_state_grads(
    t: TritonGlaTiling, passes: TritonStatePassTiling, chunk: int, scale, q, k, w, g, do, a, e, d_final
):
    """`(exit-state gradients [B, NC, H, Dk, Dv] (e's dtype), initial-state gradients [B, H, Dk, Dv] float32,
    Σ_v h_in ⊙ d_exit [B, NC, H, Dk] float32, dU [B, T, H, Dv] float32)`."""
    batch, seq, heads, dk = q.shape
    dv = do.shape[-1]
    passes = passes.resolved(dv)
    bv = passes.block_v
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
        stages=passes.num_stages,
        chunk=chunk,
        scale=scale,
        mm=t.mm(q.dtype),
        bv=bv,
    )(*args)
    return dh, d_init, jnp.sum(rs, axis=0), du


# ---- the differentiable whole ----


# The largest chunk a differentiated call, and an undifferentiated one in one pass (`one_pass_outputs`), runs: a larger
# one asked for (EasyDeL trains at 64) runs as this, the chunk changing only the rounding (T, a multiple of the chunk
# asked for, is one of this too). H200, Dk = Dv = 128, bf16 (`exp/s58_chunks.py`), chunk 32 against 64:
# forward+backward 6.17 / 6.68 ms at B 2 x 16384 H 16, 4.22 / 4.70 at B 1 x 16384 H 16, 1.11 / 1.22 at B 1 x 4096
# H 16; forward at 8 x 2048 H 32 (one pass) 0.868 / 1.232. Without the one pass a forward asked for 64 keeps it
# (B 2 x 16384 H 16: 1.72 ms at 32 against 1.55 at 64; 10-16% faster at 64 at every such shape measured).
RUN_CHUNK = 32


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3, 4))
def delta_chunked(
    tiling: TritonGlaTiling,
    passes: TritonStatePassTiling,
    scale: float,
    chunk: int,
    l2norm: bool,
    q,
    k,
    v,
    a,
    beta,
    init,
):
    """`(out [B, T, H, Dv] in v's dtype, final states [B, H, Dk, Dv] float32)` of the chunked delta rule.

    q, k `[B, T, H, Dk]`, v `[B, T, H, Dv]` (T a multiple of `chunk`, which runs as at most `RUN_CHUNK` where
    that is faster), a `[B, T, H]` float32 log gates per head, beta `[B, T, H]` float32, init `[B, H, Dk, Dv]`
    float32. With `l2norm`, q and k come raw and are L2-normalised here (`l2_normalize`, then in v's dtype): as the
    kernels load them where the forward runs in one pass, else by XLA first. Differentiable w.r.t. q, k, v, a, beta
    and init."""
    t = tiling.fit(q.shape[-1], v.shape[-1])
    batch, _, heads, _ = k.shape
    if one_pass_outputs(batch * heads):
        one_pass = min(chunk, RUN_CHUNK)
        u, w = _wy_triton(tiling, one_pass, k, v, beta, a, l2norm=l2norm)
        g = cumulative_gates(t, one_pass, a[..., None])
        return _delta_outputs(t, passes, one_pass, scale, l2norm, q, k, w, u, g, init)
    q, k = _normalised(q, k, v.dtype) if l2norm else (q, k)
    u, w = _wy_triton(tiling, chunk, k, v, beta, a)
    return _forward(tiling, passes, scale, chunk, q, k, v, a, init, u, w, differentiated=False)[0]


def _normalised(q, k, dtype):
    """q and k L2-normalised by XLA (`l2_normalize`) and rounded to `dtype`: the kernels' q and k."""
    return l2_normalize(q).astype(dtype), l2_normalize(k).astype(dtype)


def one_pass_outputs(rows: int) -> bool:
    """Whether the undifferentiated forward over `rows` (batch rows x heads) makes its outputs inside the state pass
    (`_delta_outputs`, at chunks of at most `RUN_CHUNK`) rather than storing entry states and U for the output
    kernel. H200, Dk = Dv = 128, bf16, ms (`exp/s58_one_pass_rows.py`, session 59; two kernels at chunk 64 against
    the one pass): 256 rows (8 x 2048, H 32) 0.855 against 1.23; 128 rows (4 x 4096, H 32) 0.863 against 1.243;
    64 rows (2 x 8192, H 32) 1.347 against 1.429; 32 rows (2 x 16384, H 16) 2.29 against 1.561: there the outputs'
    work holds up the sequential pass."""
    return rows >= 64


def _forward(tiling, passes, scale, chunk, q, k, v, a, init, u, w, *, differentiated: bool):
    """`((out, final), residuals)` through the stored entry states and U. Undifferentiated, the output kernel makes
    each chunk's scores itself (`TritonGlaTiling.fuse_head_scores`) and no residuals are kept."""
    t = tiling.fit(q.shape[-1], v.shape[-1])
    g = cumulative_gates(t, chunk, a[..., None])
    e, values, final = _delta_states(t, passes, chunk, k, w, u, g, init)
    if not differentiated and t.fuse_head_scores:
        return (chunk_outputs(t, chunk, scale, q, values, g, e, k=k), final), None
    scores = head_scores(t, chunk, q, k, g)
    out = chunk_outputs(t, chunk, scale, q, values, g, e, a=scores)
    return (out, final), (w, g, e, values, scores)


def _fwd(tiling, passes, scale, chunk, l2norm, q, k, v, a, beta, init):
    """The forward at chunks of at most `RUN_CHUNK`, keeping what the WY transform's pullback reads (its inverse: not
    solved again); q and k kept raw where `l2norm` (the backward normalises them again, with its pullback)."""
    chunk = min(chunk, RUN_CHUNK)
    raw = (q, k)
    q, k = _normalised(q, k, v.dtype) if l2norm else raw
    u, w, inverse = _wy_triton(tiling, chunk, k, v, beta, a, with_inverse=True)
    outputs, kept = _forward(tiling, passes, scale, chunk, q, k, v, a, init, u, w, differentiated=True)
    return outputs, (*raw, v, beta, a, inverse, *kept)


def _bwd(tiling, passes, scale, chunk, l2norm, residuals, cotangents):
    chunk = min(chunk, RUN_CHUNK)  # as `_fwd`
    q, k, v, beta, a, inverse, w, g, e, values, scores = residuals
    d_out, d_final = cotangents
    if l2norm:
        (q, k), normalised_pullback = jax.vjp(functools.partial(_normalised, dtype=v.dtype), q, k)
    t = tiling.fit(q.shape[-1], values.shape[-1])
    dh, d_init, rs, du = _delta_state_grads(t, passes, chunk, scale, q, k, w, g, d_out, scores, e, d_final)
    dq, dk, _, da = head_grads(t, chunk, scale, q, k, values, g, d_out, scores, e, dh, rs, values_grad=False)
    dk_wy, dv, d_beta, da_wy = _wy_pullback(t, chunk, k, v, beta, a, inverse, du, e)
    dq, dk = dq.astype(q.dtype), (dk.astype(F32) + dk_wy).astype(k.dtype)
    if l2norm:
        dq, dk = normalised_pullback((dq, dk))
    return dq, dk, dv, tiles_sum(da)[..., 0] + da_wy, d_beta, d_init


delta_chunked.defvjp(_fwd, _bwd)
