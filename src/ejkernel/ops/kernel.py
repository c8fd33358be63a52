"""`Kernel`: what an operation tells the executor; `Invocation`: one call, reduced to what selects a config."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import json
import logging
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, ClassVar, get_args, get_origin

import jax
import jax.numpy as jnp

from ejkernel.environment import env_flag
from ejkernel.errors import NoImplementationError
from ejkernel.ops.config import FwdParams, KernelConfig, config_backend, config_of_type, config_platform
from ejkernel.registry import Implementation, current_backend, kernel_registry


def _describe(value: Any) -> Any:
    """A JSON-able description of an argument: arrays by shape and dtype, pytrees leaf by leaf."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return [list(value.shape), str(jnp.dtype(value.dtype))]
    if isinstance(value, tuple | list):
        return [_describe(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _describe(v) for k, v in sorted(value.items())}
    leaves, treedef = jax.tree_util.tree_flatten(value)
    if leaves and not (len(leaves) == 1 and leaves[0] is value):
        return {"tree": str(treedef), "leaves": [_describe(leaf) for leaf in leaves]}
    return repr(value)


FORWARD, TRAIN = "forward", "train"

dispatch_log = logging.getLogger("ejkernel.dispatch")
"""At DEBUG, one line per implementation run (at trace time): the op, the platform, and why.
`EJKERNEL_LOG_DISPATCH=1` prints them to standard error."""
DISPATCH_ENV = "EJKERNEL_LOG_DISPATCH"


@functools.cache
def _dispatch_to_stderr() -> None:
    """Once per process: with `EJKERNEL_LOG_DISPATCH=1`, the dispatch lines go to standard error."""
    if env_flag(DISPATCH_ENV):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("ejkernel: %(message)s"))
        dispatch_log.addHandler(handler)
        dispatch_log.setLevel(logging.DEBUG)


_dispatch_muted = contextvars.ContextVar("ejkernel_dispatch_muted", default=False)


def log_dispatch(message: str, *args: Any) -> None:
    """One `ejkernel.dispatch` line at DEBUG (to standard error with `EJKERNEL_LOG_DISPATCH=1`), unless muted."""
    if _dispatch_muted.get():
        return
    _dispatch_to_stderr()
    dispatch_log.debug(message, *args)


@contextlib.contextmanager
def muted_dispatch() -> Iterator[None]:
    """No dispatch lines inside the block: for configs looked up but not (yet) used."""
    token = _dispatch_muted.set(True)
    try:
        yield
    finally:
        _dispatch_muted.reset(token)


@dataclasses.dataclass(frozen=True)
class Invocation:
    """One call of an op: its positional tensors, its keyword options and the requested platform.

    `mode` is set for ops whose configs tile a backward too (`Kernel.tune_argnums`): `FORWARD` for a
    call that is not differentiated, `TRAIN` for one whose backward will run. Each has its own config,
    tuned on what it runs (the forward alone, or forward + backward).
    """

    op_id: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    platform: str = "auto"
    mode: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in (None, FORWARD, TRAIN):
            raise ValueError(f"Invocation.mode must be None, {FORWARD!r} or {TRAIN!r}, got {self.mode!r}")

    @property
    def signature(self) -> str:
        """Shapes, dtypes, options and mode: calls with equal signatures can share a config.

        A keyword value with an `invocation_options()` method (an op's call object, such as attention's
        `AttentionCall`) is described as the keyword options it stands for, each by its own name.
        """
        options: dict[str, Any] = {}
        for name, value in self.kwargs.items():
            expand = getattr(value, "invocation_options", None)
            options.update(expand() if callable(expand) else {name: value})
        described = {"args": _describe(self.args), "kwargs": _describe(options), "platform": self.platform}
        if self.mode is not None:
            described["mode"] = self.mode
        return json.dumps(described, sort_keys=True, separators=(",", ":"))

    def cache_key(self, fingerprint: str) -> str:
        return f"{self.op_id}|{fingerprint}|{self.signature}"

    def sample_inputs(self, seed: int = 0) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Concrete `(args, kwargs)` for timing: concrete values as given, traced ones by stand-ins.

        Floats become random normals; integers zeros (one segment, offset 0); booleans True (attend).
        """
        keys = iter(jax.random.split(jax.random.PRNGKey(seed), 64))

        def stand_in(leaf):
            if not isinstance(leaf, jax.core.Tracer):
                return leaf
            if jnp.issubdtype(leaf.dtype, jnp.floating):
                return _random_normals(next(keys), leaf.shape, leaf.dtype)
            if leaf.dtype == jnp.bool_:
                return jnp.ones(leaf.shape, bool)
            return jnp.zeros(leaf.shape, leaf.dtype)

        return jax.tree_util.tree_map(stand_in, (self.args, self.kwargs))


STAND_IN_BLOCK = 2**24  # the most random normals a stand-in draws; larger ones repeat them


def _random_normals(key, shape, dtype):
    """Normals of `shape` in `dtype`, at most `STAND_IN_BLOCK` of them drawn and repeated to fill the rest:
    timing needs no independent values, and a paged cache's stand-in can hold 2**31 elements (batch 64,
    context 32768): an H100 tuning process died of a segfault before its first candidate with two such
    stand-ins drawn whole in float32."""
    size = math.prod(shape)
    if size <= STAND_IN_BLOCK:
        return jax.random.normal(key, shape, dtype)
    return jnp.resize(jax.random.normal(key, (STAND_IN_BLOCK,), dtype), shape)


class Kernel[Cfg: KernelConfig, Out]:
    """An operation as the executor sees it.

    Subclasses set `op_id` and `config_type` (or write `class MyKernel(Kernel[MyConfig, Array])`, which
    sets `config_type = MyConfig`, and pass the op id to `super().__init__("my_op")`; without one the
    op id is the class name), and may override:
    - `heuristic_cfg(inv)`: the config to use when nothing was measured;
    - `candidate_cfgs(inv)`: the configs autotuning may try (across platforms when `inv.platform` is auto);
    - `call_impl(impl, args, kwargs, cfg)`: how a registered implementation receives a config;
    - `fwd_with_residuals` and `vjp`: a custom VJP around `run` (the executor wires it when both exist);
    - `kwarg_specs(kwargs, in_specs)`: shard specs of array-valued options under `mesh=`;
    - `busy_integers(args)`: stand-ins for integer inputs that set the amount of work (lengths, group
      sizes), used when autotuning a call that traced them (their values are unknown, and the generic
      zeros would time an empty problem);
    - `tune_argnums`: positional arguments to differentiate when autotuning a training call, for ops
      whose configs tile the backward too; such ops get one config for calls that are not
      differentiated and one for calls that are (`Invocation.mode`). Empty: one config, forward timed.
    """

    op_id: str
    config_type: ClassVar[type[KernelConfig]] = KernelConfig
    tune_argnums: ClassVar[tuple[int, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for base in getattr(cls, "__orig_bases__", ()):
            if get_origin(base) is Kernel and get_args(base) and isinstance(get_args(base)[0], type):
                config = get_args(base)[0]
                if not dataclasses.is_dataclass(config):
                    raise TypeError(
                        f"{cls.__name__}: the config type of Kernel[...] must be a dataclass "
                        f"(ejkernel.ops.KernelConfig or any frozen dataclass), got {config.__name__}"
                    )
                cls.config_type = config

    def __init__(self, op_id: str | None = None) -> None:
        if op_id is not None:
            self.op_id = op_id
        elif not hasattr(self, "op_id"):
            self.op_id = type(self).__name__

    def implementations(self, platform: str = "auto") -> list[Implementation]:
        """Registered implementations that can run on this device, best first."""
        return kernel_registry.candidates(self.op_id, None if platform == "auto" else platform)

    def call_impl(self, impl: Implementation, args: Sequence[Any], kwargs: dict[str, Any], cfg: KernelConfig):
        """Run `impl` with `cfg`; `run` calls `impl.fn` inline instead where a subclass keeps this default."""
        return impl.fn(*args, cfg=cfg, **kwargs)

    def run(self, *args: Any, cfg: KernelConfig, preferred: bool = False, **kwargs: Any) -> Any:
        """Run with `cfg`: on its platform's implementation, or, with `platform="auto"`, on the first
        implementation that accepts the call. `preferred`: the config's platform was chosen for a call that
        asked for `auto` (by a heuristic, a cache or the tuner), so it is tried first and, where it declines,
        `auto`'s order serves the call; a platform the caller named runs or fails with its reason."""
        here, backend, platform = current_backend().value, config_backend(cfg), config_platform(cfg)
        if backend not in ("any", here):
            raise ValueError(
                f"{self.op_id}: {type(cfg).__name__}.backend={backend!r} cannot run on this device ({here}); "
                f"use backend='any' or '{here}'"
            )
        # The default hook is called inline (below, twice): one frame fewer between a public function and its kernel.
        hook = None if getattr(self.call_impl, "__func__", None) is Kernel.call_impl else self.call_impl
        if platform == "auto":
            order = self.implementations()
        else:
            first = self.implementations(platform)
            if not first:
                kernel_registry.get(self.op_id, platform)  # raises the registry's error, listing what exists
            if not preferred:
                impl = first[0]
                out = impl.fn(*args, cfg=cfg, **kwargs) if hook is None else hook(impl, args, kwargs, cfg)
                log_dispatch(
                    "%s: %s serves the call (platform=%r asked for)", self.op_id, impl.platform.value, platform
                )
                return out
            order = first + [impl for impl in self.implementations() if impl not in first]
        reasons = []
        for impl in order:
            try:
                out = impl.fn(*args, cfg=cfg, **kwargs) if hook is None else hook(impl, args, kwargs, cfg)
            except NotImplementedError as err:
                reasons.append(f"{impl.platform.value}: {err}")
                continue
            how = "platform='auto'" if platform == "auto" else f"platform={platform!r} preferred"
            declined = f"; declined first: {'; '.join(reasons)}" if reasons else ""
            log_dispatch("%s: %s serves the call (%s)%s", self.op_id, impl.platform.value, how, declined)
            return out
        raise NoImplementationError(
            f"{self.op_id}: no implementation on this device accepts the call: " + "; ".join(reasons)
        )

    def busy_integers(self, args: tuple[Any, ...]) -> dict[int, Any]:
        """Position -> integer stand-in (given the other stand-ins, `args`) of the inputs whose values set the
        work; none by default."""
        del args
        return {}

    def tuning_inputs(self, inv: Invocation) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Concrete inputs to time candidates on: `inv.sample_inputs()`, with `busy_integers` for traced slots."""
        args, kwargs = inv.sample_inputs()
        busy = self.busy_integers(args)
        traced = lambda i: isinstance(inv.args[i], jax.core.Tracer)
        return tuple(busy[i] if i in busy and traced(i) else a for i, a in enumerate(args)), kwargs

    def heuristic_cfg(self, inv: Invocation) -> KernelConfig:
        return config_of_type(self.config_type, inv.platform)

    def platform_cfgs(self, platform: str, inv: Invocation) -> Iterable[KernelConfig]:
        """Configs worth timing for one platform; by default a few square tilings (a user's own config
        dataclass: its defaults)."""
        yield config_of_type(self.config_type, platform)
        if not issubclass(self.config_type, KernelConfig):
            return
        for block in (64, 128):
            yield self.config_type(platform=platform, fwd_params=FwdParams(block_q=block, block_k=block))

    def candidate_cfgs(self, inv: Invocation) -> Iterable[KernelConfig]:
        platforms = [inv.platform] if inv.platform != "auto" else [i.platform.value for i in self.implementations()]
        for platform in dict.fromkeys(platforms):
            yield from self.platform_cfgs(platform, inv)

    def kwarg_specs(self, kwargs: dict[str, Any], in_specs: Sequence[Any]) -> dict[str, Any]:
        """Shard specs for array-valued keyword options; default: replicated on every device."""
        from jax.sharding import PartitionSpec

        return {
            name: jax.tree_util.tree_map(lambda _: PartitionSpec(), value)
            for name, value in kwargs.items()
            if any(isinstance(leaf, jax.Array | jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(value))
        }

    def axis_roles(self, args: tuple, kwargs: dict[str, Any]) -> tuple[dict[int, tuple[str, tuple]], Any] | None:
        """For calls on a mesh: `({position: (name, role per axis)}, output roles)` (`axis_roles.py`); None: the
        op checks its specs itself (`kwarg_specs`)."""
        return None

    fwd_with_residuals: Callable[..., tuple[Any, Any]] | None = None
    vjp: Callable[..., tuple[Any, ...]] | None = None
