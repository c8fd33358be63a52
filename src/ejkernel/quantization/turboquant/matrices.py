"""The random matrices of TurboQuant: a Haar-random rotation `Π` and the QJL projection `S`, from a seed."""

import numbers

import jax
import jax.numpy as jnp


def _positive_int(name: str, value) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def generate_rotation_matrix(seed: int, head_dim: int, dtype=jnp.float32) -> jax.Array:
    """Orthogonal `[D, D]`: `Q` of the QR factorisation of an i.i.d. standard normal matrix drawn from
    `PRNGKey(seed)`, each column multiplied by the sign of `R`'s diagonal (0 counted as +1), which makes
    the distribution uniform over rotations (Haar). Computed in float32, returned in `dtype`."""
    head_dim = _positive_int("head_dim", head_dim)
    gaussian = jax.random.normal(jax.random.PRNGKey(seed), (head_dim, head_dim), jnp.float32)
    q, r = jnp.linalg.qr(gaussian)
    signs = jnp.where(jnp.diagonal(r) < 0, -1.0, 1.0)
    return (q * signs[None, :]).astype(dtype)


def generate_projection_matrix(seed: int, projection_dim: int, head_dim: int, dtype=jnp.float32) -> jax.Array:
    """`[m, D]` i.i.d. normal from `PRNGKey(seed)` divided by `sqrt(m)`, `m = projection_dim`: the sketch
    `S` whose signs of `S ρ` TurboQuant stores for the key residual (QJL)."""
    projection_dim = _positive_int("projection_dim", projection_dim)
    head_dim = _positive_int("head_dim", head_dim)
    gaussian = jax.random.normal(jax.random.PRNGKey(seed), (projection_dim, head_dim), jnp.float32)
    return (gaussian / jnp.sqrt(jnp.float32(projection_dim))).astype(dtype)
