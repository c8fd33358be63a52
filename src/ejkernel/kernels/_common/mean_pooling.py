"""What every mean pooling implementation shares: packed-sequence bookkeeping and the backward.

The backward is a broadcast of each sequence's cotangent over its tokens, which XLA already runs at
memory bandwidth, so every platform wraps its forward in `pool_with_vjp`.
"""

import jax
import jax.numpy as jnp
import numpy as np

from ejkernel.kernels._common.bounds import clamp_packed


def sequence_lengths(cu_seqlens: jax.Array) -> jax.Array:
    return (cu_seqlens[1:] - cu_seqlens[:-1]).astype(jnp.int32)


def token_segments(cu_seqlens: jax.Array, num_tokens: int) -> jax.Array:
    """Index of the sequence each packed token belongs to (tokens past the last bound get N)."""
    return jnp.searchsorted(cu_seqlens[1:], jnp.arange(num_tokens, dtype=cu_seqlens.dtype), side="right")


def mean_pooling_bwd(g: jax.Array, x_shape: tuple[int, ...], x_dtype, cu_seqlens: jax.Array | None) -> jax.Array:
    """Cotangent of `x`: each token receives its sequence's cotangent divided by the sequence length."""
    g = g.astype(jnp.float32)
    if cu_seqlens is None:
        return jnp.broadcast_to((g / x_shape[1])[:, None], x_shape).astype(x_dtype)
    inv_len = 1.0 / jnp.maximum(sequence_lengths(cu_seqlens), 1).astype(jnp.float32)
    scaled = jnp.concatenate([g * inv_len.reshape((-1,) + (1,) * (g.ndim - 1)), jnp.zeros_like(g[:1])])
    return scaled[token_segments(cu_seqlens, x_shape[0])].astype(x_dtype)


def pool_with_vjp(forward, x: jax.Array, cu_seqlens: jax.Array | None) -> jax.Array:
    """`forward(x, cu_seqlens)` with the shared backward (integer `cu_seqlens` gets no cotangent); traced
    `cu_seqlens` are clamped first (`clamp_packed`: each bound into `[previous bound, T]`, the first to 0)."""

    @jax.custom_vjp
    def pooled(x, cu_seqlens):
        return forward(x, cu_seqlens)

    def fwd(x, cu_seqlens):
        return forward(x, cu_seqlens), cu_seqlens

    def bwd(cu_seqlens, g):
        cu_ct = None if cu_seqlens is None else np.zeros(cu_seqlens.shape, jax.dtypes.float0)
        return mean_pooling_bwd(g, x.shape, x.dtype, cu_seqlens), cu_ct

    pooled.defvjp(fwd, bwd)
    return pooled(x, None if cu_seqlens is None else clamp_packed(cu_seqlens, x.shape[0]))
