"""Value checks of length, offset and index arguments, eagerly and (opted in) under `jit`.

Outside `jit` an op sees the values of such an argument and refuses a bad one with a one-line ValueError.
Under `jit` it sees only shapes, and each op applies the behaviour its docstring states for out-of-range
values (clamped into range, or zeros for what lies outside). With `EJKERNEL_CHECKS=1` the same checks also
run inside compiled programs: a bad value stops the program with the eager error's message (raised from a
host callback; JAX reports it as a runtime error that carries the message). Off by default: the callback
synchronises with the host.
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
