"""Random masks and inputs shared by the sparse attention tests."""

import jax.numpy as jnp
import numpy as np

from harness import randn


def block_mask(batch, heads, q_len, kv_len, block, density=0.4, empty_rows=(1,), seed=0):
    """A random `[batch, heads, q_len, kv_len]` bool mask constant on `block x block` tiles, with the query
    blocks `empty_rows` masked entirely (rows with nothing to attend)."""
    rng = np.random.default_rng(seed)
    n_q, n_k = -(-q_len // block), -(-kv_len // block)
    tiles = rng.random((batch, heads, n_q, n_k)) < density
    tiles[:, :, list(empty_rows)] = False
    return jnp.asarray(np.repeat(np.repeat(tiles, block, 2), block, 3)[:, :, :q_len, :kv_len])


def sorted_segments(batch, length, num_segments=3, pad=0, seed=0):
    """Sorted random segment ids with the last `pad` positions as padding (-1)."""
    rng = np.random.default_rng(seed)
    ids = np.sort(rng.integers(0, num_segments, (batch, length)), axis=1).astype(np.int32)
    if pad:
        ids[:, length - pad :] = -1
    return jnp.asarray(ids)


def qkv(batch, heads, kv_heads, q_len, kv_len, dim, value_dim=None, dtype=jnp.float32):
    """Fresh `[B, H, S, D]` query, key and value."""
    return (
        randn((batch, heads, q_len, dim), dtype),
        randn((batch, kv_heads, kv_len, dim), dtype),
        randn((batch, kv_heads, kv_len, value_dim or dim), dtype),
    )
