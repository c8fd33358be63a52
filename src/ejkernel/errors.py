"""Errors of ejkernel that callers may catch by name (upstream's names, which its tests import)."""


class EjkernelRuntimeError(RuntimeError):
    """A call that no implementation can serve, or one an explicitly requested implementation does not
    support; upstream raises it for the same cases."""
