"""Counter-based dropout bits: the same keep mask in every implementation, forward and backward.

The mask is a pure function of (seed, batch, head, query position, key position), so a kernel recomputes
it block by block instead of storing it, and the reference reproduces it exactly. The hash is murmur3's
32-bit finaliser applied in a chain; it uses only integer ops that Pallas (Triton and Mosaic) lowers.
"""

import jax.numpy as jnp


def _fmix32(h):
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def dropout_keep(seed, batch_head, q_pos, k_pos, rate: float):
    """Boolean keep mask (broadcast over the index arguments); True with probability `1 - rate`.

    `seed` is a uint32/int32 scalar, `batch_head` = batch * num_heads + head, positions are absolute.
    """
    u32 = lambda x: jnp.asarray(x).astype(jnp.uint32)
    h = _fmix32(u32(seed) ^ (u32(batch_head) * jnp.uint32(0x9E3779B9) + jnp.uint32(0x7F4A7C15)))
    h = _fmix32(h ^ (u32(q_pos) * jnp.uint32(0x27D4EB2F)))
    h = _fmix32(h ^ (u32(k_pos) * jnp.uint32(0x165667B1) + jnp.uint32(0x61C88647)))
    threshold = jnp.uint32(min(int(rate * 2.0**32), 2**32 - 1))
    return h >= threshold
