"""Implementations of every op, per platform; each op module (`ejkernel.modules.operations.<op>`) declares
which of them it runs, and a backend here is imported only when its implementation is first used.

`kernel_registry` is re-exported here because upstream code imports it from `ejkernel.kernels`.
"""

from ejkernel.registry import kernel_registry

__all__ = ["kernel_registry"]
