"""`ejkernel.explain`: what `platform="auto"` would run for a call, without running it."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np


@dataclasses.dataclass(frozen=True)
class Explanation:
    """The dispatch decisions of one traced call, in order: for each op reached, the config and the tier
    that chose it, then the implementation that ran and those that declined first (with their reasons)."""

    lines: tuple[str, ...]

    def __str__(self) -> str:
        return "\n".join(self.lines)


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def dispatch_lines() -> Iterator[list[str]]:
    """The `ejkernel.dispatch` lines of every call traced inside the block (a list filled as they come)."""
    from ejkernel.ops.kernel import dispatch_log

    collect, level = _Collect(), dispatch_log.level
    dispatch_log.addHandler(collect)
    dispatch_log.setLevel(logging.DEBUG)
    try:
        yield collect.lines
    finally:
        dispatch_log.removeHandler(collect)
        dispatch_log.setLevel(level)


def explain(op: str | Callable, *args: Any, **kwargs: Any) -> Explanation:
    """Trace `op(*args, **kwargs)` (no computation: shapes only, `jax.eval_shape`) and report which config
    each ejkernel op it reaches would take and from which tier (cfg=, overlay, caches, autotuner, shipped
    configs, heuristics), which implementation would run, and why each one before it declined.

    `op` is a public op function or its name (`"flash_attention"`). Positional array arguments may be
    arrays or `jax.ShapeDtypeStruct`s (traced); other arguments are passed as they are. A call that is
    differentiated selects its training config instead: to explain that, pass a function that takes
    `jax.grad` of one using the op.
    """
    if isinstance(op, str):
        import ejkernel.modules as modules

        if op not in modules.__all__ or not callable(getattr(modules, op)) or op[0].isupper():
            raise ValueError(f"explain: op must be a public op function or its name, got {op!r}")
        op = getattr(modules, op)
    is_array = lambda x: isinstance(x, jax.Array | np.ndarray | jax.ShapeDtypeStruct)
    arrays = [i for i, a in enumerate(args) if is_array(a)]

    def call(*traced):
        full = list(args)
        for i, a in zip(arrays, traced, strict=True):
            full[i] = a
        return op(*full, **kwargs)

    with dispatch_lines() as lines:
        jax.eval_shape(call, *(args[i] for i in arrays))
    return Explanation(tuple(lines))
