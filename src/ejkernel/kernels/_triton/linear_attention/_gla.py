"""The chunked gated linear recurrence (GLA, lightning, recurrent) in fused Pallas-Triton kernels.

One program per (chunk, row, head) computes its chunk's outputs, or all its gradients, without ever
writing the `[C, C]` intra-chunk weights to memory. The weights use per-key-channel cumulative gates
`b` (`[C, Dk]`, summed from the chunk start) through sub-chunks of `SUB` rows: between sub-chunks,
`(q_t e^{b_t − r})·(k_s e^{r − b_s})` with `r` the gate at the end of the sub-chunk before the query's
(the boundary product of `ejkernel.kernels._common.linear_attention.gated_scores`; a matmul; both
exponents <= 0 for decaying gates); inside a sub-chunk, one key row at a time, exactly. The sequential state passes are
`_kernels.exit_states` / `_kernels.entry_grads`.

Recurrence per chunk, entered with state `h`: `o = (q ⊙ e^{b}) h + A v`, exit state
`e^{b_C} ⊙ h + (k ⊙ e^{b_C − b})ᵀ v`, `A[t,s] = Σ_d q_td k_sd e^{b_td − b_sd}` for `s <= t`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from ejkernel.kernels._common.linear_attention import ChunkParts
from ejkernel.kernels._common.vma import out_struct
from ejkernel.kernels._triton.linear_attention._kernels import Tiling, entry_grads, exit_states, matmul
from ejkernel.kernels._xla.linear_attention._scan import entry_states, init_grad

SUB = 16  # tokens per sub-chunk of the intra-chunk product


class _Chunk:
    """Loads of one program's chunk: sub-chunk `i` of an array, one row, the boundary gate before sub-chunk `i`."""

    def __init__(self, refs: dict, precise: bool):
        self.refs = refs
        self.at = (pl.program_id(0), pl.program_id(1), pl.program_id(2))
        self.dot = functools.partial(matmul, precise=precise)

    def block(self, name: str, i: int):
        return self.refs[name][(*self.at, pl.ds(i * SUB, SUB), slice(None))]

    def row(self, name: str, t):
        return self.refs[name][(*self.at, t, slice(None))]

    def boundary(self, i: int):
        """`r_i`: the cumulative gate at the last row of sub-chunk i − 1 (zeros for the first)."""
        dk = self.refs["b"].shape[-1]
        return self.row("b", i * SUB - 1) if i else jnp.zeros((dk,), jnp.float32)

    def store(self, name: str, i: int, value):
        self.refs[name][(*self.at, pl.ds(i * SUB, SUB), slice(None))] = value


def _index():
    rows = jnp.arange(SUB, dtype=jnp.int32)
    return rows[:, None], rows[None, :]


def _from_row(b_block, b_s, s):
    """`e^{b_t − b_s}` for the rows t >= s of a sub-chunk (0 above): exponents <= 0 for decaying gates."""
    below = jnp.arange(SUB, dtype=jnp.int32)[:, None] >= s
    return jnp.where(below, jnp.exp(jnp.where(below, b_block - b_s[None, :], 0.0)), 0.0)


def _diagonal_scores(ch: _Chunk, i: int, q_i, b_i):
    """`A` restricted to sub-chunk i (queries and keys), `[SUB, SUB]`, one key column at a time."""
    _, col = _index()

    def column(s, scores):
        t = i * SUB + s
        weights = jnp.sum(q_i * ch.row("k", t)[None, :] * _from_row(b_i, ch.row("b", t), s), axis=1)
        return scores + jnp.where(col == s, weights[:, None], 0.0)

    return lax.fori_loop(0, SUB, column, jnp.zeros((SUB, SUB), jnp.float32))


def _off_diagonal_scores(ch: _Chunk, i: int, j: int, q_i, b_i):
    """`A` for queries of sub-chunk i and keys of an earlier sub-chunk j, `[SUB, SUB]`."""
    r = ch.boundary(i)[None, :]
    return ch.dot(q_i * jnp.exp(b_i - r), ch.block("k", j) * jnp.exp(r - ch.block("b", j)), trans_b=True)


def _output_kernel(q_ref, k_ref, v_ref, b_ref, h_ref, o_ref, *, num_sub: int, precise: bool):
    ch = _Chunk(dict(q=q_ref, k=k_ref, v=v_ref, b=b_ref, o=o_ref), precise)
    dot, h = ch.dot, h_ref[ch.at]
    for i in range(num_sub):
        q_i, b_i = ch.block("q", i), ch.block("b", i)
        out = dot(q_i * jnp.exp(b_i), h) + dot(_diagonal_scores(ch, i, q_i, b_i), ch.block("v", i))
        for j in range(i):
            out += dot(_off_diagonal_scores(ch, i, j, q_i, b_i), ch.block("v", j))
        ch.store("o", i, out)


def _grads_kernel(
    q_ref, k_ref, v_ref, b_ref, h_ref, do_ref, g_ref, dq_ref, dk_ref, dv_ref, db_ref, *, num_sub: int, precise: bool
):
    """Gradients of one chunk's inputs given its output cotangent `do` and its exit-state gradient `g`.

    Per sub-chunk m, in its three roles: queries (`dq`), keys and values of the intra-chunk product
    (`dk`, `dv`), and keys and values written into the exit state; `db` gathers what each role
    passes to the cumulative gates (the exit gate `b_C` also scales the entry state).
    """
    refs = dict(q=q_ref, k=k_ref, v=v_ref, b=b_ref, do=do_ref, dq=dq_ref, dk=dk_ref, dv=dv_ref, db=db_ref)
    ch = _Chunk(refs, precise)
    dot, h, g = ch.dot, h_ref[ch.at], g_ref[ch.at]
    b_exit = ch.row("b", num_sub * SUB - 1)
    db_exit = jnp.exp(b_exit) * jnp.sum(g * h, axis=1)  # through the decay of the entry state
    row, col = _index()
    for m in range(num_sub):
        q_m, k_m, v_m, b_m, do_m = (ch.block(name, m) for name in ("q", "k", "v", "b", "do"))
        # Queries: through the entry state, earlier sub-chunks, and their own sub-chunk (below).
        dq = dot(do_m, h, trans_b=True) * jnp.exp(b_m)
        r_m = ch.boundary(m)[None, :]
        for j in range(m):
            d_scores = dot(do_m, ch.block("v", j), trans_b=True)
            dq += dot(d_scores, ch.block("k", j) * jnp.exp(r_m - ch.block("b", j))) * jnp.exp(b_m - r_m)
        # Keys and values: later sub-chunks read them through their own boundary gate r_i.
        dk = jnp.zeros_like(k_m)
        dv = jnp.zeros_like(v_m)
        for i in range(m + 1, num_sub):
            q_i, b_i, do_i = ch.block("q", i), ch.block("b", i), ch.block("do", i)
            r_i = ch.boundary(i)[None, :]
            q_ref_i = q_i * jnp.exp(b_i - r_i)
            dk += dot(dot(do_i, v_m, trans_b=True), q_ref_i, trans_a=True) * jnp.exp(r_i - b_m)
            dv += dot(_off_diagonal_scores(ch, i, m, q_i, b_i), do_i, trans_a=True)
        # Inside the sub-chunk, one key row s at a time.
        d_scores = dot(do_m, v_m, trans_b=True)

        def key_row(s, grads, m=m, q_m=q_m, b_m=b_m, do_m=do_m, d_scores=d_scores):
            dq, dk, dv = grads
            t = m * SUB + s
            k_s = ch.row("k", t)
            decays = _from_row(b_m, ch.row("b", t), s)  # [SUB, Dk]: rows t >= s
            d_col = jnp.sum(jnp.where(col == s, d_scores, 0.0), axis=1)  # dA[:, s]
            weights = jnp.sum(q_m * k_s[None, :] * decays, axis=1)  # A[:, s]
            dq += d_col[:, None] * k_s[None, :] * decays
            dk += jnp.where(row == s, jnp.sum(d_col[:, None] * q_m * decays, axis=0)[None, :], 0.0)
            dv += jnp.where(row == s, jnp.sum(weights[:, None] * do_m, axis=0)[None, :], 0.0)
            return dq, dk, dv

        dq, dk, dv = lax.fori_loop(0, SUB, key_row, (dq, dk, dv))
        db = q_m * dq - k_m * dk  # gates seen as a query minus gates seen as a key (intra-chunk and entry)
        # Keys and values written into the exit state: `(k e^{b_C − b})ᵀ v`.
        k_exit = k_m * jnp.exp(b_exit[None, :] - b_m)
        dk_exit = dot(v_m, g, trans_b=True)
        dv += dot(k_exit, g)
        dk += dk_exit * jnp.exp(b_exit[None, :] - b_m)
        db -= dk_exit * k_exit
        db_exit += jnp.sum(dk_exit * k_exit, axis=0)
        if m == num_sub - 1:
            db += jnp.where(row == SUB - 1, db_exit[None, :], 0.0)
        for name, value in (("dq", dq), ("dk", dk), ("dv", dv), ("db", db)):
            ch.store(name, m, value)


def _call(kernel, args, out_shapes, tiling: Tiling, name: str):
    num_chunks, batch, heads, chunk = args[0].shape[:4]
    return pl.pallas_call(
        functools.partial(kernel, num_sub=chunk // SUB, precise=tiling.precise),
        grid=(num_chunks, batch, heads),
        out_shape=[out_struct(shape, jnp.float32, *args) for shape in out_shapes],
        compiler_params=tiling.params(),
        interpret=tiling.interpret,
        name=name,
    )(*args)


def _exit_parts(k, v, b):
    """What the state passes read: keys decayed to the chunk end, and the chunk's decay of each state row."""
    return ChunkParts(None, None, k * jnp.exp(b[..., -1:, :] - b), jnp.exp(b[..., -1, :]), v, None)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def gla_scan(tiling: Tiling, q, k, v, b, init, starts):
    """`(out [NC,B,H,C,Dv], exit states [NC,B,H,Dk,Dv])` of the chunked gated recurrence (float32 inputs).

    q (scaled), k `[NC,B,H,C,Dk]`, v `[NC,B,H,C,Dv]`, b `[NC,B,H,C,Dk]` cumulative log gates within each
    chunk; `init`/`starts` as in `chunked_scan`. Differentiable w.r.t. q, k, v, b and init.
    """
    return _forward(tiling, q, k, v, b, init, starts)


def _forward(tiling, q, k, v, b, init, starts):
    h_out = exit_states(_exit_parts(k, v, b), init, starts, tiling)
    h_in = entry_states(h_out, init, starts)
    [out] = _call(_output_kernel, [q, k, v, b, h_in], [v.shape], tiling, "ejkernel_gla_chunk_outputs")
    return out, h_out


def _fwd(tiling, q, k, v, b, init, starts):
    out, h_out = _forward(tiling, q, k, v, b, init, starts)
    return (out, h_out), (q, k, v, b, init, starts, h_out)


def _bwd(tiling, residuals, cotangents):
    q, k, v, b, init, starts, h_out = residuals
    d_out, d_exit = cotangents
    h_in = entry_states(h_out, init, starts)
    dh_own = jnp.swapaxes(q * jnp.exp(b), -1, -2) @ d_out  # what each chunk's outputs pass to its entry state
    dh_in, d_exit_total = entry_grads(_exit_parts(k, v, b), dh_own, d_exit, starts, tiling)
    dq, dk, dv, db = _call(
        _grads_kernel,
        [q, k, v, b, h_in, d_out, d_exit_total],
        [q.shape, k.shape, v.shape, b.shape],
        tiling,
        "ejkernel_gla_chunk_grads",
    )
    return dq, dk, dv, db, init_grad(dh_in, init, starts), None


gla_scan.defvjp(_fwd, _bwd)
