"""Value checks of length, offset and index arguments, eagerly and (opted in) under `jit`.

Outside `jit` an op sees the values of such an argument and refuses a bad one with a one-line ValueError.
Under `jit` it sees only shapes, and each op applies the behaviour its docstring states for out-of-range
values (clamped into range, or zeros for what lies outside). With `EJKERNEL_CHECKS=1` the same checks also
run inside compiled programs: a bad value stops the program with the eager error's message (raised from a
host callback; JAX reports it as a runtime error that carries the message). Off by default: the callback
synchronises with the host.

Beside them, the dtype checks every room shares (`require_float`, `require_int`, `require_array`): a wrong
dtype is one TypeError line naming the argument.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ejkernel.environment import env_flag

CHECKS_ENV = "EJKERNEL_CHECKS"


def checks_enabled() -> bool:
    """Whether `EJKERNEL_CHECKS=1` asks for checks inside compiled programs (0 or unset: no; any other
    value is an error naming the variable)."""
    return bool(env_flag(CHECKS_ENV))


def is_traced(*values) -> bool:
    return any(isinstance(v, jax.core.Tracer) for v in values)


def _first_bad(values, valid) -> tuple[tuple[int, ...], object] | None:
    values, valid = np.asarray(values), np.asarray(valid)
    bad = np.argwhere(~np.broadcast_to(valid, values.shape))
    if not len(bad):
        return None
    index = tuple(int(i) for i in bad[0])
    return index, values[index].item()


def _message(name: str, index: tuple[int, ...], value, expected: str) -> str:
    where = "".join(f"[{i}]" for i in index)
    return f"{name}{where} = {value} is outside {expected}"


def check_values(name: str, values, valid, expected: str) -> None:
    """`valid` (bool, elementwise over `values`, broadcastable): the entries allowed. Concrete: ValueError
    `"{name}[i] = v is outside {expected}"` for the first bad entry. Traced: the same error when the
    program runs, if `EJKERNEL_CHECKS=1`; else nothing (the op's documented clamping applies)."""
    if not is_traced(values, valid):
        found = _first_bad(values, valid)
        if found is not None:
            raise ValueError(_message(name, *found, expected))
        return
    if not checks_enabled():
        return

    def raise_if_bad(values, valid):
        found = _first_bad(values, valid)
        if found is not None:
            raise ValueError(_message(name, *found, expected))

    jax.debug.callback(raise_if_bad, jnp.asarray(values), jnp.asarray(valid))


# ---- dtype checks: one TypeError line naming the argument; None (an absent optional argument) passes ----


def _dtype(x) -> jnp.dtype:
    return jnp.dtype(x.dtype) if hasattr(x, "dtype") else jnp.result_type(x)


def require_float(name: str, x) -> None:
    """TypeError `"{name} must be a floating-point array, got dtype {dtype}"` unless `x` has a float dtype."""
    if x is not None and not jnp.issubdtype(_dtype(x), jnp.floating):
        raise TypeError(f"{name} must be a floating-point array, got dtype {_dtype(x)}")


def require_int(name: str, x) -> None:
    """TypeError `"{name} must be an integer array, got dtype {dtype}"` unless `x` has an integer dtype."""
    if x is not None and not jnp.issubdtype(_dtype(x), jnp.integer):
        raise TypeError(f"{name} must be an integer array, got dtype {_dtype(x)}")


def require_array(name: str, x) -> None:
    """TypeError `"{name} must be a jax array, got {type}"` unless `x` is a `jax.Array` (or a tracer)."""
    if x is not None and not isinstance(x, jax.Array | jax.core.Tracer):
        raise TypeError(f"{name} must be a jax array, got {type(x).__name__}")
