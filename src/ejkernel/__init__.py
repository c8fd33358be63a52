"""ejkernel: fast, exact, differentiable and shardable kernels for JAX."""

from ejkernel.errors import EjkernelRuntimeError
from ejkernel.explain import Explanation, explain
from ejkernel.registry import Backend, KernelRegistry, Platform, kernel_registry
from ejkernel.version import __version__

__all__ = [
    "Backend",
    "EjkernelRuntimeError",
    "Explanation",
    "KernelRegistry",
    "Platform",
    "__version__",
    "explain",
    "kernel_registry",
]
