"""Check once: whether the call an implementation serves was checked by its op's public function.

A public function (`modules/operations/<op>.py`) checks its arguments and resolves their defaults, then runs
its `Kernel` on the executor the public functions share (`create_default_executor(checked=True)`). While that
executor runs the call, `arguments_checked(op_id)` is true for that op, and the implementation skips the checks
the public function made. Called any other way (`kernel_registry.get(op, platform)(...)`, tests, an executor
of one's own), an implementation finds it false and checks. The mark names one op: an implementation that calls
another op's implementation directly still has that one check its arguments.

A leaf module: the executor sets the mark, implementations in every room read it.
"""

import contextlib
import contextvars

_CHECKED_OP: contextvars.ContextVar[str | None] = contextvars.ContextVar("ejkernel_checked_op", default=None)


@contextlib.contextmanager
def checked_call(op_id: str):
    """Within: the running call of `op_id` was checked and canonicalised by its public function."""
    token = _CHECKED_OP.set(op_id)
    try:
        yield
    finally:
        _CHECKED_OP.reset(token)


def arguments_checked(op_id: str) -> bool:
    """Whether the call of `op_id` running now was checked by its public function (so its checks can be skipped)."""
    return _CHECKED_OP.get() == op_id
