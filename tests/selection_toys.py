"""The toy op of the selection tests: it multiplies its input by `cfg.fwd_params.block_q`, so the factor in
the output names the config that ran (see `test_selection`); a counting tuner and an executor of its own."""

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from ejkernel import Backend, Platform, kernel_registry
from ejkernel.ops import (
    ConfigCache,
    ConfigSelectorChain,
    Executor,
    FwdParams,
    Invocation,
    Kernel,
    KernelConfig,
    PersistentCache,
    Tuner,
    device_fingerprint,
)

TOY_OP = "toy_select_op"
HEURISTIC, OVERRIDE, OVERLAY, MEMORY, PERSISTENT = 2, 4, 8, 16, 32
SLOW, FAST, MEDIUM = 64, 128, 256
SLEEP_MS = {SLOW: 20, FAST: 1, MEDIUM: 10}


@dataclasses.dataclass(frozen=True)
class ToySelectConfig(KernelConfig):
    """Config of the toy op: `fwd_params.block_q` is the factor, `num_stages` a sleep in ms."""


def toy_cfg(factor: int, platform: str = "auto", sleep_ms: int | None = None) -> ToySelectConfig:
    return ToySelectConfig(platform=platform, fwd_params=FwdParams(block_q=factor, num_stages=sleep_ms))


def toy_xla(x, cfg):
    params = cfg.fwd_params
    if params is not None and params.num_stages:
        seconds = params.num_stages / 1000

        def slow(v):
            time.sleep(seconds)
            return v

        x = jax.pure_callback(slow, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
    return x * (params.block_q if params is not None and params.block_q else 1)


kernel_registry.register(TOY_OP, Platform.XLA, Backend.ANY)(toy_xla)


class ToyKernel(Kernel):
    op_id = TOY_OP
    config_type = ToySelectConfig

    def __init__(self, candidates=None):
        self.runs = 0
        self.heuristic_calls = 0
        self.candidates = candidates

    def run(self, *args, cfg, **kwargs):
        self.runs += 1
        return super().run(*args, cfg=cfg, **kwargs)

    def heuristic_cfg(self, inv):
        self.heuristic_calls += 1
        return toy_cfg(HEURISTIC, inv.platform)

    def candidate_cfgs(self, inv):
        if self.candidates is not None:
            return list(self.candidates)
        return [toy_cfg(n, inv.platform, SLEEP_MS[n]) for n in (SLOW, FAST, MEDIUM)]


class CountingTuner(Tuner):
    """A quick tuner that counts how often it tunes and what it prepares."""

    def __init__(self, compile_threads=1):
        super().__init__(warmup=1, repeats=3, progress=False, compile_threads=compile_threads)
        self.tunes = 0
        self.prepared = []
        self.timings = None

    def tune(self, candidates, prepare, label="autotune"):
        self.tunes += 1

        def counted(candidate):
            self.prepared.append(candidate)
            return prepare(candidate)

        best, self.timings = super().tune(candidates, counted, label)
        return best, self.timings


def toy_input():
    return jnp.arange(1.0, 5.0, dtype=jnp.float32)


def factor(out, x) -> float:
    out, x = np.asarray(out), np.asarray(x)
    ratio = out / x
    assert np.allclose(ratio, ratio.flat[0]), f"not a uniform scaling: {out} / {x}"
    return float(ratio.flat[0])


def toy_key(x, platform="auto", op_id=TOY_OP) -> str:
    return Invocation(op_id, (x,), {}, platform).cache_key(device_fingerprint())


def make_executor(policy=None, tuner=None) -> Executor:
    """An executor with its own memory cache, the (per-test) persistent cache and a counting tuner."""
    return Executor(ConfigSelectorChain(ConfigCache(), PersistentCache(), tuner or CountingTuner(), policy))
