"""The Mamba-1 selective scan through Pallas-Triton kernels: checks, padding, tiling, the custom VJP.

Semantics are those of `ejkernel.reference.state_space.state_space_v1_reference`. Inputs are padded
where the kernels need it (plain jnp, so autodiff slices the gradients back): channels to whole
channel blocks and the state size to a power of two (zeros: no decay, no input, no output), the
sequence to whole chunks (dt = 0: the state passes through unchanged). One-token calls (decode steps)
take `_decode.decode_step`, or the plain-JAX step where the state would need padding.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from ejkernel.checked_calls import arguments_checked
from ejkernel.kernels._common.state_space import check_v1, chunk_entries, pad_sequence, run_scan, v1_step
from ejkernel.kernels._triton._helpers import resolve_interpret

from ._bwd import adjoint_ends, chunk_grads
from ._decode import decode_step, step_block
from ._fwd import TritonStateSpaceV1Tiling, chunk_ends, chunk_outputs

SUPPORTED_DTYPES = tuple(jnp.dtype(d) for d in (jnp.float32, jnp.bfloat16, jnp.float16))
DEFAULT = TritonStateSpaceV1Tiling(chunk=64, block_d=32, sub=8, num_warps=4, num_stages=2)
WHO = "triton state_space_v1"


def _forward(t: TritonStateSpaceV1Tiling, interpret: bool, x, A, B, C, dt, h0):
    ends, dt_sums = chunk_ends(x, dt, B, A, t, interpret)
    decays = jnp.exp(A.astype(jnp.float32) * dt_sums[..., None])
    entries, h_last = chunk_entries(ends, decays, h0)
    return chunk_outputs(x, dt, B, C, A, entries, t, interpret), h_last, entries, decays


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _scan(t: TritonStateSpaceV1Tiling, t_bwd: TritonStateSpaceV1Tiling, interpret: bool, x, A, B, C, dt, h0):
    y, h_last, _, _ = _forward(t, interpret, x, A, B, C, dt, h0)
    return y, h_last


def _scan_fwd(t, t_bwd, interpret, x, A, B, C, dt, h0):
    y, h_last, entries, decays = _forward(t, interpret, x, A, B, C, dt, h0)
    return (y, h_last), (x, A, B, C, dt, entries, decays)


def _scan_bwd(t_fwd, t, interpret, residuals, cotangents):
    x, A, B, C, dt, entries, decays = residuals
    dy, dh_last = cotangents
    incoming, dh0 = chunk_entries(adjoint_ends(dt, C, dy, A, t, interpret), decays, dh_last, reverse=True)
    dx, ddt, dB, dC, dA = chunk_grads(x, dt, B, C, dy, A, entries, incoming, t, interpret)
    return dx, dA.sum((0, 1)).astype(A.dtype), dB.sum(0).astype(B.dtype), dC.sum(0).astype(C.dtype), ddt, dh0


_scan.defvjp(_scan_fwd, _scan_bwd)


def tilings(cfg, seq: int, channels: int) -> tuple[TritonStateSpaceV1Tiling, TritonStateSpaceV1Tiling]:
    """Forward and backward tilings from the config over the defaults, clamped to the call's sizes:
    `chunk_size` and `fwd_params.block_d` for every kernel (the backward reads the forward's chunk
    states), `num_warps` / `num_stages` from `fwd_params` and `bwd_params` (falling back to the forward's)."""
    fwd, bwd = getattr(cfg, "fwd_params", None), getattr(cfg, "bwd_params", None)
    given = lambda params, name, default: getattr(params, name, None) or default
    chunk = min(getattr(cfg, "chunk_size", None) or DEFAULT.chunk, pl.next_power_of_2(seq))
    t = TritonStateSpaceV1Tiling(
        chunk=chunk,
        block_d=min(given(fwd, "block_d", DEFAULT.block_d), pl.next_power_of_2(channels)),
        sub=min(DEFAULT.sub, chunk),
        num_warps=given(fwd, "num_warps", DEFAULT.num_warps),
        num_stages=given(fwd, "num_stages", DEFAULT.num_stages),
    )
    knobs = {name: given(bwd, name, getattr(t, name)) for name in ("num_warps", "num_stages")}
    return t, dataclasses.replace(t, **knobs)


def _pad_axis(a, axis: int, size: int):
    return jnp.pad(a, [(0, size - a.shape[axis]) if i == axis else (0, 0) for i in range(a.ndim)])


def state_space_v1_triton(
    hidden_states,
    A,
    B,
    C,
    D,
    dt,
    gate=None,
    initial_state=None,
    conv_state=None,
    *,
    act_fn=None,
    cfg=None,
    interpret: bool | None = None,
):
    """Mamba-1 selective scan (`ejkernel.reference.state_space.state_space_v1_reference`) on Pallas-Triton.

    Returns `(y [b, S, I], final state [b, I, N], conv_state)`. Tiling from `cfg` (`chunk_size`: tokens
    per program; `fwd_params.block_d`: channels per program; `num_warps`, `num_stages` from `fwd_params`
    and `bwd_params`); `interpret=True` runs Pallas interpret mode (off a GPU, None is an error).
    """
    if not arguments_checked("state_space_v1"):
        check_v1(hidden_states, A, B, C, D, dt, gate, initial_state, conv_state, act_fn=act_fn)
    (batch, seq, channels), state = hidden_states.shape, A.shape[1]
    for name, a in (("hidden_states", hidden_states), ("A", A), ("B", B), ("C", C), ("dt", dt)):
        if jnp.dtype(a.dtype) not in SUPPORTED_DTYPES:
            raise NotImplementedError(f"{WHO} takes float32/bfloat16/float16, got {name} {a.dtype}")
    interpret = resolve_interpret(interpret, "triton state_space_v1")
    t, t_bwd = tilings(cfg, seq, channels)
    padded_channels = -(-channels // t.block_d) * t.block_d
    padded_state = pl.next_power_of_2(state)

    def long_scan(h0):
        x_p, dt_p, A_p, h0_p = (
            _pad_axis(a, axis, padded_channels) for a, axis in ((hidden_states, 2), (dt, 2), (A, 0), (h0, 1))
        )
        A_p, h0_p, B_p, C_p = (_pad_axis(a, a.ndim - 1, padded_state) for a in (A_p, h0_p, B, C))
        x_p, B_p, C_p, dt_p = pad_sequence([x_p, B_p, C_p, dt_p], t.chunk)
        y, h_last = _scan(t, t_bwd, interpret, x_p, A_p, B_p, C_p, dt_p, h0_p)
        return y[:, :seq, :channels], h_last[:, :channels, :state]

    block = step_block(channels, state)
    step = v1_step if block is None else functools.partial(decode_step, block, interpret)
    args = (hidden_states, A, B, C, D, dt, gate, initial_state, conv_state)
    return run_scan(long_scan, step, *args, (batch, channels, state), act_fn=act_fn)
