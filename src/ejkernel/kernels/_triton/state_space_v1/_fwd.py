"""Mamba-1 selective scan forward: two Pallas-Triton passes around a short XLA scan over chunks.

The sequence is cut into chunks of `T` tokens and the channels into blocks of `block_d`; one program
per (channel block, chunk, batch row) walks its chunk token by token, holding its `[block_d, N]` slice
of the state in registers (the loads of a step do not depend on the state, so they pipeline):

1. `chunk_ends`: every chunk from a zero state: its local end state, and its Σ dt (the chunk's decay
   is `exp(A · Σ dt)`);
2. `entry_states` (XLA, `ejkernel.kernels._common.state_space.chunk_entries`): the state entering each
   chunk, `h_in[c+1] = exp(A · Σ dt[c]) ⊙ h_in[c] + end[c]`, a scan of `S / T` steps of `[b, I, N]`;
3. `chunk_outputs`: every chunk again from its entry state, writing `y_t = h_t C_t`.

All chunks run in parallel in passes 1 and 3. Nothing of size `[b, S, I, N]` is ever stored: the
backward keeps the entry states `[S / T, b, I, N]` only.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu


@dataclasses.dataclass(frozen=True)
class TritonStateSpaceV1Tiling:
    """Tokens per chunk, channels per program, the sub-chunk the backward buffers, Triton's knobs."""

    chunk: int
    block_d: int
    sub: int
    num_warps: int
    num_stages: int


def token(refs, t):
    """Row `t` of each `[T, ...]` ref, in float32."""
    return [r[t, :].astype(jnp.float32) for r in refs]


def step(h, A, x_t, dt_t, B_t):
    """One token of the recurrence on a `[block_d, N]` state: `(h_t, exp(A dt_t), (dt_t x_t) ⊗ B_t)`."""
    decay = jnp.exp(A * dt_t[:, None])
    inject = (dt_t * x_t)[:, None] * B_t[None, :]
    return decay * h + inject, decay, inject


def _chunk_ends_kernel(x_ref, dt_ref, b_ref, a_ref, end_ref, dt_sum_ref, *, chunk: int):
    A = a_ref[...].astype(jnp.float32)

    def body(t, carry):
        h, dt_sum = carry
        x_t, dt_t, B_t = token((x_ref, dt_ref, b_ref), t)
        return step(h, A, x_t, dt_t, B_t)[0], dt_sum + dt_t

    h, dt_sum = lax.fori_loop(0, chunk, body, (jnp.zeros(A.shape, jnp.float32), jnp.zeros(A.shape[:1], jnp.float32)))
    end_ref[...] = h
    dt_sum_ref[...] = dt_sum


def _chunk_outputs_kernel(x_ref, dt_ref, b_ref, c_ref, a_ref, entry_ref, y_ref, *, chunk: int):
    A = a_ref[...].astype(jnp.float32)

    def body(t, h):
        x_t, dt_t, B_t, C_t = token((x_ref, dt_ref, b_ref, c_ref), t)
        h = step(h, A, x_t, dt_t, B_t)[0]
        y_ref[t, :] = jnp.sum(h * C_t[None, :], axis=1)
        return h

    lax.fori_loop(0, chunk, body, entry_ref[...])


def specs(t: TritonStateSpaceV1Tiling, state: int):
    """BlockSpecs over the grid (channel block, chunk, batch row) of every operand shape the passes use."""
    return dict(
        channels=pl.BlockSpec((None, t.chunk, t.block_d), lambda i, c, b: (b, c, i)),  # x, dt, y: [b, S, I]
        state_rows=pl.BlockSpec((None, t.chunk, state), lambda i, c, b: (b, c, 0)),  # B, C: [b, S, N]
        A=pl.BlockSpec((t.block_d, state), lambda i, c, b: (i, 0)),  # [I, N]
        per_chunk=pl.BlockSpec((None, None, t.block_d, state), lambda i, c, b: (c, b, i, 0)),  # [nC, b, I, N]
        per_chunk_channels=pl.BlockSpec((None, None, t.block_d), lambda i, c, b: (c, b, i)),  # [nC, b, I]
    )


def call(kernel, t, grid, in_specs, out_specs, out_shape, interpret: bool, name: str, **static):
    """A `pallas_call` of one pass of the family's kernels: `kernel` with its `static` options, under the
    tiling's `num_warps` and `num_stages` (`t` is any tiling that has them)."""
    return pl.pallas_call(
        functools.partial(kernel, **static),
        grid=grid,
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=plgpu.CompilerParams(num_warps=t.num_warps, num_stages=t.num_stages),
        interpret=interpret,
        name=name,
    )


def chunk_ends(x, dt, B, A, t: TritonStateSpaceV1Tiling, interpret: bool):
    """`(end states [nC, b, I, N], Σ dt [nC, b, I])` of every chunk run from a zero state (float32)."""
    batch, seq, channels = x.shape
    state = A.shape[1]
    grid = (channels // t.block_d, seq // t.chunk, batch)
    s = specs(t, state)
    return call(
        _chunk_ends_kernel,
        t,
        grid,
        [s["channels"], s["channels"], s["state_rows"], s["A"]],
        [s["per_chunk"], s["per_chunk_channels"]],
        [
            jax.ShapeDtypeStruct((grid[1], batch, channels, state), jnp.float32),
            jax.ShapeDtypeStruct((grid[1], batch, channels), jnp.float32),
        ],
        interpret,
        "ejkernel_ssm1_chunk_ends",
        chunk=t.chunk,
    )(x, dt, B, A)


def chunk_outputs(x, dt, B, C, A, entries, t: TritonStateSpaceV1Tiling, interpret: bool):
    """`y [b, S, I]` float32, `y_t = h_t C_t`, every chunk run from its entry state."""
    batch, seq, channels = x.shape
    state = A.shape[1]
    s = specs(t, state)
    return call(
        _chunk_outputs_kernel,
        t,
        (channels // t.block_d, seq // t.chunk, batch),
        [s["channels"], s["channels"], s["state_rows"], s["state_rows"], s["A"], s["per_chunk"]],
        s["channels"],
        jax.ShapeDtypeStruct((batch, seq, channels), jnp.float32),
        interpret,
        "ejkernel_ssm1_chunk_outputs",
        chunk=t.chunk,
    )(x, dt, B, C, A, entries)
