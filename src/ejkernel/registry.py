"""The kernel registry: every (platform, backend) implementation of every algorithm, with a priority."""

from __future__ import annotations

import dataclasses
import importlib
import threading
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


def current_backend(device: jax.Device | None = None) -> Backend:
    """The backend of `device` (default: JAX's default device); `cuda`/`rocm` count as `GPU`."""
    platform = jax.default_backend() if device is None else device.platform
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

    `loader`, if given, is called once before the first lookup: the global registry uses it to import
    every implementation, so `from ejkernel import kernel_registry` alone knows them all.
    """

    def __init__(self, loader: Callable[[], object] | None = None) -> None:
        self._impls: dict[str, list[Implementation]] = {}
        self._loader = loader
        self._load_lock = threading.RLock()

    def _loaded(self) -> dict[str, list[Implementation]]:
        if self._loader is not None:
            with self._load_lock:
                loader, self._loader = self._loader, None
                if loader is not None:
                    try:
                        loader()
                    except BaseException:
                        self._loader = loader
                        raise
        return self._impls

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


kernel_registry = KernelRegistry(loader=lambda: importlib.import_module("ejkernel.kernels"))
