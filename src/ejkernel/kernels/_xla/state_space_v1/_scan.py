"""The Mamba-1 selective scan in plain JAX: sequential over chunks, a parallel scan inside each.

With `h_t = e_t ⊙ h_{t-1} + u_t` (`e_t = exp(A · dt_t)`, `u_t = (dt_t x_t) ⊗ B_t`, all `[I, N]` per
batch row), the forward walks the sequence chunk by chunk, carrying the state; inside a chunk the
`T` states come from one parallel (doubling) scan, so at most `[b, T, I, N]` float32 lives at a time (never
`[b, S, I, N]`). It keeps only each chunk's starting state for the backward.

The backward walks the chunks in reverse. It recomputes a chunk's states from its saved start, then
the adjoint `λ_t = ∂L/∂h_t = dy_t ⊗ C_t + e_{t+1} ⊙ λ_{t+1}` by a reverse parallel scan, and reads
every gradient off `λ` and `h`: with `e_t ⊙ h_{t-1} = h_t - u_t`,
    dx_t = dt_t · Σ_n λ_t B_t        ddt_t = x_t · Σ_n λ_t B_t + Σ_n A ⊙ λ_t ⊙ (h_t - u_t)
    dB_t = Σ_i λ_t (dt_t x_t)        dC_t = Σ_i h_t dy_t       dA = Σ_t dt_t ⊙ λ_t ⊙ (h_t - u_t)
and `dh_0 = e_1 ⊙ λ_1`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

HIGHEST = lax.Precision.HIGHEST


def _shifted(a, shift: int, fill: float, reverse: bool):
    """Position t of axis 1 gets `a[t - shift]` (`a[t + shift]` when `reverse`), `fill` where none exists."""
    pad = jnp.full_like(a[:, :shift], fill)
    return jnp.concatenate([a[:, shift:], pad] if reverse else [pad, a[:, :-shift]], axis=1)


def _affine_scan(decay, inject, *, reverse: bool = False):
    """All prefix compositions of the affine steps `h -> decay_t h + inject_t` along axis 1 (suffixes
    when `reverse`): returns `(reach_t, acc_t)` with `h_t = reach_t h_start + acc_t`.

    A doubling (Hillis-Steele) scan: log2(T) rounds of one fused multiply-add each; it compiles in a
    fraction of `lax.associative_scan`'s time and runs as few kernels.
    """
    length, shift = decay.shape[1], 1
    while shift < length:
        inject = decay * _shifted(inject, shift, 0.0, reverse) + inject
        decay = decay * _shifted(decay, shift, 1.0, reverse)
        shift *= 2
    return decay, inject


def _by_chunk(a: jax.Array, chunk: int) -> jax.Array:
    """`[b, S, ...]` -> `[S / chunk, b, chunk, ...]` (the layout `lax.scan` walks)."""
    return jnp.moveaxis(a.reshape(a.shape[0], a.shape[1] // chunk, chunk, *a.shape[2:]), 1, 0)


def _from_chunks(a: jax.Array) -> jax.Array:
    return jnp.moveaxis(a, 0, 1).reshape(a.shape[1], a.shape[0] * a.shape[2], *a.shape[3:])


def _chunk_states(h0, A, x, B, dt):
    """States `h_t [b, T, I, N]` of one chunk from its start `h0 [b, I, N]`; also `e_t` and `u_t`."""
    decay = jnp.exp(dt[..., None] * A)
    inject = (dt * x)[..., None] * B[:, :, None, :]
    reach, acc = _affine_scan(decay, inject)
    return reach * h0[:, None] + acc, decay, inject


def _forward(chunk: int, x, A, B, C, dt, h0, keep_starts: bool):
    A = A.astype(jnp.float32)

    def step(h, block):
        xc, Bc, Cc, dtc = (a.astype(jnp.float32) for a in block)
        hs, _, _ = _chunk_states(h, A, xc, Bc, dtc)
        y = jnp.einsum("btin,btn->bti", hs, Cc, precision=HIGHEST)
        return hs[:, -1], (y, h) if keep_starts else y

    h_last, out = lax.scan(step, h0, [_by_chunk(a, chunk) for a in (x, B, C, dt)])
    y, starts = out if keep_starts else (out, None)
    return _from_chunks(y), h_last, starts


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def chunked_scan(chunk: int, x, A, B, C, dt, h0):
    """`(y [b, S, I], h_S [b, I, N])`, both float32, with `y_t = h_t C_t` (no D skip, no gate).

    `S` must be a multiple of `chunk`; `h0` is float32.
    """
    y, h_last, _ = _forward(chunk, x, A, B, C, dt, h0, keep_starts=False)
    return y, h_last


def _chunked_scan_fwd(chunk, x, A, B, C, dt, h0):
    y, h_last, starts = _forward(chunk, x, A, B, C, dt, h0, keep_starts=True)
    return (y, h_last), (x, A, B, C, dt, starts)


def _chunked_scan_bwd(chunk, residuals, cotangents):
    x, A, B, C, dt, starts = residuals
    dy, dh_last = cotangents
    A32 = A.astype(jnp.float32)

    def step(carry, block):
        incoming, dA = carry  # incoming = e ⊙ λ of the next chunk's first step
        xc, Bc, Cc, dtc, dyc = (a.astype(jnp.float32) for a in block[:5])
        hs, decay, inject = _chunk_states(block[5], A32, xc, Bc, dtc)
        following = jnp.concatenate([decay[:, 1:], jnp.ones_like(decay[:, :1])], axis=1)
        direct = dyc[..., None] * Cc[:, :, None, :]
        reach, acc = _affine_scan(following, direct, reverse=True)
        lam = acc + reach * incoming[:, None]
        decayed_prev = hs - inject  # e_t ⊙ h_{t-1}
        lam_b = jnp.einsum("btin,btn->bti", lam, Bc, precision=HIGHEST)
        lam_h = lam * decayed_prev
        dx = lam_b * dtc
        ddt = lam_b * xc + jnp.einsum("btin,in->bti", lam_h, A32, precision=HIGHEST)
        dB = jnp.einsum("btin,bti->btn", lam, dtc * xc, precision=HIGHEST)
        dC = jnp.einsum("btin,bti->btn", hs, dyc, precision=HIGHEST)
        dA = dA + jnp.einsum("btin,bti->in", lam_h, dtc, precision=HIGHEST)
        return (decay[:, 0] * lam[:, 0], dA), (dx, dB, dC, ddt)

    blocks = [_by_chunk(a, chunk) for a in (x, B, C, dt, dy)] + [starts]
    (dh0, dA), grads = lax.scan(step, (dh_last, jnp.zeros(A.shape, jnp.float32)), blocks, reverse=True)
    dx, dB, dC, ddt = (_from_chunks(g).astype(like.dtype) for g, like in zip(grads, (x, B, C, dt), strict=True))
    return dx, dA.astype(A.dtype), dB, dC, ddt, dh0


chunked_scan.defvjp(_chunked_scan_fwd, _chunked_scan_bwd)
