"""Errors of ejkernel that callers may catch by name (upstream's names, which its tests import)."""


class EjkernelRuntimeError(RuntimeError):
    """A call that the implementations of an op cannot serve (upstream raises it for the same cases)."""


class NoImplementationError(EjkernelRuntimeError, NotImplementedError):
    """No implementation on this device accepts the call; the message lists each one's reason. Also a
    `NotImplementedError`, which an implementation raises to decline a call."""
