"""The kernel registry: every (platform, backend) implementation of every algorithm, with a priority.

Each op module declares its implementations, best first, as `IMPLEMENTATIONS` (`implementations(...)`);
the global registry reads them on its first lookup and imports a backend only when its function is used.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import pkgutil
import threading
from collections.abc import Callable, Iterable, Iterator
from enum import StrEnum

import jax


class Platform(StrEnum):
    """What an implementation is written in."""

    XLA = "xla"
    TRITON = "triton"
    PALLAS = "pallas"
    CUDA = "cuda"


class Backend(StrEnum):
    """What device an implementation runs on (`ANY`: every device JAX supports)."""

    GPU = "gpu"
    TPU = "tpu"
    CPU = "cpu"
    ANY = "any"


def current_backend(device: jax.Device | None = None) -> Backend:
    """The backend of `device` (default: JAX's default device); `cuda`/`rocm` count as `GPU`."""
    platform = jax.default_backend() if device is None else device.platform
    if platform in ("gpu", "cuda", "rocm"):
        return Backend.GPU
    return Backend(platform) if platform in Backend._value2member_map_ else Backend.CPU


@dataclasses.dataclass(frozen=True)
class Implementation:
    """One implementation of an algorithm: what it is written in, where it runs, its rank and its function.

    `target` is the function, or where to find it as `"module:attribute"`: declared implementations name
    it so, and the backend's module is imported only when `fn` is first read.
    """

    algorithm: str
    platform: Platform
    backend: Backend
    priority: int
    target: Callable | str = dataclasses.field(repr=False)

    @functools.cached_property
    def fn(self) -> Callable:
        """The function (a `"module:attribute"` target imported on first use)."""
        return self.target if not isinstance(self.target, str) else resolve(self.target)

    def runs_on(self, backend: Backend) -> bool:
        return self.backend in (Backend.ANY, backend)

    def describe(self) -> str:
        return f"{self.platform.value}/{self.backend.value} (priority {self.priority})"


def resolve(target: str) -> Callable:
    """The function a `"module:attribute"` target names, its module imported now: how the op modules reach a
    backend, and how a backend reaches another's core (never by an import statement: see docs/design.md)."""
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def implementations(algorithm: str, *declared: tuple[Platform, Backend, str]) -> tuple[Implementation, ...]:
    """`algorithm`'s implementations as an op module declares them: `(platform, backend, "module:attribute")`
    each, best first. The position gives the priority, 100 for the first and 10 less for each next, so that
    a registration with a priority of its own sorts among them."""
    pairs = [(platform, backend) for platform, backend, _ in declared]
    if len(set(pairs)) != len(pairs):
        raise ValueError(f"{algorithm}: a platform/backend pair is declared twice: {pairs}")
    return tuple(
        Implementation(algorithm, Platform(platform), Backend(backend), 100 - 10 * rank, target)
        for rank, (platform, backend, target) in enumerate(declared)
    )


ALIASES = {
    "kda": "kernel_delta_attention",
    "mamba1": "state_space_v1",
    "ssm1": "state_space_v1",
    "mamba2": "state_space_v2",
    "ssm2": "state_space_v2",
}
"""Other names upstream ejkernel gives an algorithm; lookups accept them, listings show the canonical name."""


class KernelRegistry:
    """Maps an algorithm name to its implementations; `get` picks the highest priority that matches.

    `loader`, if given, is called once, before the first lookup, for the declared implementations: the global
    registry's loader reads every op module's `IMPLEMENTATIONS`, so `from ejkernel import kernel_registry`
    alone knows them all. A declared implementation does not replace one registered earlier for the same
    algorithm, platform and backend.
    """

    def __init__(self, loader: Callable[[], Iterable[Implementation]] | None = None) -> None:
        self._impls: dict[str, list[Implementation]] = {}
        self._loader = loader
        self._load_lock = threading.RLock()

    def _loaded(self) -> dict[str, list[Implementation]]:
        if self._loader is not None:
            with self._load_lock:
                loader, self._loader = self._loader, None
                if loader is not None:
                    try:
                        for impl in loader():
                            registered = self._impls.get(impl.algorithm, [])
                            if all((i.platform, i.backend) != (impl.platform, impl.backend) for i in registered):
                                self._add(impl)
                    except BaseException:
                        self._loader = loader
                        raise
        return self._impls

    def _add(self, impl: Implementation) -> None:
        """Adds `impl` in its priority's place (after those of equal priority), replacing the algorithm's
        implementation of the same platform and backend."""
        impls = self._impls.setdefault(impl.algorithm, [])
        impls[:] = [i for i in impls if (i.platform, i.backend) != (impl.platform, impl.backend)]
        impls.append(impl)
        impls.sort(key=lambda i: -i.priority)

    @staticmethod
    def canonical_name(algorithm: str) -> str:
        """The registered name of `algorithm` (aliases such as `kda` or `mamba2` resolved)."""
        return ALIASES.get(algorithm, algorithm)

    def register(
        self, algorithm: str, platform: Platform | str, backend: Backend | str, priority: int = 0
    ) -> Callable[[Callable], Callable]:
        """Decorator: register `fn` as the `platform`/`backend` implementation of `algorithm`."""
        platform, backend = Platform(platform), Backend(backend)
        algorithm = self.canonical_name(algorithm)

        def decorate(fn: Callable) -> Callable:
            self._add(Implementation(algorithm, platform, backend, priority, fn))
            return fn

        return decorate

    def candidates(
        self, algorithm: str, platform: Platform | str | None = None, backend: Backend | str | None = None
    ) -> list[Implementation]:
        """Implementations of `algorithm` matching the filters, best first.

        With no `backend`, only implementations that can run on the current device are returned.
        """
        registered = self._loaded()
        name = self.canonical_name(algorithm)
        if name not in registered:
            known = ", ".join(sorted(registered)) or "none"
            raise ValueError(f"unknown algorithm {algorithm!r}; registered algorithms: {known}")
        impls = registered[name]
        if platform is not None and platform != "auto":
            impls = [i for i in impls if i.platform == Platform(platform)]
        if backend is None:
            here = current_backend()
            impls = [i for i in impls if i.runs_on(here)]
        else:
            impls = [i for i in impls if i.runs_on(Backend(backend))]
        return impls

    def get(
        self, algorithm: str, platform: Platform | str | None = None, backend: Backend | str | None = None
    ) -> Callable:
        """The highest-priority implementation matching the filters; `ValueError` listing what exists."""
        found = self.candidates(algorithm, platform, backend)
        if not found:
            listed = ", ".join(i.describe() for i in self._impls[self.canonical_name(algorithm)])
            where = f"platform={platform!r}, backend={backend!r}"
            if backend is None:
                where += f" (current device backend: {current_backend().value})"
            raise ValueError(f"no implementation of {algorithm!r} for {where}; registered: {listed}")
        return found[0].fn

    def list_algorithms(self) -> list[str]:
        return sorted(self._loaded())

    def list_implementations(self, algorithm: str) -> list[Implementation]:
        """Every implementation of `algorithm`, best first, whatever device it runs on."""
        return list(self._loaded().get(self.canonical_name(algorithm), []))


def declared_implementations() -> Iterator[Implementation]:
    """The `IMPLEMENTATIONS` of every op module (`ejkernel.modules.operations.<op>`), importing them."""
    operations = importlib.import_module("ejkernel.modules.operations")
    for module in pkgutil.iter_modules(operations.__path__, f"{operations.__name__}."):
        yield from getattr(importlib.import_module(module.name), "IMPLEMENTATIONS", ())


kernel_registry = KernelRegistry(loader=declared_implementations)
