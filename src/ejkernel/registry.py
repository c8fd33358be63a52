"""The kernel registry: every (platform, backend) implementation of every algorithm, with a priority."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
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


def current_backend() -> Backend:
    """The backend of JAX's default device (`cuda`/`rocm` count as `GPU`)."""
    platform = jax.default_backend()
    if platform in ("gpu", "cuda", "rocm"):
        return Backend.GPU
    return Backend(platform) if platform in Backend._value2member_map_ else Backend.CPU


@dataclasses.dataclass(frozen=True)
class Implementation:
    """One registered implementation of an algorithm."""

    algorithm: str
    platform: Platform
    backend: Backend
    priority: int
    fn: Callable

    def runs_on(self, backend: Backend) -> bool:
        return self.backend in (Backend.ANY, backend)

    def describe(self) -> str:
        return f"{self.platform.value}/{self.backend.value} (priority {self.priority})"


class KernelRegistry:
    """Maps an algorithm name to its implementations; `get` picks the highest priority that matches."""

    def __init__(self) -> None:
        self._impls: dict[str, list[Implementation]] = {}

    def register(
        self, algorithm: str, platform: Platform | str, backend: Backend | str, priority: int = 0
    ) -> Callable[[Callable], Callable]:
        """Decorator: register `fn` as the `platform`/`backend` implementation of `algorithm`."""
        platform, backend = Platform(platform), Backend(backend)

        def decorate(fn: Callable) -> Callable:
            impls = self._impls.setdefault(algorithm, [])
            impls[:] = [i for i in impls if (i.platform, i.backend) != (platform, backend)]
            impls.append(Implementation(algorithm, platform, backend, priority, fn))
            impls.sort(key=lambda i: -i.priority)
            return fn

        return decorate

    def candidates(
        self, algorithm: str, platform: Platform | str | None = None, backend: Backend | str | None = None
    ) -> list[Implementation]:
        """Implementations of `algorithm` matching the filters, best first.

        With no `backend`, only implementations that can run on the current device are returned.
        """
        if algorithm not in self._impls:
            known = ", ".join(sorted(self._impls)) or "none"
            raise ValueError(f"unknown algorithm {algorithm!r}; registered algorithms: {known}")
        impls = self._impls[algorithm]
        if platform is not None:
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
            listed = ", ".join(i.describe() for i in self._impls[algorithm])
            where = f"platform={platform!r}, backend={backend!r}"
            if backend is None:
                where += f" (current device backend: {current_backend().value})"
            raise ValueError(f"no implementation of {algorithm!r} for {where}; registered: {listed}")
        return found[0].fn

    def list_algorithms(self) -> list[str]:
        return sorted(self._impls)

    def list_implementations(self, algorithm: str) -> list[Implementation]:
        """Every implementation of `algorithm`, best first, whatever device it runs on."""
        return list(self._impls.get(algorithm, []))


kernel_registry = KernelRegistry()
