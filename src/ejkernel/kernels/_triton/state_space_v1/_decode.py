"""One Mamba-1 token (a decode step) in one Pallas-Triton kernel, reading and writing the state once.

One program per (batch row, block of channels) holds its `[block, N]` slice of the float32 state:
`h ← exp(A·dt) ⊙ h + (dt·x) B`, `y = h C`. The gradient, for the rare differentiated decode step, is
that of the plain-JAX step `v1_step` (one token: cheap).
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from ejkernel.kernels._common.differentiation import differentiated_as
from ejkernel.kernels._common.state_space import v1_step
from ejkernel.kernels._common.vma import out_struct

MAX_BLOCK = 256  # channels per program


def step_block(channels: int, state: int) -> int | None:
    """Channels per program for a call the kernel serves (N a power of two, the channels whole blocks
    of at least 16), else None: padding would cost more passes over the state than the step itself."""
    block = min(MAX_BLOCK, channels & -channels)  # the largest power of two dividing the channels
    return block if block >= 16 and state == pl.next_power_of_2(state) else None


def _step_kernel(x_ref, dt_ref, a_ref, b_ref, c_ref, h_ref, y_ref, h_out_ref):
    dt = dt_ref[...].astype(jnp.float32)
    inject = (dt * x_ref[...].astype(jnp.float32))[:, None] * b_ref[...].astype(jnp.float32)[None, :]
    h = jnp.exp(a_ref[...].astype(jnp.float32) * dt[:, None]) * h_ref[...] + inject
    y_ref[...] = jnp.sum(h * c_ref[...].astype(jnp.float32)[None, :], axis=1)
    h_out_ref[...] = h


def _run(block: int, interpret: bool, x, A, B, C, dt, h):
    batch, channels = x.shape
    state = A.shape[1]
    row = pl.BlockSpec((None, block), lambda b, i: (b, i))
    per_batch = pl.BlockSpec((None, state), lambda b, i: (b, 0))
    states = pl.BlockSpec((None, block, state), lambda b, i: (b, i, 0))
    return pl.pallas_call(
        _step_kernel,
        grid=(batch, channels // block),
        in_specs=[row, row, pl.BlockSpec((block, state), lambda b, i: (i, 0)), per_batch, per_batch, states],
        out_specs=[row, states],
        out_shape=[out_struct((batch, channels), jnp.float32, x, h), out_struct(h.shape, jnp.float32, x, h)],
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1),
        interpret=interpret,
        name="ejkernel_ssm1_decode_step",
    )(x, dt, A, B, C, h)


def decode_step(block: int, interpret: bool, x, A, B, C, dt, h):
    """`v1_step` (`x, dt [b, I]`, `B, C [b, N]`, `h [b, I, N]` float32 -> `(y [b, I], h)` float32) in one kernel."""
    return differentiated_as(v1_step, functools.partial(_run, block, interpret))(x, A, B, C, dt, h)
