"""The merge of two partial attention results: what a split over keys (split-K decode, a shared prefix's
cascade, a ring step) joins its pieces with."""

import jax.numpy as jnp


def merge_states(out_a, lse_a, out_b, lse_b):
    """`(out float32, lse float32)` of the union of two disjoint key sets, from each set's `out [..., D]` and
    natural log-sum-exp `lse [...]` (`out.shape[:-1]`, -inf for a row with no key); such rows in both give zeros
    and -inf, and gradients through them are zero, not NaN."""
    lse_a, lse_b = lse_a.astype(jnp.float32), lse_b.astype(jnp.float32)
    top = jnp.maximum(lse_a, lse_b)
    top = jnp.where(top == -jnp.inf, 0.0, top)
    w_a, w_b = jnp.exp(lse_a - top), jnp.exp(lse_b - top)
    total = w_a + w_b
    nonempty = total > 0.0
    inv = jnp.where(nonempty, 1.0 / jnp.where(nonempty, total, 1.0), 0.0)
    out = out_a.astype(jnp.float32) * (w_a * inv)[..., None] + out_b.astype(jnp.float32) * (w_b * inv)[..., None]
    return out, jnp.where(nonempty, top + jnp.log(jnp.where(nonempty, total, 1.0)), -jnp.inf)
