"""Length, offset and index arguments: their value checks, and the rule of cumulative offsets under `jit`.

Outside `jit` a bad value is a one-line ValueError (`ejkernel.kernels._common.checks.check_values`; with
`EJKERNEL_CHECKS=1` the same error is raised under `jit` when the program runs). Otherwise, under `jit`,
each op applies the rule its docstring states, here for offsets (`cu_seqlens`): clamped into their valid
range, the op then computes what it computes for the clamped values.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ejkernel.kernels._common.checks import check_values, checks_enabled, is_traced, require_int


def _require_offsets(name: str, cu) -> None:
    require_int(name, cu)
    if cu.ndim != 1 or cu.shape[0] < 2:
        raise ValueError(f"{name} must be [num_seqs + 1] with at least 2 bounds, got shape {cu.shape}")


def check_with(name: str, values, valid, expected: str) -> None:
    """`check_values` with the mask `valid(xp, values)` (xp: numpy for concrete values, else jax.numpy)
    built only where it is looked at: not under `jit` without `EJKERNEL_CHECKS`."""
    traced = is_traced(values)
    if traced and not checks_enabled():
        return
    xp = jnp if traced else np
    values = values if traced else np.asarray(values)
    check_values(name, values, valid(xp, values), expected)


def check_packed(name: str, cu, total: int, *, exact: bool = False) -> None:
    """Bounds `[N + 1]` of N sequences packed along an axis of `total` tokens: integers with
    `0 = cu[0] <= cu[1] <= ... <= cu[N] <= total` (`exact`: `cu[N] == total`)."""
    _require_offsets(name, cu)

    def valid(xp, cu):
        ok = xp.concatenate([cu[:1] == 0, (cu[1:] >= cu[:-1]) & (cu[1:] <= total)])
        return xp.concatenate([ok[:-1], ok[-1:] & (cu[-1:] == total)]) if exact else ok

    ends = f"exactly {total}" if exact else f"at most {total}"
    check_with(name, cu, valid, f"its range: bounds rising from 0, never decreasing, to {ends} (the axis length)")


def clamp_packed(cu, total: int, *, exact: bool = False) -> jax.Array:
    """`check_packed`'s rule under `jit`: each bound clamped into `[previous bound, total]`, the first to 0
    (`exact`: the last to `total`), so that a sequence past the end is empty. Concrete bounds (checked
    eagerly) come back unchanged."""
    if not is_traced(cu):
        return cu
    clamped = lax.cummax(jnp.clip(cu, 0, total).astype(jnp.int32).at[0].set(0))
    return clamped.at[-1].set(total) if exact else clamped


def padded_lengths(name: str, cu, length: int) -> jax.Array:
    """Each row's valid length `[B]` of a padded batch given by bounds `cu [B + 1]` (row b: `cu[b+1] - cu[b]`).

    Valid: `cu[0] == 0` and every length in `[0, length]`. Under `jit` each length is clamped into
    `[0, length]` (a no-op on checked values).
    """
    _require_offsets(name, cu)

    def valid(xp, cu):
        steps = cu[1:] - cu[:-1]
        return xp.concatenate([cu[:1] == 0, (steps >= 0) & (steps <= length)])

    check_with(name, cu, valid, f"its range: bounds rising from 0 by a row length in [0, {length}] each")
    return jnp.clip(cu[1:] - cu[:-1], 0, length).astype(jnp.int32)
