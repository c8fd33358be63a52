"""Autotuning: the policy that allows it, and the tuner that measures candidates on the device."""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import logging
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from enum import StrEnum
from typing import Any, TypeVar

import jax

from ejkernel.environment import env_flag

POLICY_ENV = "EJKERNEL_AUTOTUNE_POLICY"
LOG_ENV = "EJKERNEL_LOG_AUTOTUNE"
PROGRESS_ENV = "EJKERNEL_AUTOTUNE_PROGRESS"
THREADS_ENV = "EJKERNEL_AUTOTUNE_THREADS"

log = logging.getLogger("ejkernel.autotune")


class AutotunePolicy(StrEnum):
    """`heuristics` (default): never tune, use shipped or heuristic configs; `autotune`: measure on a miss."""

    AUTOTUNE = "autotune"
    HEURISTICS = "heuristics"


_policy_override: contextvars.ContextVar[AutotunePolicy | None] = contextvars.ContextVar(
    "ejkernel_policy", default=None
)


@contextlib.contextmanager
def policy_override(policy: AutotunePolicy | str) -> Iterator[None]:
    """Within the block, use this autotune policy whatever the environment or executor says."""
    token = _policy_override.set(AutotunePolicy(policy))
    try:
        yield
    finally:
        _policy_override.reset(token)


_forward_only: contextvars.ContextVar[bool] = contextvars.ContextVar("ejkernel_forward_autotune_only", default=False)


class forward_autotune_only:
    """Within the block, autotuning a differentiated call times its forward alone, as for inference.

    For serving code whose compiled steps are traced with `jax.grad` somewhere inside but never run
    backward. Configs chosen outside the block are untouched; it nests, and holds per thread and task.
    """

    def __init__(self) -> None:
        self._tokens: list[contextvars.Token] = []

    def __enter__(self) -> forward_autotune_only:
        self._tokens.append(_forward_only.set(True))
        return self

    def __exit__(self, *exc_info: object) -> None:
        _forward_only.reset(self._tokens.pop())


def forward_only_tuning() -> bool:
    """Whether a `forward_autotune_only` block is active here."""
    return _forward_only.get()


def active_policy(executor_policy: AutotunePolicy | None = None) -> AutotunePolicy:
    """Context override, else the executor's own, else `$EJKERNEL_AUTOTUNE_POLICY`, else heuristics."""
    scoped = _policy_override.get()
    if scoped is not None:
        return scoped
    if executor_policy is not None:
        return executor_policy
    value = os.environ.get(POLICY_ENV, "").strip().lower() or AutotunePolicy.HEURISTICS.value
    try:
        return AutotunePolicy(value)
    except ValueError:
        raise ValueError(f"{POLICY_ENV} must be one of {[p.value for p in AutotunePolicy]}, got {value!r}") from None


def env_threads() -> int:
    """`$EJKERNEL_AUTOTUNE_THREADS` (1 when unset or blank); anything but a positive integer is an error."""
    value = os.environ.get(THREADS_ENV, "").strip()
    if not value:
        return 1
    if not value.isdecimal() or int(value) < 1:
        raise ValueError(f"{THREADS_ENV} must be a positive integer, got {value!r}")
    return int(value)


C = TypeVar("C")


def _calibrate(fn: Callable[[], Any], warmup: int, min_sample_s: float) -> int:
    """Warm `fn` up; return how many back-to-back calls fill a sample of about `min_sample_s`."""
    for _ in range(warmup):
        jax.block_until_ready(fn())
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return max(1, math.ceil(min_sample_s / max(time.perf_counter() - start, 1e-6)))


def _interleaved[K](fns: Mapping[K, Callable[[], Any]], inner: Mapping[K, int], repeats: int) -> dict[K, float]:
    """Median seconds per call of each fn over `repeats` rounds, every round one sample of each.

    Each round runs the fns in a fresh (seeded) random order, so that drift of the device (clocks,
    heat) and the state a predecessor leaves (power headroom, caches) fall on every fn alike.
    """
    keys = list(fns)
    order = random.Random(0)
    samples: dict[K, list[float]] = {key: [] for key in keys}
    for _ in range(repeats):
        for key in order.sample(keys, len(keys)):
            start = time.perf_counter()
            out = None
            for _ in range(inner[key]):
                out = fns[key]()
            jax.block_until_ready(out)
            samples[key].append((time.perf_counter() - start) / inner[key])
    return {key: statistics.median(values) for key, values in samples.items()}


def time_fns[K](
    fns: Mapping[K, Callable[[], Any]], *, warmup: int = 3, repeats: int = 20, min_sample_s: float = 0.02
) -> dict[K, float]:
    """Median seconds per call of each `fn()` (the tuner's and the benchmarks' one way of timing).

    Each sample queues enough back-to-back calls to last about `min_sample_s` before waiting for the
    device, so host dispatch overlaps device work and short kernels are not timed as launch latency.
    The fns' samples are interleaved round by round, so their ratios do not depend on when each ran.
    """
    inner = {key: _calibrate(fn, warmup, min_sample_s) for key, fn in fns.items()}
    return _interleaved(fns, inner, repeats)


def time_fn(fn: Callable[[], Any], *, warmup: int = 3, repeats: int = 20, min_sample_s: float = 0.02) -> float:
    """`time_fns` of one fn."""
    return time_fns({0: fn}, warmup=warmup, repeats=repeats, min_sample_s=min_sample_s)[0]


class Tuner:
    """Times candidates: each is prepared (compiled) once and warmed up, then all are timed `repeats`
    times, interleaved (`time_fns`).

    `compile_threads` > 1 (default `$EJKERNEL_AUTOTUNE_THREADS`, else 1) prepares that many candidates at
    once in threads, which overlaps their compilations (the bulk of a tuning); they are still run and timed
    one at a time. The threads start from JAX's default configuration, not the caller's context managers
    (matmul precision, default device), so it is for tuning runs that set none, such as `ejkernel autotune`.

    A candidate whose preparation or run raises is skipped and the reason logged. The first candidate
    (the default: the highest-priority implementation's own config) stays the choice unless another is
    faster by more than `margin` (a fraction): a win smaller than the run-to-run spread of a GPU
    (about 3%) is noise and would flip between runs and machines.
    """

    def __init__(
        self,
        warmup: int = 2,
        repeats: int = 7,
        progress: bool | None = None,
        margin: float = 0.03,
        min_sample_s: float = 0.01,
        compile_threads: int | None = None,
    ) -> None:
        if compile_threads is None:
            compile_threads = env_threads()
        if warmup < 0 or repeats < 1 or margin < 0 or compile_threads < 1:
            raise ValueError(
                "Tuner needs warmup >= 0, repeats >= 1, margin >= 0, compile_threads >= 1, got "
                f"{warmup}, {repeats}, {margin}, {compile_threads}"
            )
        self.warmup, self.repeats, self.margin, self.min_sample_s = warmup, repeats, margin, min_sample_s
        self.compile_threads = compile_threads
        if progress is None:
            progress = env_flag(PROGRESS_ENV)
            progress = sys.stderr.isatty() if progress is None else progress
        self.progress = progress

    def tune(
        self, candidates: Sequence[C], prepare: Callable[[C], Callable[[], Any]], label: str = "autotune"
    ) -> tuple[C, dict[C, float]]:
        """Return the fastest candidate and every successful candidate's median time."""
        runs: dict[C, Callable[[], Any]] = {}
        inner: dict[C, int] = {}
        failures: list[str] = []
        iterator: Any = candidates
        if self.progress:
            from tqdm.auto import tqdm

            iterator = tqdm(candidates, desc=label, leave=False, file=sys.stderr)
        verbose, start = bool(env_flag(LOG_ENV)), time.perf_counter()

        def attempt(candidate: C) -> Callable[[], Any] | Exception:
            if verbose:  # before the attempt: a candidate that kills the process is named in the log
                log.warning("%s: trying %s (%.1f s in)", label, candidate, time.perf_counter() - start)
            try:
                return prepare(candidate)
            except Exception as err:  # skipped below
                return err

        if self.compile_threads > 1:
            with concurrent.futures.ThreadPoolExecutor(self.compile_threads) as pool:
                prepared: Iterable[Callable[[], Any] | Exception] = list(pool.map(attempt, candidates))
        else:
            prepared = map(attempt, candidates)  # each prepared as the loop reaches it

        def skip(candidate: C, err: Exception) -> None:  # a candidate that cannot compile or run: not fatal
            failures.append(f"{candidate}: {type(err).__name__}: {err}")
            level = logging.WARNING if verbose else logging.INFO
            log.log(level, "%s: skipped %s (%s: %s)", label, candidate, type(err).__name__, err)

        for candidate, run in zip(iterator, prepared, strict=True):
            if isinstance(run, Exception):
                skip(candidate, run)
                continue
            try:
                inner[candidate] = _calibrate(run, self.warmup, self.min_sample_s)
                runs[candidate] = run
            except Exception as err:
                skip(candidate, err)
        if not runs:
            raise RuntimeError(f"{label}: every candidate failed:\n  " + "\n  ".join(failures or ["(none given)"]))
        timings = _interleaved(runs, inner, self.repeats)
        if verbose:
            for candidate, seconds in timings.items():
                log.warning("%s: %s took %.3f ms", label, candidate, 1e3 * seconds)
        best = min(timings, key=timings.__getitem__)
        default = next(c for c in candidates if c in timings)
        if timings[default] <= timings[best] * (1 + self.margin):
            best = default
        return best, timings
