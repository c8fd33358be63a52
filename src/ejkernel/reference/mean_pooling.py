"""Reference mean pooling: the average over the sequence axis, one sequence at a time, in float32."""

import itertools

import jax.numpy as jnp
import numpy as np


def mean_pooling_reference(x, cu_seqlens=None):
    """`x [B, S, ...]` -> `[B, ...]`; with `cu_seqlens [N+1]`, `x [T, ...]` holds N packed sequences -> `[N, ...]`.

    An empty sequence averages to zeros.
    """
    x = jnp.asarray(x, jnp.float32)
    if cu_seqlens is None:
        return jnp.mean(x, axis=1)
    bounds = np.asarray(cu_seqlens)
    rows = []
    for start, end in itertools.pairwise(bounds):
        rows.append(jnp.mean(x[start:end], axis=0) if end > start else jnp.zeros(x.shape[1:], jnp.float32))
    return jnp.stack(rows)
