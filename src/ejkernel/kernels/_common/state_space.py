"""What the state-space implementations (Mamba-1 `state_space_v1`, Mamba-2 `state_space_v2`) share.

Platform-neutral pieces, so that every implementation refuses the same calls with the same words and
computes the same things around its scan:
- argument checks (`check_v1`, `check_v2`);
- `run_scan`: the frame of every implementation (initial state, the one-token decode step
  `v1_step` / `v2_step`, the output epilogue `finish_output`: D skip, gated RMSNorm, gate; the dtype
  of the returned state);
- `chunk_entries`: the short scan over chunks of a chunk-parallel scan (states or adjoints);
- `ssd_inputs`: Mamba-2's operands as chunked linear attention.
Semantics are `ejkernel.reference.state_space`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from jax import lax

from ejkernel.kernels._common.checks import require_array, require_float

V1_SLOTS = ("hidden_states", "A", "B", "C", "D", "dt", "gate", "initial_state", "conv_state")
V2_SLOTS = ("x", "A", "B", "C", "D", "dt", "gate", "initial_state", "conv_state")

PRECISIONS = ("default", "high", "highest", "bfloat16", "tensorfloat32", "float32")


def matmul_precision(precision):
    """A context in which the core's matmuls use `precision` (a `lax.Precision`, one of `PRECISIONS`, or None)."""
    if precision is None:
        return contextlib.nullcontext()
    name = precision.name.lower() if isinstance(precision, lax.Precision) else precision
    if name not in PRECISIONS:
        raise ValueError(f"precision must be None, a jax.lax.Precision or one of {PRECISIONS}, got {precision!r}")
    return jax.default_matmul_precision(name)


def _require_shape(name: str, x, shape: tuple[int, ...], layout: str) -> None:
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} must be {layout} = {tuple(shape)}, got shape {tuple(x.shape)}")


def _check_options(act_fn: Callable | None, conv_state, batch: int) -> None:
    """`act_fn` is a callable (or None for SiLU); `conv_state`, if given, is an array led by the batch."""
    if act_fn is not None and not callable(act_fn):
        raise TypeError(f"act_fn must be a callable (e.g. jax.nn.silu) or None, got {type(act_fn).__name__}")
    if conv_state is not None and (not hasattr(conv_state, "shape") or conv_state.ndim < 1):
        raise TypeError(f"conv_state must be an array [batch, ...], got {type(conv_state).__name__}")
    if conv_state is not None and conv_state.shape[0] != batch:
        raise ValueError(f"conv_state must be [batch={batch}, ...], got shape {tuple(conv_state.shape)}")


def check_v1(
    x, A, B, C, D, dt, gate=None, initial_state=None, conv_state=None, *, act_fn=None
) -> tuple[int, int, int, int]:
    """Checks a Mamba-1 call; returns `(batch, seq, channels, state_size)`."""
    for name, array in zip(V1_SLOTS, (x, A, B, C, D, dt, gate, initial_state), strict=False):
        require_array(name, array)
        require_float(name, array)
    if x.ndim != 3:
        raise ValueError(f"hidden_states must be [batch, seq, channels], got shape {tuple(x.shape)}")
    batch, seq, channels = x.shape
    if A.ndim != 2 or A.shape[0] != channels:
        raise ValueError(f"A must be [channels={channels}, state_size], got shape {tuple(A.shape)}")
    state = A.shape[1]
    _require_shape("B", B, (batch, seq, state), "[batch, seq, state_size]")
    _require_shape("C", C, (batch, seq, state), "[batch, seq, state_size]")
    _require_shape("D", D, (channels,), "[channels]")
    _require_shape("dt", dt, (batch, seq, channels), "[batch, seq, channels]")
    if gate is not None:
        _require_shape("gate", gate, (batch, seq, channels), "[batch, seq, channels]")
    if initial_state is not None:
        _require_shape("initial_state", initial_state, (batch, channels, state), "[batch, channels, state_size]")
    _check_options(act_fn, conv_state, batch)
    return batch, seq, channels, state


def check_v2(
    x,
    A,
    B,
    C,
    D,
    dt,
    gate=None,
    initial_state=None,
    conv_state=None,
    *,
    n_groups: int = 1,
    act_fn=None,
    use_gated_rmsnorm: bool = False,
    rmsnorm_eps: float = 1e-5,
    precision=None,
) -> tuple[int, ...]:
    """Checks a Mamba-2 call; returns `(batch, seq, heads, head_dim, groups, state_size)`."""
    for name, array in zip(V2_SLOTS, (x, A, B, C, D, dt, gate, initial_state), strict=False):
        require_array(name, array)
        require_float(name, array)
    if x.ndim != 4:
        raise ValueError(f"x must be [batch, seq, heads, head_dim], got shape {tuple(x.shape)}")
    batch, seq, heads, head_dim = x.shape
    if not isinstance(n_groups, int) or isinstance(n_groups, bool) or n_groups <= 0 or heads % n_groups:
        raise ValueError(f"n_groups must be a positive divisor of the {heads} heads, got {n_groups!r}")
    if B.ndim != 4 or B.shape[:3] != (batch, seq, n_groups):
        raise ValueError(f"B must be [batch, seq, n_groups={n_groups}, state_size], got shape {tuple(B.shape)}")
    state = B.shape[3]
    _require_shape("C", C, (batch, seq, n_groups, state), "[batch, seq, n_groups, state_size]")
    _require_shape("A", A, (heads,), "[heads]")
    _require_shape("D", D, (heads,), "[heads]")
    _require_shape("dt", dt, (batch, seq, heads), "[batch, seq, heads]")
    if gate is not None:
        _require_shape("gate", gate, (batch, seq, heads * head_dim), "[batch, seq, heads * head_dim]")
    if initial_state is not None:
        _require_shape(
            "initial_state", initial_state, (batch, heads, head_dim, state), "[batch, heads, head_dim, state_size]"
        )
    _check_options(act_fn, conv_state, batch)
    if use_gated_rmsnorm and gate is None:
        raise ValueError("use_gated_rmsnorm=True needs a gate (the norm is the gate's)")
    if not isinstance(rmsnorm_eps, int | float) or not rmsnorm_eps > 0:
        raise ValueError(f"rmsnorm_eps must be a positive number, got {rmsnorm_eps!r}")
    matmul_precision(precision)
    return batch, seq, heads, head_dim, n_groups, state


def state_dtype(x, initial_state):
    """The returned state keeps `initial_state`'s dtype (a float32 cache stays float32), else `x`'s."""
    return x.dtype if initial_state is None else initial_state.dtype


def finish_output(y, x, D, gate=None, *, act_fn=None, rmsnorm_eps: float | None = None):
    """`y` (the scan's `h_t C_t`, float32, shaped like `x [b, S, ...]`) plus the D skip, flattened to
    `[b, S, features]`, then RMS-normalised over the features (when `rmsnorm_eps` is given) and gated
    by `act_fn(gate)` (SiLU by default); returned in `x`'s dtype."""
    x32 = x.astype(jnp.float32)
    D32 = D.astype(jnp.float32).reshape(D.shape + (1,) * (x.ndim - 3))
    y = (y + D32 * x32).reshape(*x.shape[:2], math.prod(x.shape[2:]))
    if gate is not None:
        if rmsnorm_eps is not None:
            y = y * lax.rsqrt(jnp.mean(y * y, axis=-1, keepdims=True) + rmsnorm_eps)
        y = y * (act_fn or jax.nn.silu)(gate.astype(jnp.float32))
    return y.astype(x.dtype)


def v1_step(x, A, B, C, dt, h):
    """One token of the Mamba-1 recurrence (a decode step): `x, dt [b, I]`, `B, C [b, N]`, `h [b, I, N]`
    float32 -> `(h_t C_t [b, I], h_t)` in float32. Plain JAX, and `h_t C_t` a reduction rather than a
    matmul, so that XLA fuses the step into one pass that reads and writes the state once."""
    dt = dt.astype(jnp.float32)
    h = (
        jnp.exp(A.astype(jnp.float32) * dt[..., None]) * h
        + (dt * x.astype(jnp.float32))[..., None] * B.astype(jnp.float32)[:, None, :]
    )
    return jnp.sum(h * C.astype(jnp.float32)[:, None, :], axis=-1), h


def v2_step(x, A, B, C, dt, h):
    """One token of the Mamba-2 recurrence: `x [b, H, P]`, `B, C [b, G, N]`, `dt [b, H]`, `h [b, H, P, N]`
    float32 -> `(h_t C_t [b, H, P], h_t)` in float32."""
    heads, groups = x.shape[1], B.shape[1]
    group_of_head = jnp.arange(heads) // (heads // groups)
    B, C = (a.astype(jnp.float32)[:, group_of_head] for a in (B, C))
    dt = dt.astype(jnp.float32)
    h = (
        jnp.exp(A.astype(jnp.float32) * dt)[..., None, None] * h
        + (dt[..., None] * x.astype(jnp.float32))[..., None] * B[:, :, None, :]
    )
    return jnp.sum(h * C[:, :, None, :], axis=-1), h


def run_scan(
    long_scan, step, x, A, B, C, D, dt, gate, initial_state, conv_state, state_shape, *, finished=False, **epilogue
):
    """What every implementation of either op does around its scan; returns `(y, final state, conv_state)`.

    The state starts from `initial_state` (or zeros `state_shape`) in float32. At most one token (a decode
    step, or nothing) takes `step` (`v1_step` / `v2_step`); longer calls `long_scan(h0) -> (y, h_S)`, both
    float32 with `y` shaped like `x` (with `finished`, `y` is already `finish_output`'s). Then
    `finish_output` (`epilogue`: act_fn, rmsnorm_eps) and the state's dtype (`state_dtype`).
    """
    h0 = jnp.zeros(state_shape, jnp.float32) if initial_state is None else initial_state.astype(jnp.float32)
    if x.shape[1] == 0:
        y, h_last = jnp.zeros(x.shape, jnp.float32), h0
    elif x.shape[1] == 1:
        y, h_last = step(x[:, 0], A, B[:, 0], C[:, 0], dt[:, 0], h0)
        y = y[:, None]
    else:
        y, h_last = long_scan(h0)
    if not (finished and x.shape[1] > 1):
        y = finish_output(y, x, D, gate, **epilogue)
    return y, h_last.astype(state_dtype(x, initial_state)), conv_state


def chunk_entries(local_ends, decays, h0, *, reverse: bool = False):
    """What enters each chunk of a chunk-parallel scan, given each chunk's own contribution.

    `local_ends [nC, ...]` is what a chunk produces from a zero start and `decays [nC, ...]` what it
    multiplies its entry by; returns `(entries [nC, ...], last)` with `entries[c + 1] = decays[c] ⊙
    entries[c] + local_ends[c]` from `entries[0] = h0` (from the last chunk down when `reverse`, for
    adjoints), and `last` what leaves the final chunk.
    """

    def through(h, chunk):
        decay, local_end = chunk
        return decay * h + local_end, h

    last, entries = lax.scan(through, h0, (decays, local_ends), reverse=reverse)
    return entries, last


def ssd_inputs(x, A, B, C, dt, dtype):
    """The linear-attention operands of Mamba-2: `(q = C, k = B, v = dt · x in dtype, g = A · dt float32)`."""
    dt = dt.astype(jnp.float32)
    return C.astype(dtype), B.astype(dtype), (dt[..., None] * x.astype(jnp.float32)).astype(dtype), A * dt


def pad_sequence(arrays: Sequence[jax.Array], chunk: int) -> list[jax.Array]:
    """Pads axis 1 of each `[b, S, ...]` array with zeros to a multiple of `chunk`.

    A padded step has dt = 0: no decay and no input, so the state passes through it unchanged.
    """
    pad = -arrays[0].shape[1] % chunk
    if not pad:
        return list(arrays)
    return [jnp.pad(a, [(0, 0), (0, pad)] + [(0, 0)] * (a.ndim - 2)) for a in arrays]
