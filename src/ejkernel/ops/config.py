"""Frozen, validated, hashable, JSON round-trippable kernel configs.

Every op config is a frozen dataclass deriving from `KernelConfig`; nested parameter groups
(`FwdParams`, `BwdParams`) are dataclasses too. `to_json`/`from_json` round-trip any of them, and
the cache stores configs as JSON with the class name, so a config read back is the one written.
"""

from __future__ import annotations

import dataclasses
import json
import numbers
import typing
from collections.abc import Callable
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
        """The fields, nested configs as dicts; fields left unset (None where None is the default) are
        omitted, as upstream writes them, so `{"platform": ..., "backend": ...}` for a bare config."""
        out: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None and field.default is None:
                continue
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
        """Flat JSON of `to_dict()` plus the class name under "type" (read back by `from_json`)."""
        return json.dumps({"type": type(self).__name__, **self.to_dict()}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ConfigBase:
        """The config `to_json` wrote: of the class its "type" names (which must be `cls` or derive from it),
        else of `cls` itself. Also reads the older `{"type": ..., "fields": {...}}` form."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"not a serialised config: {text[:80]!r}")
        fields = data["fields"] if isinstance(data.get("fields"), dict) and set(data) <= {"type", "fields"} else data
        name = data.get("type")
        target = _CONFIG_TYPES.get(name) if name is not None else (None if cls is ConfigBase else cls)
        if target is None or not issubclass(target, cls):
            raise ValueError(f"not a serialised {cls.__name__}: unknown config type {name!r}")
        return target.from_dict({k: v for k, v in fields.items() if k != "type"})


def is_int(value: Any) -> bool:
    """An integer (Python or NumPy), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


Rule = tuple[str, Callable[[Any], bool]]
"""What a tiling field must be, in words for the error, and the test of a value."""

POSITIVE_INT: Rule = ("a positive int", lambda x: is_int(x) and x > 0)
POWER_OF_TWO: Rule = ("a positive power of two", lambda x: is_int(x) and x > 0 and not x & (x - 1))
BOOL: Rule = ("a bool", lambda x: isinstance(x, bool))


def int_at_least(low: int) -> Rule:
    return f"an int of at least {low}", lambda x: is_int(x) and x >= low


def power_of_two_at_least(low: int) -> Rule:
    return f"a power of two of at least {low}", lambda x: POWER_OF_TWO[1](x) and x >= low


def one_of(*values: Any) -> Rule:
    return " or ".join(map(repr, values)), lambda x: x in values


class KernelTiling(ConfigBase):
    """One implementation's tiling (a config's `*_tiling` field): fields left None keep the kernel's own choice,
    and `RULES` says what a set field must be, checked when the tiling is built (one-line ValueError)."""

    RULES: ClassVar[dict[str, Rule]] = {}

    def __post_init__(self) -> None:
        for name, (rule, ok) in self.RULES.items():
            value = getattr(self, name)
            if value is not None and not ok(value):
                raise ValueError(f"{type(self).__name__}.{name} must be {rule}, got {value!r}")

    def overrides(self) -> dict[str, Any]:
        """The fields that are set: what replaces the kernel's own choices."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}


def _tuples(value: Any) -> Any:
    """JSON gives lists where the config held tuples: turn them back, so the config stays hashable."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _nested_config_type(hint: Any) -> type[ConfigBase] | None:
    for candidate in (hint, *typing.get_args(hint)):
        if isinstance(candidate, type) and issubclass(candidate, ConfigBase):
            return candidate
    return None


UPSTREAM_PARAM_NAMES = {
    "q_blocksize": "block_q",
    "kv_blocksize": "block_k",
    "blocksize_keys": "block_k",
    "blocksize_k": "block_k",
    "blocksize_m": "block_m",
    "blocksize_n": "block_n",
    "blocksize_heads": "block_h",
    "num_key_splits": "num_splits",
}
"""Upstream ejkernel's names of the tiling fields -> ours. Both are accepted and readable."""

UPSTREAM_FIELD_NAMES = {
    "block_q": "q_blocksize",
    "block_k": "kv_blocksize",
    "block_m": "blocksize_m",
    "block_n": "blocksize_n",
    "block_h": "blocksize_heads",
    "num_splits": "num_key_splits",
}
"""Ours -> the upstream name `FwdParams.to_dict` writes (`block_d` has none)."""


@dataclasses.dataclass(frozen=True, init=False)
class FwdParams(ConfigBase):
    """Tiling of a forward kernel. `None` leaves a field to the implementation's default.

    Attention tiles queries by `block_q` and keys by `block_k` (and the head dim by `block_d`); matmuls
    tile rows, the reduction and columns by `block_m`, `block_k`, `block_n`; `block_h` groups heads,
    `num_splits` splits the keys of a decode step. Upstream's names (`q_blocksize`, `kv_blocksize`,
    `blocksize_m`, ... see `UPSTREAM_PARAM_NAMES`) are accepted as keywords and readable as attributes.
    """

    block_q: int | None = None
    block_k: int | None = None
    block_d: int | None = None
    block_m: int | None = None
    block_n: int | None = None
    block_h: int | None = None
    num_splits: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None

    def __init__(self, *positional: int | None, **fields: int | None) -> None:
        names = [f.name for f in dataclasses.fields(self)]
        if len(positional) > len(names):
            raise TypeError(f"{type(self).__name__} takes {len(names)} fields by position, got {len(positional)}")
        for name, value in zip(names, positional, strict=False):
            if name in fields:
                raise TypeError(f"{type(self).__name__} got {name} both by position and by keyword")
            fields[name] = value
        for upstream, ours in UPSTREAM_PARAM_NAMES.items():
            if upstream not in fields:
                continue
            value = fields.pop(upstream)
            if fields.get(ours) not in (None, value):
                raise ValueError(f"{type(self).__name__}: {upstream}={value!r} contradicts {ours}={fields[ours]!r}")
            fields[ours] = value if value is not None else fields.get(ours)
        unknown = sorted(set(fields) - set(names))
        if unknown:
            raise TypeError(f"{type(self).__name__} got unknown fields {unknown}; fields: {names}")
        for name in names:
            object.__setattr__(self, name, fields.get(name))
        for name in ("block_q", "block_k", "block_d", "block_m", "block_n", "block_h", "num_warps"):
            _positive_power_of_two(f"{type(self).__name__}.{name}", getattr(self, name))
        for name in ("num_splits", "num_stages"):
            _positive_int(f"{type(self).__name__}.{name}", getattr(self, name))

    def __repr__(self) -> str:  # only the fields that are set: tilings read at a glance in logs
        set_fields = ", ".join(
            f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self) if getattr(self, f.name) is not None
        )
        return f"{type(self).__name__}({set_fields})"

    def to_dict(self) -> dict[str, Any]:
        """The fields that are set, under upstream's names where upstream has one (`q_blocksize`, ...)."""
        return {UPSTREAM_FIELD_NAMES.get(name, name): value for name, value in super().to_dict().items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)} - set(UPSTREAM_PARAM_NAMES))
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown fields {unknown}")
        return cls(**data)  # the constructor takes our names and upstream's


for _upstream, _ours in UPSTREAM_PARAM_NAMES.items():
    setattr(FwdParams, _upstream, property(lambda self, name=_ours: getattr(self, name)))


@dataclasses.dataclass(frozen=True, init=False)
class BwdParams(FwdParams):
    """Tiling of a backward kernel (same fields as the forward's)."""


PLATFORMS = ("auto", "xla", "triton", "pallas", "cuda")
BACKENDS = ("any", "gpu", "tpu", "cpu")


@dataclasses.dataclass(frozen=True)
class KernelConfig(ConfigBase):
    """Base of every op's config: which platform runs it, on which backend, and how its kernels are tiled.

    `platform="auto"` lets the executor choose among the implementations that run on this device.
    `backend` (`"any"`, `"gpu"`, `"tpu"`, `"cpu"`) pins the device kind the config was meant for: a
    config for another device kind than the current one is refused when it runs, never ignored.
    """

    platform: str = "auto"
    fwd_params: FwdParams | None = None
    bwd_params: BwdParams | None = None
    backend: str = "any"

    allowed_platforms: ClassVar[tuple[str, ...]] = PLATFORMS

    def __post_init__(self) -> None:
        for name, allowed in (("platform", self.allowed_platforms), ("backend", BACKENDS)):
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"{type(self).__name__}.{name} must be one of {allowed}, got {value!r}")
            object.__setattr__(self, name, str(value))  # enum members (Platform.XLA) as their plain names
        for name, kind in (("fwd_params", FwdParams), ("bwd_params", BwdParams)):
            value = getattr(self, name)
            if value is not None and not isinstance(value, kind):
                raise ValueError(f"{type(self).__name__}.{name} must be a {kind.__name__}, got {value!r}")

    def with_platform(self, platform: str) -> Self:
        return dataclasses.replace(self, platform=platform)


def config_platform(cfg: Any) -> str:
    """`cfg.platform`; "auto" for a user's config dataclass without that field."""
    return str(getattr(cfg, "platform", "auto"))


def config_backend(cfg: Any) -> str:
    """`cfg.backend`; "any" for a user's config dataclass without that field."""
    return str(getattr(cfg, "backend", "any"))


def config_with_platform(cfg: Any, platform: str) -> Any:
    """`cfg` set to run on `platform` (a copy; `cfg` itself when it says so already)."""
    if config_platform(cfg) == platform:
        return cfg
    if "platform" not in {f.name for f in dataclasses.fields(cfg)}:
        raise ValueError(f"{type(cfg).__name__} has no platform field, so platform={platform!r} cannot be applied")
    return dataclasses.replace(cfg, platform=platform)


def config_of_type(config_type: type, platform: str) -> Any:
    """The default config of `config_type` for `platform` (a user's dataclass without a platform field:
    its defaults)."""
    if "platform" in {f.name for f in dataclasses.fields(config_type)}:
        return config_type(platform=platform)
    return config_with_platform(config_type(), platform)


def __getattr__(name: str) -> Any:
    """`forward_autotune_only` at upstream's path too, imported on use: the configs load without JAX."""
    if name == "forward_autotune_only":
        from ejkernel.ops.autotune import forward_autotune_only

        return forward_autotune_only
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
