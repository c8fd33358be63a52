"""Frozen, validated, hashable, JSON round-trippable kernel configs.

Every op config is a frozen dataclass deriving from `KernelConfig`; nested parameter groups
(`FwdParams`, `BwdParams`) are dataclasses too. `to_json`/`from_json` round-trip any of them, and
the cache stores configs as JSON with the class name, so a config read back is the one written.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any, ClassVar, Self

_CONFIG_TYPES: dict[str, type[ConfigBase]] = {}


def _positive_power_of_two(name: str, value: int | None, *, optional: bool = True) -> None:
    if value is None and optional:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0 or value & (value - 1):
        raise ValueError(f"{name} must be a positive power of two, got {value!r}")


def _positive_int(name: str, value: int | None) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


@dataclasses.dataclass(frozen=True)
class ConfigBase:
    """Base of every config: JSON round trip and a registry of config types by class name."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _CONFIG_TYPES[cls.__name__] = cls

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            out[field.name] = value.to_dict() if isinstance(value, ConfigBase) else value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for field in dataclasses.fields(cls):
            if field.name not in data:
                continue
            value = data[field.name]
            nested = _nested_config_type(hints[field.name])
            if nested and isinstance(value, dict):
                value = nested.from_dict(value)
            kwargs[field.name] = _tuples(value)
        unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown fields {sorted(unknown)}")
        return cls(**kwargs)

    def to_json(self) -> str:
        return json.dumps({"type": type(self).__name__, "fields": self.to_dict()}, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> ConfigBase:
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("fields"), dict):
            raise ValueError(f"not a serialised config: {text[:80]!r}")
        cls = _CONFIG_TYPES.get(data.get("type", ""))
        if cls is None:
            raise ValueError(f"unknown config type {data.get('type')!r}")
        return cls.from_dict(data["fields"])


def _tuples(value: Any) -> Any:
    """JSON gives lists where the config held tuples: turn them back, so the config stays hashable."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _nested_config_type(hint: Any) -> type[ConfigBase] | None:
    for candidate in (hint, *typing.get_args(hint)):
        if isinstance(candidate, type) and issubclass(candidate, ConfigBase):
            return candidate
    return None


@dataclasses.dataclass(frozen=True)
class FwdParams(ConfigBase):
    """Tiling of a forward kernel. `None` leaves a field to the implementation's default."""

    block_q: int | None = None
    block_k: int | None = None
    block_d: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None

    def __post_init__(self) -> None:
        for name in ("block_q", "block_k", "block_d", "num_warps"):
            _positive_power_of_two(f"{type(self).__name__}.{name}", getattr(self, name))
        _positive_int(f"{type(self).__name__}.num_stages", self.num_stages)


@dataclasses.dataclass(frozen=True)
class BwdParams(FwdParams):
    """Tiling of a backward kernel (same fields as the forward's)."""


PLATFORMS = ("auto", "xla", "triton", "pallas", "cuda")


@dataclasses.dataclass(frozen=True)
class KernelConfig(ConfigBase):
    """Base of every op's config: which platform runs it and how its kernels are tiled.

    `platform="auto"` lets the executor choose among the implementations that run on this device.
    """

    platform: str = "auto"
    fwd_params: FwdParams | None = None
    bwd_params: BwdParams | None = None

    allowed_platforms: ClassVar[tuple[str, ...]] = PLATFORMS

    def __post_init__(self) -> None:
        if self.platform not in self.allowed_platforms:
            raise ValueError(
                f"{type(self).__name__}.platform must be one of {self.allowed_platforms}, got {self.platform!r}"
            )
        for name, kind in (("fwd_params", FwdParams), ("bwd_params", BwdParams)):
            value = getattr(self, name)
            if value is not None and not isinstance(value, kind):
                raise ValueError(f"{type(self).__name__}.{name} must be a {kind.__name__}, got {value!r}")

    def with_platform(self, platform: str) -> Self:
        return dataclasses.replace(self, platform=platform)
