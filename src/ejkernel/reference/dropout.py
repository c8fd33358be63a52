"""Counter-based dropout bits: the same keep mask in every implementation, forward and backward.

Part of the semantics of dropout, so it lives with the references: every kernel imports this one
definition. The mask is a pure function of (seed, batch·head, query position, key position), so a kernel
recomputes it block by block instead of storing it. The hash is murmur3's
32-bit finaliser applied in a chain. It is written in int32 with masked shifts and a non-negative final
comparison, so it means the same whether a backend's shifts and compares are signed or unsigned
(Triton's lowering of unsigned ops differs from XLA's).
"""

import jax.numpy as jnp
import numpy as np

DEFAULT_DROPOUT_SEED = 0
"""The seed of dropout called without one: the same keep mask at every call. Training should pass a
different `dropout_seed` per step (e.g. drawn from its PRNG key); each seed draws its own mask."""


def _i32(constant: int):
    return jnp.int32(np.array(constant, np.uint32).view(np.int32))


def _shift_right(h, bits: int):
    """Logical right shift of an int32, whatever the backend's `>>` on signed ints does."""
    return (h >> bits) & _i32((1 << (32 - bits)) - 1)


def _fmix32(h):
    h = h ^ _shift_right(h, 16)
    h = h * _i32(0x85EBCA6B)
    h = h ^ _shift_right(h, 13)
    h = h * _i32(0xC2B2AE35)
    return h ^ _shift_right(h, 16)


def dropout_keep(seed, batch_head, q_pos, k_pos, rate: float):
    """Boolean keep mask (broadcast over the index arguments); True with probability `1 - rate`.

    `seed` is an integer scalar, `batch_head` = batch * num_heads + head, positions are absolute.
    """
    i32 = lambda x: jnp.asarray(x).astype(jnp.int32)
    h = _fmix32(i32(seed) ^ (i32(batch_head) * _i32(0x9E3779B9) + _i32(0x7F4A7C15)))
    h = _fmix32(h ^ (i32(q_pos) * _i32(0x27D4EB2F)))
    h = _fmix32(h ^ (i32(k_pos) * _i32(0x165667B1) + _i32(0x61C88647)))
    threshold = jnp.int32(min(int(rate * 2.0**31), 2**31 - 1))
    return _shift_right(h, 1) >= threshold  # 31 uniform bits, compared as non-negative int32
