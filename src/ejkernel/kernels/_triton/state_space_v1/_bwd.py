"""Mamba-1 selective scan backward: the adjoint recurrence, chunk-parallel like the forward.

The adjoint `λ_t = ∂L/∂h_t = dy_t ⊗ C_t + e_{t+1} ⊙ λ_{t+1}` runs backwards in time (the formulas of
every gradient are in `ejkernel.kernels._xla.state_space_v1._scan`). As in the forward:

1. `adjoint_ends`: every chunk walked backwards from a zero adjoint: what it passes to the chunk
   before it, `e_first ⊙ λ_first`;
2. XLA carries it across chunks in reverse (`chunk_entries(reverse=True)`), with the chunk decays of
   the forward: the adjoint entering each chunk from its right, and `dh_0`;
3. `chunk_grads`: every chunk walked backwards from its entering adjoint. The adjoint runs against
   time but needs the states `h_{t}` too: the program first walks forward from the saved entry state,
   keeping a checkpoint of the state every `sub` tokens in registers, then, sub-chunk by sub-chunk from
   the last, recomputes the `sub` states from the checkpoint into a register buffer and walks them back.
   No state is stored outside the program.

`dB_t` and `dC_t` sum over the channels, which are split over programs: each channel block writes its
partial sums (float32 `[I / block_d, b, S, N]`), added up by XLA; `dA` likewise per chunk.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from ._fwd import TritonStateSpaceV1Tiling, call, specs, step, token


def _adjoint_ends_kernel(dt_ref, c_ref, dy_ref, a_ref, out_ref, *, chunk: int):
    A = a_ref[...].astype(jnp.float32)

    def body(k, lam):
        dt_t, C_t, dy_t = token((dt_ref, c_ref, dy_ref), chunk - 1 - k)
        return jnp.exp(A * dt_t[:, None]) * (lam + dy_t[:, None] * C_t[None, :])

    out_ref[...] = lax.fori_loop(0, chunk, body, jnp.zeros(A.shape, jnp.float32))


def _put(buffer, slot, value):
    """`buffer [n, ...]` with `value` in row `slot` (registers cannot be indexed: a select over the rows)."""
    rows = lax.broadcasted_iota(jnp.int32, buffer.shape, 0)
    return jnp.where(rows == slot, value[None], buffer)


def _get(buffer, slot):
    rows = lax.broadcasted_iota(jnp.int32, buffer.shape, 0)
    return jnp.sum(jnp.where(rows == slot, buffer, 0.0), axis=0)


def _chunk_grads_kernel(
    x_ref,
    dt_ref,
    b_ref,
    c_ref,
    dy_ref,
    a_ref,
    entry_ref,
    incoming_ref,
    dx_ref,
    ddt_ref,
    db_ref,
    dc_ref,
    da_ref,
    *,
    chunk: int,
    sub: int,
):
    A = a_ref[...].astype(jnp.float32)
    zeros = jnp.zeros(A.shape, jnp.float32)

    def advance(h, t):
        x_t, dt_t, B_t = token((x_ref, dt_ref, b_ref), t)
        return step(h, A, x_t, dt_t, B_t)[0]

    def checkpoint(m, carry):
        h, marks = carry
        marks = _put(marks, m, h)
        return lax.fori_loop(0, sub, lambda k, h: advance(h, m * sub + k), h), marks

    num_subs = chunk // sub
    _, marks = lax.fori_loop(0, num_subs, checkpoint, (entry_ref[...], jnp.zeros((num_subs, *A.shape), jnp.float32)))

    def sub_chunk(j, carry):
        first = (num_subs - 1 - j) * sub

        def forward(k, state):
            h, states = state
            h = advance(h, first + k)
            (dy_t,) = token((dy_ref,), first + k)
            dc_ref[first + k, :] = jnp.sum(h * dy_t[:, None], axis=0)
            return h, _put(states, k, h)

        _, states = lax.fori_loop(0, sub, forward, (_get(marks, num_subs - 1 - j), jnp.zeros((sub, *A.shape))))

        def backward(k, state):
            lam, dA = state
            t = first + sub - 1 - k
            x_t, dt_t, B_t, C_t, dy_t = token((x_ref, dt_ref, b_ref, c_ref, dy_ref), t)
            lam = lam + dy_t[:, None] * C_t[None, :]
            h_t = _get(states, sub - 1 - k)
            _, decay, inject = step(h_t, A, x_t, dt_t, B_t)
            lam_h = lam * (h_t - inject)  # λ_t ⊙ e_t h_{t-1}
            lam_b = jnp.sum(lam * B_t[None, :], axis=1)
            dx_ref[t, :] = (lam_b * dt_t).astype(dx_ref.dtype)
            ddt_ref[t, :] = (lam_b * x_t + jnp.sum(A * lam_h, axis=1)).astype(ddt_ref.dtype)
            db_ref[t, :] = jnp.sum(lam * (dt_t * x_t)[:, None], axis=0)
            return decay * lam, dA + dt_t[:, None] * lam_h

        return lax.fori_loop(0, sub, backward, carry)

    _, dA = lax.fori_loop(0, num_subs, sub_chunk, (incoming_ref[...], zeros))
    da_ref[...] = dA


def adjoint_ends(dt, C, dy, A, t: TritonStateSpaceV1Tiling, interpret: bool):
    """`e_first ⊙ λ_first [nC, b, I, N]` of every chunk walked back from a zero adjoint (float32)."""
    batch, seq, channels = dt.shape
    state = A.shape[1]
    s = specs(t, state)
    return call(
        _adjoint_ends_kernel,
        t,
        (channels // t.block_d, seq // t.chunk, batch),
        [s["channels"], s["state_rows"], s["channels"], s["A"]],
        s["per_chunk"],
        jax.ShapeDtypeStruct((seq // t.chunk, batch, channels, state), jnp.float32),
        interpret,
        "ejkernel_ssm1_adjoint_ends",
        chunk=t.chunk,
    )(dt, C, dy, A)


def chunk_grads(x, dt, B, C, dy, A, entries, incoming, t: TritonStateSpaceV1Tiling, interpret: bool):
    """`(dx, ddt, dB, dC, dA)`: dx and ddt in the inputs' dtypes; dB, dC `[I / block_d, b, S, N]` and
    dA `[nC, b, I, N]` float32 partial sums."""
    batch, seq, channels = x.shape
    state = A.shape[1]
    blocks, chunks = channels // t.block_d, seq // t.chunk
    s = specs(t, state)
    partial_rows = pl.BlockSpec((None, None, t.chunk, state), lambda i, c, b: (i, b, c, 0))

    return call(
        _chunk_grads_kernel,
        t,
        (blocks, chunks, batch),
        [s["channels"]] * 2 + [s["state_rows"]] * 2 + [s["channels"], s["A"], s["per_chunk"], s["per_chunk"]],
        [s["channels"], s["channels"], partial_rows, partial_rows, s["per_chunk"]],
        [
            jax.ShapeDtypeStruct(x.shape, x.dtype),
            jax.ShapeDtypeStruct(dt.shape, dt.dtype),
            jax.ShapeDtypeStruct((blocks, batch, seq, state), jnp.float32),
            jax.ShapeDtypeStruct((blocks, batch, seq, state), jnp.float32),
            jax.ShapeDtypeStruct((chunks, batch, channels, state), jnp.float32),
        ],
        interpret,
        "ejkernel_ssm1_chunk_grads",
        chunk=t.chunk,
        sub=t.sub,
    )(x, dt, B, C, dy, A, entries, incoming)
