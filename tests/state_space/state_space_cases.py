"""Inputs and checks shared by the state-space tests: realistic random tensors (negative A, positive dt,
never zeros) and a forward + gradient check of both outputs, `y` and the final state, at once."""

import jax
import jax.numpy as jnp

from harness import check_forward_and_grads, randn


def v1_inputs(batch=2, seq=37, channels=24, state=8, dtype=jnp.float32, gate=True, initial=True):
    """`(x, A, B, C, D, dt, gate, initial_state)` of a Mamba-1 call; A and D stay float32 as in models."""
    A = -jnp.exp(randn((channels, state), scale=0.5))
    dt = jax.nn.softplus(randn((batch, seq, channels)) - 1.0).astype(dtype)
    return (
        randn((batch, seq, channels), dtype),
        A,
        randn((batch, seq, state), dtype),
        randn((batch, seq, state), dtype),
        randn((channels,)),
        dt,
        randn((batch, seq, channels), dtype) if gate else None,
        randn((batch, channels, state)) if initial else None,
    )


def v2_inputs(batch=2, seq=37, heads=4, head_dim=8, groups=2, state=16, dtype=jnp.float32, gate=True, initial=True):
    """`(x, A, B, C, D, dt, gate, initial_state)` of a Mamba-2 call."""
    A = -jnp.exp(randn((heads,), scale=0.5))
    dt = jax.nn.softplus(randn((batch, seq, heads)) - 1.0).astype(dtype)
    return (
        randn((batch, seq, heads, head_dim), dtype),
        A,
        randn((batch, seq, groups, state), dtype),
        randn((batch, seq, groups, state), dtype),
        randn((heads,)),
        dt,
        randn((batch, seq, heads * head_dim), dtype) if gate else None,
        randn((batch, heads, head_dim, state)) if initial else None,
    )


def packed(fn):
    """`fn(...) -> (y, state, conv)` as one float32 vector `[y, state]`, for `check_forward_and_grads`."""

    def call(*args):
        y, state, _ = fn(*args)
        return jnp.concatenate([y.astype(jnp.float32).ravel(), state.astype(jnp.float32).ravel()])

    return call


def check_scan(fn, reference, args, dtype=jnp.float32, **tolerances):
    """`fn` against `reference` on `y` and the final state, forward and the VJP of every tensor given."""
    argnums = tuple(i for i, a in enumerate(args) if a is not None)
    check_forward_and_grads(jax.jit(packed(fn)), jax.jit(packed(reference)), list(args), argnums, dtype, **tolerances)
