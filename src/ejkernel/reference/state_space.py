"""Reference state-space scans (Mamba-1 selective scan, Mamba-2 SSD): the recurrences, one token at a time.

Both run in float32 whatever the inputs' dtypes; `y` comes back in `x`'s dtype and the final state in
`initial_state`'s dtype when one is given (so a float32 cache stays float32), else in `x`'s dtype.
`conv_state` (the caller's cache of its causal convolution, which runs before the scan) is returned
unchanged. The gate activation `act_fn` defaults to SiLU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

HIGHEST = lax.Precision.HIGHEST


def _f32(*arrays):
    return [None if a is None else jnp.asarray(a, jnp.float32) for a in arrays]


def _state_dtype(x, initial_state):
    return x.dtype if initial_state is None else initial_state.dtype


def state_space_v1_reference(
    hidden_states, A, B, C, D, dt, gate=None, initial_state=None, conv_state=None, *, act_fn=None
):
    """Mamba-1 selective scan. `hidden_states x [b, S, I]`, `A [I, N]`, `B, C [b, S, N]`, `D [I]`, `dt [b, S, I]`.

    Per token t (dt already positive: no softplus here):
        h_t = exp(A · dt_t[:, None]) ⊙ h_{t-1} + (dt_t · x_t)[:, None] · B_t[None, :]     (h: [I, N])
        y_t = h_t C_t + D · x_t
    then `y ← y · act_fn(gate)` when `gate [b, S, I]` is given. `h_0` is `initial_state [b, I, N]` or 0.
    Returns `(y [b, S, I], h_S [b, I, N], conv_state)`.
    """
    x, A, B, C, D, dt, gate, h = _f32(hidden_states, A, B, C, D, dt, gate, initial_state)
    batch, _, channels = x.shape
    if h is None:
        h = jnp.zeros((batch, channels, A.shape[1]), jnp.float32)

    def step(h, token):
        x_t, B_t, C_t, dt_t = token  # [b, I], [b, N], [b, N], [b, I]
        h = jnp.exp(A[None] * dt_t[:, :, None]) * h + (dt_t * x_t)[:, :, None] * B_t[:, None, :]
        y_t = jnp.einsum("bin,bn->bi", h, C_t, precision=HIGHEST) + D * x_t
        return h, y_t

    h, y = lax.scan(step, h, tuple(jnp.swapaxes(a, 0, 1) for a in (x, B, C, dt)))
    y = jnp.swapaxes(y, 0, 1)
    if gate is not None:
        y = y * (act_fn or jax.nn.silu)(gate)
    return y.astype(hidden_states.dtype), h.astype(_state_dtype(hidden_states, initial_state)), conv_state


def state_space_v2_reference(
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
    n_groups=1,
    act_fn=None,
    use_gated_rmsnorm=False,
    rmsnorm_eps=1e-5,
    precision=None,
):
    """Mamba-2 (SSD) scan. `x [b, S, H, P]`, `A [H]`, `B, C [b, S, G, N]`, `D [H]`, `dt [b, S, H]`, G = n_groups.

    Head `h` reads group `h // (H // G)` of B and C. Per token t and head h:
        h_t = exp(A · dt_t) · h_{t-1} + dt_t · x_t[:, None] · B_t[None, :]                 (h: [P, N])
        y_t = h_t C_t + D · x_t
    flattened to `y [b, S, H·P]`. With `gate [b, S, H·P]`: `y ← y · act_fn(gate)`; with
    `use_gated_rmsnorm` as well, `y` is first RMS-normalised over its H·P features (no weight):
    `y ← y / sqrt(mean(y²) + rmsnorm_eps) · act_fn(gate)`. Returns `(y, h_S [b, H, P, N], conv_state)`.
    `precision` is accepted and ignored (this oracle always multiplies in full float32).
    """
    if use_gated_rmsnorm and gate is None:
        raise ValueError("use_gated_rmsnorm=True needs a gate")
    if B.shape[2] != n_groups or C.shape[2] != n_groups:
        raise ValueError(f"B and C must hold n_groups={n_groups} groups, got {B.shape} and {C.shape}")
    xf, A, B, C, D, dt, gate, h = _f32(x, A, B, C, D, dt, gate, initial_state)
    batch, seq, heads, head_dim = xf.shape
    group_of_head = jnp.arange(heads) // (heads // n_groups)
    B, C = B[:, :, group_of_head], C[:, :, group_of_head]  # [b, S, H, N]
    if h is None:
        h = jnp.zeros((batch, heads, head_dim, B.shape[-1]), jnp.float32)

    def step(h, token):
        x_t, B_t, C_t, dt_t = token  # [b, H, P], [b, H, N], [b, H, N], [b, H]
        decay = jnp.exp(A * dt_t)[:, :, None, None]
        h = decay * h + (dt_t[:, :, None] * x_t)[..., None] * B_t[:, :, None, :]
        y_t = jnp.einsum("bhpn,bhn->bhp", h, C_t, precision=HIGHEST) + D[:, None] * x_t
        return h, y_t

    h, y = lax.scan(step, h, tuple(jnp.swapaxes(a, 0, 1) for a in (xf, B, C, dt)))
    y = jnp.swapaxes(y, 0, 1).reshape(batch, seq, heads * head_dim)
    if gate is not None:
        if use_gated_rmsnorm:
            y = y * lax.rsqrt(jnp.mean(y * y, axis=-1, keepdims=True) + rmsnorm_eps)
        y = y * (act_fn or jax.nn.silu)(gate)
    return y.astype(x.dtype), h.astype(_state_dtype(x, initial_state)), conv_state
