"""Mean pooling in plain JAX, dense or over packed sequences, with the shared bandwidth-bound custom VJP."""

import jax
import jax.numpy as jnp

from ejkernel.kernels._common.mean_pooling import pool_with_vjp, sequence_lengths, token_segments


def _forward(x, cu_seqlens):
    if cu_seqlens is None:
        return jnp.mean(x, axis=1, dtype=jnp.float32).astype(x.dtype)
    n = cu_seqlens.shape[0] - 1
    sums = jax.ops.segment_sum(x.astype(jnp.float32), token_segments(cu_seqlens, x.shape[0]), num_segments=n)
    lengths = jnp.maximum(sequence_lengths(cu_seqlens), 1).astype(jnp.float32)
    return (sums / lengths.reshape((-1,) + (1,) * (x.ndim - 1))).astype(x.dtype)


def mean_pooling_xla(x: jax.Array, cu_seqlens: jax.Array | None = None, *, cfg=None) -> jax.Array:
    """Mean over axis 1 of `x [B, S, ...]`, or per packed sequence of `x [T, ...]` given `cu_seqlens`."""
    return pool_with_vjp(_forward, x, cu_seqlens)
