"""Shared pieces of the linear-attention tests: fresh inputs, and the check of (out, state) against the reference."""

import jax
import jax.numpy as jnp
import numpy as np

from harness import check_forward_and_grads, randn

B, S, H, HKV, DK, DV = 2, 70, 4, 2, 8, 16  # S spans 3 chunks of 32 (the last partial), sub-chunks of 16


def log_decay(*shape, strength=1.0):
    """Random log decays in (-inf, 0)."""
    return jnp.asarray(-strength * np.logaddexp(0.0, np.asarray(randn(shape))), jnp.float32)


def write_strength(*shape):
    """Random beta in (0, 1)."""
    return jnp.asarray(1.0 / (1.0 + np.exp(-np.asarray(randn(shape)))), jnp.float32)


def qkv(batch=B, seq=S, heads=H, kv_heads=HKV, dtype=jnp.float32):
    shapes = ((batch, seq, heads, DK), (batch, seq, kv_heads, DK), (batch, seq, kv_heads, DV))
    return tuple(randn(shape, dtype) for shape in shapes)


def joined(fn):
    """`fn(...) -> (out, state)` as one flat vector, so that one check covers both."""

    def call(*args):
        out, state = fn(*args)
        return jnp.concatenate([out.astype(jnp.float32).ravel(), state.astype(jnp.float32).ravel()])

    return call


def check(fn, reference, args, dtype=jnp.float32):
    check_forward_and_grads(jax.jit(joined(fn)), jax.jit(joined(reference)), args, tuple(range(len(args))), dtype)


SEGMENTS = np.array([[0] * 5 + [1] * 20 + [-1] * 3 + [1] * 9 + [2] * 33, [-1] * 4 + [3] * 40 + [-1] * 2 + [5] * 24])
