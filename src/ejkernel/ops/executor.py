"""Config selection (seven tiers) and the executor that runs a kernel with the chosen config."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import json
import logging
import time
from collections.abc import Sequence
from importlib import resources
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ejkernel.checked_calls import checked_call
from ejkernel.environment import env_flag
from ejkernel.ops.autotune import LOG_ENV, AutotunePolicy, Tuner, active_policy, forward_only_tuning
from ejkernel.ops.axis_roles import check_axis_roles, follow_roles, splits, strip_unit_axes
from ejkernel.ops.cache import ConfigCache, PersistentCache, overlay_lookup, warn_once
from ejkernel.ops.config import (
    PLATFORMS,
    ConfigBase,
    KernelConfig,
    config_backend,
    config_platform,
    config_with_platform,
)
from ejkernel.ops.fingerprint import describe_device, device_fingerprint
from ejkernel.ops.kernel import FORWARD, TRAIN, Invocation, Kernel, log_dispatch, muted_dispatch
from ejkernel.registry import current_backend

log = logging.getLogger("ejkernel.ops")
_modes_alike = contextvars.ContextVar("ejkernel_modes_alike", default=False)  # set: one config serves both modes


def shipped_config_name(device_kind: str) -> str:
    """File name of the tuned configs shipped for a device kind, e.g. `NVIDIA_H200.json`."""
    return "".join(c if c.isalnum() else "_" for c in device_kind) + ".json"


@functools.cache
def _shipped_configs(device_kind: str) -> dict[str, str]:
    """Tuned configs shipped for a device kind (`ops/tuned/<kind>.json`: `op|signature` -> config JSON)."""
    path = resources.files("ejkernel.ops").joinpath("tuned", shipped_config_name(device_kind))
    try:
        shipped = json.loads(path.read_text()) if path.is_file() else {}
        if not isinstance(shipped, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError, RecursionError) as err:
        warn_once((str(path),), f"ejkernel: ignoring the shipped configs {path}: {err}")
        return {}
    return shipped


def _shipped_config(kernel: Kernel, inv: Invocation) -> KernelConfig | None:
    """The config shipped for this call, if there is one and it can run it here (else one warning)."""
    kind, name = describe_device()["device_kind"], f"{inv.op_id}|{inv.signature}"
    text = _shipped_configs(kind).get(name)
    if text is None:
        return None
    try:
        cfg = ConfigBase.from_json(text)
        reason = _inapplicable(kernel, inv, cfg)
    except Exception as err:  # a malformed shipped config falls back to the heuristic, never fails the call
        cfg, reason = None, f"{type(err).__name__}: {err}"
    if reason is None:
        return cfg
    warn_once(("shipped", kind, name, reason), f"ejkernel: ignoring the config shipped for {kind}, {name}: {reason}")
    return None


def _inapplicable(kernel: Kernel, inv: Invocation, cfg: ConfigBase) -> str | None:
    """Why a stored config cannot serve this call here (None if it can): another op's config type, a backend
    or platform this host lacks, a platform other than the call asks for."""
    if not isinstance(cfg, kernel.config_type):
        return f"a {type(cfg).__name__}, not a {kernel.config_type.__name__}"
    backend, platform, here = config_backend(cfg), config_platform(cfg), current_backend().value
    if backend not in ("any", here):
        return f"backend={backend!r}, but this host is {here}"
    if platform == "auto":
        return None
    if inv.platform not in ("auto", platform):
        return f"platform={platform!r}, but the call asks for platform={inv.platform!r}"
    try:
        missing = not kernel.implementations(platform)
    except Exception:  # an op outside the registry: its own run() judges the platform
        missing = False
    if missing:
        return f"platform={platform!r}, which has no implementation of {kernel.op_id} on this host ({here})"
    return None


class ConfigSelectorChain:
    """Chooses a config: override, overlay, memory, persistent, autotune, heuristics, else an error."""

    def __init__(
        self,
        memory: ConfigCache | None = None,
        persistent: PersistentCache | None = None,
        tuner: Tuner | None = None,
        policy: AutotunePolicy | str | None = None,
        *,
        cache: ConfigCache | None = None,
    ) -> None:
        """`cache` is upstream's name for `memory` (the in-memory tier); give one or the other."""
        if cache is not None and memory is not None and cache is not memory:
            raise ValueError("ConfigSelectorChain: give the in-memory cache as memory= or cache=, not both")
        memory = cache if cache is not None else memory
        self.memory = memory if memory is not None else ConfigCache()
        self.persistent = persistent if persistent is not None else PersistentCache()
        self.tuner = tuner
        self.policy = AutotunePolicy(policy) if policy is not None else None

    def select(self, kernel: Kernel, inv: Invocation, override: KernelConfig | None = None) -> KernelConfig:
        """The config of a call, from the first tier that answers (logged to `ejkernel.dispatch` at DEBUG)."""
        chosen, tier = self._select(kernel, inv, override)
        mode = ", forward and train calls alike" if _modes_alike.get() else f", {inv.mode} call" if inv.mode else ""
        log_dispatch("%s: config %r from the %s%s", inv.op_id, chosen, tier, mode)
        return chosen

    def _select(self, kernel: Kernel, inv: Invocation, override: KernelConfig | None) -> tuple[KernelConfig, str]:
        if override is not None:
            return self._checked(kernel, override, "cfg"), "cfg= argument"
        key = inv.cache_key(device_fingerprint())
        scoped = overlay_lookup(inv.op_id, key)
        if scoped is not None:
            scoped = self._checked(kernel, scoped, "overlay config")
            if config_platform(scoped) == "auto" and inv.platform != "auto":
                scoped = config_with_platform(scoped, inv.platform)
            elif inv.platform not in ("auto", config_platform(scoped)):
                raise ValueError(
                    f"{inv.op_id}: platform={inv.platform!r} contradicts the overlay's "
                    f"platform={config_platform(scoped)!r}"
                )
            return scoped, "overlay"
        cached = self.memory.get(key)
        if cached is not None:
            return cached, "in-memory cache"
        stored = self.persistent.get(key, check=lambda cfg: _inapplicable(kernel, inv, cfg))
        if stored is not None:
            self.memory.put(key, stored)
            return stored, f"persistent cache ({self.persistent.path})"
        if active_policy(self.policy) is AutotunePolicy.AUTOTUNE:
            tuned = self._autotune(kernel, inv, key)
            if tuned is not None:
                return tuned, "autotuner"
        shipped = _shipped_config(kernel, inv)
        if shipped is not None:
            return shipped, f"configs shipped for {describe_device()['device_kind']}"
        try:
            chosen = kernel.heuristic_cfg(inv)
        except Exception as err:
            raise RuntimeError(f"{inv.op_id}: no config could be chosen for this call: {err}") from err
        if not isinstance(chosen, kernel.config_type):
            raise RuntimeError(f"{inv.op_id}: no config could be chosen for this call (heuristics gave {chosen!r})")
        return chosen, "heuristics"

    @staticmethod
    def _checked(kernel: Kernel, cfg: Any, what: str) -> KernelConfig:
        if not isinstance(cfg, kernel.config_type):
            raise TypeError(
                f"{what} for {kernel.op_id} must be a {kernel.config_type.__name__}, got {type(cfg).__name__}"
            )
        return cfg

    def _autotune(self, kernel: Kernel, inv: Invocation, key: str) -> KernelConfig | None:
        candidates = list(dict.fromkeys(kernel.candidate_cfgs(inv)))
        if inv.mode == FORWARD:  # the backward's tiling plays no part: time each forward once
            candidates = list(dict.fromkeys(dataclasses.replace(c, bwd_params=None) for c in candidates))
        if not candidates:
            return None
        start = time.perf_counter()
        with jax.ensure_compile_time_eval():  # concrete stand-ins even while tracing (under jit)
            args, kwargs = kernel.tuning_inputs(inv)
        if env_flag(LOG_ENV):
            jax.block_until_ready((args, kwargs))
            seconds = time.perf_counter() - start
            log.warning("autotune %s: %d candidates, inputs made in %.1f s", inv.op_id, len(candidates), seconds)
        dynamic = {name: value for name, value in kwargs.items() if _passed_as_argument(value, inv.kwargs[name])}
        static = {name: value for name, value in kwargs.items() if name not in dynamic}

        def prepare(cfg: KernelConfig):
            def call(args, dynamic):
                return kernel.run(*args, cfg=cfg, **static, **dynamic)

            if kernel.tune_argnums and inv.mode != FORWARD and not forward_only_tuning():  # forward + backward
                loss = lambda args, dynamic: _float_sum(call(args, dynamic))
                grad = jax.grad(lambda diff, args, dynamic: loss(_put(args, kernel.tune_argnums, diff), dynamic))
                fn = jax.jit(lambda args, dynamic: grad(tuple(args[i] for i in kernel.tune_argnums), args, dynamic))
            else:
                fn = jax.jit(call)
            compiled = fn.lower(args, dynamic).compile()

            def run():
                with jax.ensure_compile_time_eval():  # eagerly, even while an outer jit traces
                    return compiled(args, dynamic)

            return run

        # Lowering runs outside `ensure_compile_time_eval`: under it, the constants inside kernel bodies
        # would be evaluated eagerly and captured, which Pallas kernels refuse.
        best, timings = (self.tuner or Tuner()).tune(candidates, prepare, label=f"autotune {inv.op_id}")
        self.memory.put(key, best)
        if isinstance(best, ConfigBase):  # a user's own config dataclass has no JSON form: memory only
            self.persistent.try_put(key, best, median_seconds=timings[best], candidates=len(candidates))
        log.info("%s: tuned %s (%.3f ms of %d candidates)", inv.op_id, best, 1e3 * timings[best], len(timings))
        return best


def _read_while_tracing(leaf: Any) -> bool:
    """Whether an input is an integer or boolean array given concretely (a mask, segment ids, indices known
    while tracing), which the executor closes over instead of handing it on as a traced argument (to a
    timed candidate, or through the per-mode custom VJP): implementations may read it while tracing, as
    a block-sparse kernel builds its block table from a concrete mask and declines a traced one. Floats
    are data, and stay arguments (a concrete bias closed over would be folded into the program)."""
    return (
        isinstance(leaf, jax.Array | np.ndarray)
        and not isinstance(leaf, jax.core.Tracer)
        and not jnp.issubdtype(leaf.dtype, jnp.inexact)
    )


def _passed_as_argument(value: Any, given: Any) -> bool:
    """Whether a keyword option (`value`, a concrete stand-in of the call's `given`) reaches the timed call
    as a jit argument: arrays do, unless every array the call gave is `_read_while_tracing`."""
    if not any(isinstance(leaf, jax.Array) for leaf in jax.tree_util.tree_leaves(value)):
        return False
    arrays = [leaf for leaf in jax.tree_util.tree_leaves(given) if isinstance(leaf, jax.Array | np.ndarray)]
    return not all(_read_while_tracing(leaf) for leaf in arrays)


def _float_sum(result) -> jax.Array:
    """A scalar that every float output of an op feeds (ops may return tuples: `(out, state)`)."""
    leaves = [x for x in jax.tree_util.tree_leaves(result) if jnp.issubdtype(x.dtype, jnp.floating)]
    return sum(jnp.sum(x.astype(jnp.float32)) for x in leaves)


def _put(args: tuple, positions: tuple[int, ...], values: tuple) -> tuple:
    out = list(args)
    for position, value in zip(positions, values, strict=True):
        out[position] = value
    return tuple(out)


def _apply_pullback(pullback, g):
    """The backward rule of the per-mode custom VJP: the TRAIN implementation's own pullback."""
    return pullback(g)


def _launcher(kernel: Kernel, kwargs: dict[str, Any], chosen: KernelConfig, inv: Invocation):
    """`kernel.run` with `chosen` and the keyword options, as a function of the positional arguments (`chosen`'s
    platform `preferred` where the call asked for `auto`); wrapped in a custom VJP of the kernel's
    `fwd_with_residuals` and `vjp` where it has both."""
    preferred = inv.platform == "auto" and config_platform(chosen) != "auto"
    run = functools.partial(kernel.run, cfg=chosen, **({"preferred": True} if preferred else {}), **kwargs)
    if kernel.fwd_with_residuals is None or kernel.vjp is None:
        return run
    call = jax.custom_vjp(run)
    call.defvjp(
        functools.partial(kernel.fwd_with_residuals, cfg=chosen, **kwargs),
        lambda residuals, g: tuple(kernel.vjp(residuals, g, cfg=chosen, **kwargs)),
    )
    return call


class Executor:
    """Runs a `Kernel`: builds the invocation, selects a config, wires a custom VJP and `shard_map`.

    `checked`: the calls come from public functions that checked their arguments and resolved their defaults;
    while one runs, its implementations find `ejkernel.checked_calls.arguments_checked(op_id)` true and skip
    those checks (each is made once per call). The public functions share such an executor; any other runs
    calls as given, and the implementations check them.
    """

    def __init__(self, chain: ConfigSelectorChain | None = None, *, checked: bool = False) -> None:
        self.chain = chain if chain is not None else ConfigSelectorChain()
        self.checked = checked

    def __call__(
        self,
        kernel: Kernel,
        *args: Any,
        cfg: KernelConfig | None = None,
        platform: str | None = None,
        mesh: jax.sharding.Mesh | None = None,
        in_specs: Sequence[Any] | None = None,
        out_specs: Any = None,
        _cfg: KernelConfig | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run `kernel` on `args`; `_cfg` is upstream's spelling of `cfg`."""
        if _cfg is not None:
            if cfg is not None:
                raise ValueError(f"{kernel.op_id}: give the config as cfg= or _cfg=, not both")
            cfg = _cfg
        if cfg is not None and not isinstance(cfg, kernel.config_type):
            raise TypeError(f"cfg for {kernel.op_id} must be a {kernel.config_type.__name__}, got {type(cfg).__name__}")
        platform = resolve_platform(kernel, platform, cfg)
        if cfg is not None:
            cfg = config_with_platform(cfg, platform)
        given = [n for n, v in (("mesh", mesh), ("in_specs", in_specs), ("out_specs", out_specs)) if v is not None]
        if 0 < len(given) < 3:
            raise ValueError(f"{kernel.op_id}: mesh, in_specs and out_specs go together; got only {', '.join(given)}")
        with checked_call(kernel.op_id) if self.checked else contextlib.nullcontext():
            if not given:
                return self._run(kernel, args, kwargs, cfg, platform)
            return self._sharded(kernel, args, kwargs, cfg, platform, mesh, in_specs, out_specs)

    def _run(self, kernel: Kernel, args, kwargs, cfg, platform):
        """Select the config and run `kernel` on it.

        An op whose configs tile a backward too (`tune_argnums`), given no `cfg`, runs its FORWARD config when
        the call is not differentiated and its TRAIN config when it is: the fastest forward is not always part
        of the fastest forward + backward (e.g. one kernel's forward beside another's backward).
        `jax.custom_vjp` tells the two cases apart at trace time: its primal runs only where no derivative is
        taken (also under jit, vmap and checkpoint), its forward rule where one is; the rule keeps the TRAIN
        implementation's own pullback as residual. Where both modes select one config without tuning, the call
        runs it directly: its implementation's custom VJP is then the call's only one.
        """
        if cfg is not None or not kernel.tune_argnums:
            inv = Invocation(kernel.op_id, tuple(args), dict(kwargs), platform)
            return _launcher(kernel, kwargs, self.chain.select(kernel, inv, cfg), inv)(*args)
        invocations = [Invocation(kernel.op_id, tuple(args), dict(kwargs), platform, mode) for mode in (FORWARD, TRAIN)]
        shared = self._shared_config(kernel, invocations)
        if shared is not None:
            return _launcher(kernel, kwargs, shared, invocations[0])(*args)
        leaves, treedef = jax.tree_util.tree_flatten((tuple(args), dict(kwargs)))
        is_input = lambda leaf: isinstance(leaf, jax.Array | np.ndarray) and not _read_while_tracing(leaf)
        dynamic = [i for i, leaf in enumerate(leaves) if is_input(leaf)]

        def run(mode: str, arrays: list) -> Any:
            full = list(leaves)
            for i, array in zip(dynamic, arrays, strict=True):
                full[i] = array
            a, kw = jax.tree_util.tree_unflatten(treedef, full)
            inv = Invocation(kernel.op_id, a, kw, platform, mode)
            return _launcher(kernel, kw, self.chain.select(kernel, inv), inv)(*a)

        # Partials, not closures: the rules call `run` with no frame of their own between.
        call = jax.custom_vjp(functools.partial(run, FORWARD))
        call.defvjp(functools.partial(jax.vjp, functools.partial(run, TRAIN)), _apply_pullback)
        return call([leaves[i] for i in dynamic])

    def _shared_config(self, kernel: Kernel, invocations: list[Invocation]) -> KernelConfig | None:
        """The config that every mode's invocation selects, if one does without autotuning (None otherwise, and
        where a mode's selection fails: the per-mode VJP then selects, and reports, only in the mode that runs).
        The lookups are silent; the config returned is selected once more, to log one line for both modes."""
        if active_policy(self.chain.policy) is AutotunePolicy.AUTOTUNE:
            return None
        with muted_dispatch():
            try:
                forward, train = (self.chain.select(kernel, inv) for inv in invocations)
            except Exception:
                return None
        if forward != train:
            return None
        token = _modes_alike.set(True)
        try:
            return self.chain.select(kernel, invocations[0])
        finally:
            _modes_alike.reset(token)

    def _sharded(self, kernel, args, kwargs, cfg, platform, mesh, in_specs, out_specs):
        roles = kernel.axis_roles(args, kwargs)
        by_slot = follow_roles(specs_by_slot(kernel.op_id, args, in_specs, mesh), roles)
        present = sorted(by_slot)
        in_specs = tuple(by_slot[i] for i in present)
        array_kwargs = kernel.kwarg_specs(kwargs, in_specs)  # the op's own checks first: their words are its own
        if roles is not None:
            check_axis_roles(kernel.op_id, mesh, args, kwargs, by_slot, roles, out_specs, array_kwargs)
        static_kwargs = {k: v for k, v in kwargs.items() if k not in array_kwargs}

        def body(tensors, dynamic):
            full = list(args)
            for i, t in zip(present, tensors, strict=True):
                full[i] = t
            return self._run(kernel, tuple(full), {**static_kwargs, **dynamic}, cfg, platform)

        mapped = jax.shard_map(
            body,
            mesh=mesh,
            in_specs=(in_specs, array_kwargs),
            out_specs=out_specs,
            check_vma=False,
        )

        def laid_out(tensors, dynamic):
            # On a mesh of explicit axes, shard_map rejects inputs laid out otherwise than the specs say:
            # reshard them (on automatic axes, jit does this by itself).
            explicit = any(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types)
            place = lambda x, spec: jax.sharding.reshard(x, jax.sharding.NamedSharding(mesh, spec)) if explicit else x
            tensors = tuple(place(t, spec) for t, spec in zip(tensors, in_specs, strict=True))
            dynamic = jax.tree_util.tree_map(place, dynamic, array_kwargs)
            return mapped(tensors, dynamic)

        return jax.jit(laid_out)(tuple(args[i] for i in present), {k: kwargs[k] for k in array_kwargs})


def specs_by_slot(op_id: str, args: Sequence[Any], in_specs: Sequence[Any], mesh=None) -> dict[int, Any]:
    """`{position: spec or None}` of the tensor arguments passed (`args[i] is not None`).

    `in_specs` holds one spec per tensor passed, or, as upstream code writes it, one per positional slot
    (None or a spec that splits nothing for the slots not passed; slots past its end, if it holds at least
    as many specs as tensors passed, get None: EasyDeL gives 7 for flash attention's 8 slots). None for
    a tensor passed means "not given": the executor lays it out as the op's axis roles say (sinks with the
    heads, say), else replicated. With `mesh`, axes of size 1 are dropped from every spec: they split nothing.
    """
    in_specs = tuple(strip_unit_axes(spec, mesh) for spec in in_specs)
    present = [i for i, a in enumerate(args) if a is not None]
    if len(in_specs) == len(present):
        return dict(zip(present, in_specs, strict=True))
    if len(present) <= len(in_specs) <= len(args):
        stray = [i for i, spec in enumerate(in_specs) if args[i] is None and splits(spec)]
        if stray:
            raise ValueError(
                f"{op_id}: in_specs[{stray[0]}] = {in_specs[stray[0]]} is given for a tensor argument that was "
                f"not passed (positional slot {stray[0]} is None)"
            )
        return {i: in_specs[i] if i < len(in_specs) else None for i in present}
    raise ValueError(
        f"{op_id}: in_specs needs one spec per tensor argument passed ({len(present)}), or one per positional "
        f"slot (from {len(present)} to {len(args)}), got {len(in_specs)}"
    )


def resolve_platform(kernel: Kernel, platform: str | None, cfg: KernelConfig | None) -> str:
    """One platform from `platform=` and `cfg.platform`; they must agree when both name one."""
    requested = "auto" if platform is None else str(platform)
    allowed = getattr(kernel.config_type, "allowed_platforms", PLATFORMS)
    if requested not in allowed:
        raise ValueError(f"{kernel.op_id}: platform must be one of {allowed}, got {platform!r}")
    if requested != "auto" and "platform" not in {f.name for f in dataclasses.fields(kernel.config_type)}:
        name = kernel.config_type.__name__
        raise ValueError(f"{kernel.op_id}: {name} has no platform field, so platform={requested!r} cannot be applied")
    if cfg is None or config_platform(cfg) == "auto":
        return requested
    if requested not in ("auto", config_platform(cfg)):
        raise ValueError(f"{kernel.op_id}: platform={requested!r} contradicts cfg.platform={config_platform(cfg)!r}")
    return config_platform(cfg)


_default_chain = ConfigSelectorChain()


def create_default_executor(policy: AutotunePolicy | str | None = None, *, checked: bool = False) -> Executor:
    """An executor on the process-wide caches; `policy` overrides `$EJKERNEL_AUTOTUNE_POLICY`; `checked` as
    `Executor`'s (the public functions' executor: their calls come checked)."""
    if policy is None:
        return Executor(_default_chain, checked=checked)
    chain = ConfigSelectorChain(_default_chain.memory, _default_chain.persistent, policy=policy)
    return Executor(chain, checked=checked)


def reset_caches() -> None:
    """Forget every in-memory config (the persistent cache on disk is untouched)."""
    _default_chain.memory.clear()
