"""Config selection, tier by tier, through the executor, with toy kernels whose output reveals the config.

The toy op multiplies its input by `cfg.fwd_params.block_q`, so the factor in the output names the
config that ran: 2 heuristics, 4 `cfg=`, 8 overlay, 16 memory cache, 32 persistent cache, and 64, 128,
256 the autotune candidates (128 is the fastest).
"""

import contextlib
import dataclasses
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ejkernel import Backend, Platform, kernel_registry
from ejkernel.explain import dispatch_lines
from ejkernel.modules import MeanPooling, MeanPoolingConfig, mean_pooling
from ejkernel.ops import (
    AutotunePolicy,
    BwdParams,
    ConfigBase,
    FwdParams,
    Invocation,
    Kernel,
    KernelConfig,
    PersistentCache,
    create_default_executor,
    device_fingerprint,
    overlay_cache,
    policy_override,
    reset_caches,
)
from selection_toys import (
    FAST,
    HEURISTIC,
    MEDIUM,
    MEMORY,
    OVERLAY,
    OVERRIDE,
    PERSISTENT,
    SLEEP_MS,
    SLOW,
    TOY_OP,
    CountingTuner,
    ToyKernel,
    factor,
    make_executor,
    toy_cfg,
    toy_input,
    toy_key,
    toy_xla,
)

pytestmark = pytest.mark.lowest

# --- tier 1: cfg= override ---------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["executor", "policy_override", "env"])
@pytest.mark.parametrize("policy", ["heuristics", "autotune"])
def test_override_wins_under_every_policy_over_every_tier(source, policy, monkeypatch):
    tuner = CountingTuner()
    executor = make_executor(policy if source == "executor" else None, tuner)
    if source == "env":
        monkeypatch.setenv("EJKERNEL_AUTOTUNE_POLICY", policy)
    scope = policy_override(policy) if source == "policy_override" else contextlib.nullcontext()
    kernel, x = ToyKernel(), toy_input()
    key = toy_key(x)
    executor.chain.memory.put(key, toy_cfg(MEMORY))
    executor.chain.persistent.put(key, toy_cfg(PERSISTENT))
    before = executor.chain.persistent.entries()
    with scope, overlay_cache({TOY_OP: toy_cfg(OVERLAY), key: toy_cfg(OVERLAY)}):
        out = executor(kernel, x, cfg=toy_cfg(OVERRIDE))
    assert factor(out, x) == OVERRIDE
    assert tuner.tunes == 0 and kernel.heuristic_calls == 0
    assert executor.chain.persistent.entries() == before
    assert executor.chain.memory.get(key) == toy_cfg(MEMORY)


@pytest.mark.parametrize("policy", ["heuristics", "autotune"])
def test_override_is_never_cached(policy):
    executor = create_default_executor(policy=policy)
    executor.chain.tuner = CountingTuner()
    kernel, x = ToyKernel(), toy_input()
    assert factor(executor(kernel, x, cfg=toy_cfg(OVERRIDE)), x) == OVERRIDE
    assert executor.chain.tuner.tunes == 0
    assert PersistentCache().entries() == {}
    assert not PersistentCache().path.exists()
    assert len(executor.chain.memory) == 0
    # The next call without cfg= is not influenced by the one-off override.
    with policy_override("heuristics"):
        assert factor(executor(kernel, x), x) == HEURISTIC


def test_override_platform_is_filled_in_from_platform_argument():
    kernel, x = ToyKernel(), toy_input()
    seen = []
    kernel.run = lambda *a, cfg, **kw: seen.append(cfg) or Kernel.run(kernel, *a, cfg=cfg, **kw)
    out = make_executor()(kernel, x, cfg=toy_cfg(OVERRIDE), platform="xla")
    assert factor(out, x) == OVERRIDE
    assert seen == [toy_cfg(OVERRIDE, "xla")]


def test_platform_contradicting_cfg_is_value_error():
    kernel, x = ToyKernel(), toy_input()
    with pytest.raises(ValueError, match="contradicts"):
        make_executor()(kernel, x, platform="xla", cfg=toy_cfg(OVERRIDE, "triton"))
    with pytest.raises(ValueError, match="contradicts"):
        make_executor()(kernel, x, platform=Platform.TRITON, cfg=toy_cfg(OVERRIDE, "xla"))
    # Agreeing or auto is fine.
    assert factor(make_executor()(kernel, x, platform="xla", cfg=toy_cfg(OVERRIDE, "xla")), x) == OVERRIDE
    assert factor(make_executor()(kernel, x, platform="auto", cfg=toy_cfg(OVERRIDE, "xla")), x) == OVERRIDE


def test_unknown_platform_is_value_error():
    with pytest.raises(ValueError, match="platform"):
        make_executor()(ToyKernel(), toy_input(), platform="tpu")


def test_cfg_of_another_kernel_config_type_is_type_error():
    with pytest.raises(TypeError, match="ToySelectConfig"):
        make_executor()(ToyKernel(), toy_input(), cfg=MeanPoolingConfig(platform="xla"))
    with pytest.raises(TypeError, match="ToySelectConfig"):
        make_executor()(ToyKernel(), toy_input(), cfg=KernelConfig())


@pytest.mark.parametrize("bad", [FwdParams(block_q=4), {"platform": "xla"}, "xla"], ids=["params", "dict", "str"])
def test_cfg_that_is_not_a_config_is_type_error(bad):
    with pytest.raises(TypeError, match="ToySelectConfig"):
        make_executor()(ToyKernel(), toy_input(), cfg=bad)


# --- tier 2: overlay ---------------------------------------------------------------------------------


def test_overlay_applies_only_inside_its_block():
    executor, kernel, x = make_executor(), ToyKernel(), toy_input()
    assert factor(executor(kernel, x), x) == HEURISTIC
    with overlay_cache({TOY_OP: toy_cfg(OVERLAY)}):
        assert factor(executor(kernel, x), x) == OVERLAY
        assert factor(executor(kernel, 2 * jnp.ones((3, 5))), 2 * jnp.ones((3, 5))) == OVERLAY  # every call
    assert factor(executor(kernel, x), x) == HEURISTIC
    assert PersistentCache().entries() == {}
    assert len(executor.chain.memory) == 0


def test_overlay_ends_even_when_block_raises():
    executor, kernel, x = make_executor(), ToyKernel(), toy_input()
    with pytest.raises(KeyError), overlay_cache({TOY_OP: toy_cfg(OVERLAY)}):
        raise KeyError("boom")
    assert factor(executor(kernel, x), x) == HEURISTIC


def test_overlay_of_other_op_does_not_apply():
    executor, kernel, x = make_executor(), ToyKernel(), toy_input()
    with overlay_cache({"mean_pooling": MeanPoolingConfig(platform="xla")}):
        assert factor(executor(kernel, x), x) == HEURISTIC


def test_nested_overlays_innermost_wins():
    executor, kernel, x = make_executor(), ToyKernel(), toy_input()
    with overlay_cache({TOY_OP: toy_cfg(OVERLAY)}):
        with overlay_cache({TOY_OP: toy_cfg(MEMORY)}):
            assert factor(executor(kernel, x), x) == MEMORY
            with overlay_cache({"some_other_op": toy_cfg(PERSISTENT)}):
                assert factor(executor(kernel, x), x) == MEMORY  # an unrelated inner overlay changes nothing
        assert factor(executor(kernel, x), x) == OVERLAY
    assert factor(executor(kernel, x), x) == HEURISTIC


def test_overlay_keyed_by_full_cache_key():
    executor, kernel, x = make_executor(), ToyKernel(), toy_input()
    other = jnp.arange(1.0, 9.0, dtype=jnp.float32)  # another shape: another key
    with overlay_cache({toy_key(x): toy_cfg(OVERLAY)}):
        assert factor(executor(kernel, x), x) == OVERLAY
        assert factor(executor(kernel, other), other) == HEURISTIC
        # The key names the platform too: the same shapes with platform="xla" are another call.
        assert factor(executor(kernel, x, platform="xla"), x) == HEURISTIC


def test_overlay_full_key_beats_op_id_in_one_overlay_and_inner_beats_outer():
    executor, kernel, x = make_executor(), ToyKernel(), toy_input()
    with overlay_cache({TOY_OP: toy_cfg(OVERLAY), toy_key(x): toy_cfg(MEMORY)}):
        assert factor(executor(kernel, x), x) == MEMORY
    with overlay_cache({toy_key(x): toy_cfg(MEMORY)}), overlay_cache({TOY_OP: toy_cfg(OVERLAY)}):
        assert factor(executor(kernel, x), x) == OVERLAY


def test_overlay_of_wrong_type_is_type_error():
    with overlay_cache({TOY_OP: MeanPoolingConfig()}), pytest.raises(TypeError, match="ToySelectConfig"):
        make_executor()(ToyKernel(), toy_input())


def test_overlay_beats_autotune_and_does_not_tune():
    tuner = CountingTuner()
    executor, kernel, x = make_executor("autotune", tuner), ToyKernel(), toy_input()
    with overlay_cache({TOY_OP: toy_cfg(OVERLAY)}):
        assert factor(executor(kernel, x), x) == OVERLAY
    assert tuner.tunes == 0
    assert PersistentCache().entries() == {}


# --- tiers 3 and 4: memory and persistent caches -----------------------------------------------------


def test_memory_cache_hit():
    executor, kernel, x = create_default_executor(), ToyKernel(), toy_input()
    executor.chain.memory.put(toy_key(x), toy_cfg(MEMORY))
    assert factor(executor(kernel, x), x) == MEMORY
    assert kernel.heuristic_calls == 0
    other = jnp.ones((2, 3))
    assert factor(executor(kernel, other), other) == HEURISTIC  # another signature misses
    reset_caches()
    assert factor(executor(kernel, x), x) == HEURISTIC


def test_memory_cache_hit_skips_autotune():
    tuner = CountingTuner()
    executor, kernel, x = make_executor("autotune", tuner), ToyKernel(), toy_input()
    executor.chain.memory.put(toy_key(x), toy_cfg(MEMORY))
    assert factor(executor(kernel, x), x) == MEMORY
    assert tuner.tunes == 0


def test_persistent_cache_hit_fills_memory():
    executor, kernel, x = create_default_executor(), ToyKernel(), toy_input()
    key = toy_key(x)
    PersistentCache().put(key, toy_cfg(PERSISTENT))
    assert factor(executor(kernel, x), x) == PERSISTENT
    assert executor.chain.memory.get(key) == toy_cfg(PERSISTENT)
    assert kernel.heuristic_calls == 0


def test_persistent_cache_hit_skips_autotune():
    tuner = CountingTuner()
    executor, kernel, x = make_executor("autotune", tuner), ToyKernel(), toy_input()
    PersistentCache().put(toy_key(x), toy_cfg(PERSISTENT))
    assert factor(executor(kernel, x), x) == PERSISTENT
    assert tuner.tunes == 0


def test_persistent_entry_of_another_config_type_is_ignored():
    executor, kernel, x = make_executor(), ToyKernel(), toy_input()
    PersistentCache().put(toy_key(x), MeanPoolingConfig(platform="xla"))
    assert factor(executor(kernel, x), x) == HEURISTIC


def test_each_tier_shadows_the_ones_below():
    executor, kernel, x = make_executor(), ToyKernel(), toy_input()
    key = toy_key(x)
    assert factor(executor(kernel, x), x) == HEURISTIC
    executor.chain.persistent.put(key, toy_cfg(PERSISTENT))
    assert factor(executor(kernel, x), x) == PERSISTENT
    executor.chain.memory.put(key, toy_cfg(MEMORY))
    assert factor(executor(kernel, x), x) == MEMORY
    with overlay_cache({TOY_OP: toy_cfg(OVERLAY)}):
        assert factor(executor(kernel, x), x) == OVERLAY
        assert factor(executor(kernel, x, cfg=toy_cfg(OVERRIDE)), x) == OVERRIDE


def test_persistent_cache_survives_a_new_process():
    """An autotuned config written here is selected by a fresh process using the same cache dir."""
    x = jax.random.normal(jax.random.PRNGKey(7), (2, 8, 4), jnp.float32)
    with policy_override("autotune"):
        mean_pooling(x)
    entries = PersistentCache().entries()
    assert len(entries) == 1
    (key,) = entries
    assert key.startswith("mean_pooling|")
    tuned = ConfigBase.from_json(entries[key]["config"])
    heuristic = MeanPooling().heuristic_cfg(Invocation("mean_pooling", (x, None), {"chunk_size": 32}))
    assert tuned != heuristic  # so the child can only have found it on disk
    code = (
        "import jax.numpy as jnp\n"
        "from ejkernel.modules import MeanPooling\n"
        "from ejkernel.ops import Invocation, create_default_executor\n"
        "x = jnp.ones((2, 8, 4), jnp.float32)\n"
        "inv = Invocation('mean_pooling', (x, None), {'chunk_size': 32}, 'auto')\n"
        "print('CFG=' + create_default_executor().chain.select(MeanPooling(), inv).to_json())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    line = next(s for s in done.stdout.splitlines() if s.startswith("CFG="))
    assert ConfigBase.from_json(line[4:]) == tuned


# --- tier 5: autotune --------------------------------------------------------------------------------


def test_autotune_times_candidates_and_stores_the_winner():
    tuner = CountingTuner()
    executor = create_default_executor(policy="autotune")
    executor.chain.tuner = tuner
    kernel, x = ToyKernel(), toy_input()
    key = toy_key(x)
    candidates = [toy_cfg(n, sleep_ms=SLEEP_MS[n]) for n in (SLOW, FAST, MEDIUM)]

    assert factor(executor(kernel, x), x) == FAST
    assert tuner.tunes == 1
    assert tuner.prepared == candidates  # each prepared exactly once
    assert set(tuner.timings) == set(candidates)
    winner = toy_cfg(FAST, sleep_ms=SLEEP_MS[FAST])
    assert min(tuner.timings, key=tuner.timings.get) == winner
    assert kernel.heuristic_calls == 0
    runs_after_first = kernel.runs

    assert executor.chain.memory.get(key) == winner
    stored = PersistentCache().entries()[key]
    assert ConfigBase.from_json(stored["config"]) == winner
    assert stored["candidates"] == 3 and stored["median_seconds"] > 0

    # Second call: a memory hit, no tuning, one more run.
    assert factor(executor(kernel, x), x) == FAST
    assert tuner.tunes == 1 and len(tuner.prepared) == 3
    assert kernel.runs == runs_after_first + 1

    # The default (heuristics) executor shares the caches and sees the tuned config.
    assert factor(create_default_executor()(kernel, x), x) == FAST

    # With the memory forgotten, the disk answers: still no tuning.
    reset_caches()
    assert factor(executor(kernel, x), x) == FAST
    assert tuner.tunes == 1


@pytest.mark.parametrize("source", ["env", "policy_override"])
def test_autotune_enabled_by_env_or_override(source, monkeypatch):
    tuner = CountingTuner()
    executor, kernel, x = make_executor(None, tuner), ToyKernel(), toy_input()
    if source == "env":
        monkeypatch.setenv("EJKERNEL_AUTOTUNE_POLICY", "autotune")
        scope = contextlib.nullcontext()
    else:
        scope = policy_override(AutotunePolicy.AUTOTUNE)
    with scope:
        assert factor(executor(kernel, x), x) == FAST
        assert factor(executor(kernel, x), x) == FAST
    assert tuner.tunes == 1
    assert PersistentCache().get(toy_key(x)) == toy_cfg(FAST, sleep_ms=SLEEP_MS[FAST])


def test_autotune_under_jit():
    tuner = CountingTuner()
    executor, kernel, x = make_executor("autotune", tuner), ToyKernel(), toy_input()
    out = jax.jit(lambda v: executor(kernel, v))(x)
    assert factor(out, x) == FAST
    assert tuner.tunes == 1


PALLAS_TOY_OP = "toy_pallas_tune_op"


def _toy_pallas(x, cfg):
    """A Pallas (interpret-mode) kernel whose body uses grid indices and in-kernel constants."""
    from jax.experimental import pallas as pl

    def body(x_ref, o_ref):
        o_ref[...] = x_ref[...] + pl.program_id(0).astype(jnp.float32) + jnp.ones(x_ref.shape, jnp.float32)

    return pl.pallas_call(body, out_shape=x, grid=(2,), interpret=True)(x) * cfg.fwd_params.block_q


kernel_registry.register(PALLAS_TOY_OP, Platform.XLA, Backend.ANY)(_toy_pallas)


class PallasToyKernel(ToyKernel):
    op_id = PALLAS_TOY_OP


@pytest.mark.parametrize("threads", [1, 4])
def test_autotune_under_jit_times_pallas_kernels(threads):
    """Candidates that run Pallas kernels are compiled normally (not under eager constant evaluation), also
    when threads compile them while the caller's jit is tracing."""
    tuner = CountingTuner(compile_threads=threads)
    kernel = PallasToyKernel(candidates=[toy_cfg(FAST), toy_cfg(MEDIUM)])
    executor, x = make_executor("autotune", tuner), toy_input()
    jax.jit(lambda v: executor(kernel, v))(x)
    assert set(tuner.timings) == {toy_cfg(FAST), toy_cfg(MEDIUM)}


STRUCTURE_TOY_OP = "toy_structure_tune_op"


def _toy_structure(x, cfg, table, scale):
    """Reads its integer `table` while tracing (as a block-sparse kernel reads a concrete mask) and declines
    a traced one; `scale`, a float option, is data."""
    if isinstance(table, jax.core.Tracer):
        raise NotImplementedError("this implementation needs the table while tracing")
    return toy_xla(x, cfg) * scale + float(np.asarray(table).sum())


kernel_registry.register(STRUCTURE_TOY_OP, Platform.XLA, Backend.ANY)(_toy_structure)


class StructureToyKernel(ToyKernel):
    op_id = STRUCTURE_TOY_OP


def test_autotune_keeps_concrete_integer_options_concrete():
    """A concrete integer option reaches the timed candidates concrete, under an outer jit too (the
    block-sparse Mosaic kernels declined every candidate when tuning handed them a traced mask)."""
    tuner = CountingTuner()
    candidates = [toy_cfg(n, sleep_ms=SLEEP_MS[n]) for n in (MEDIUM, FAST)]  # the winner clearly fastest
    kernel = StructureToyKernel(candidates=candidates)
    executor, x, table = make_executor("autotune", tuner), toy_input(), jnp.array([1, 2], jnp.int32)
    out = jax.jit(lambda v, s: executor(kernel, v, table=table, scale=s))(x, jnp.float32(0.5))
    assert set(tuner.timings) == set(candidates)
    np.testing.assert_allclose(out, x * 0.5 * FAST + 3)


def test_autotune_skips_a_failing_candidate():
    broken = toy_cfg(SLOW, platform="cuda")  # no CUDA implementation: preparing it fails
    kernel = ToyKernel(candidates=[broken, toy_cfg(FAST)])
    tuner = CountingTuner()
    executor, x = make_executor("autotune", tuner), toy_input()
    assert factor(executor(kernel, x), x) == FAST
    assert set(tuner.timings) == {toy_cfg(FAST)}


def test_autotune_with_every_candidate_failing_is_runtime_error_naming_op():
    kernel = ToyKernel(candidates=[toy_cfg(SLOW, platform="cuda"), toy_cfg(FAST, platform="pallas")])
    with pytest.raises(RuntimeError, match=TOY_OP):
        make_executor("autotune")(kernel, toy_input())
    assert PersistentCache().entries() == {}


def test_autotune_without_candidates_falls_back_to_heuristics():
    kernel, x = ToyKernel(candidates=[]), toy_input()
    tuner = CountingTuner()
    assert factor(make_executor("autotune", tuner)(kernel, x), x) == HEURISTIC
    assert tuner.tunes == 0


# --- forward-only and training calls ------------------------------------------------------------------


class TrainedToyKernel(ToyKernel):
    """A toy op whose configs would tile a backward: one config per mode."""

    tune_argnums = (0,)


def mode_key(x, mode) -> str:
    return Invocation(TOY_OP, (x,), {}, "auto", mode).cache_key(device_fingerprint())


def test_differentiated_calls_run_the_train_config_the_others_the_forward_config():
    executor, kernel, x = make_executor(), TrainedToyKernel(), toy_input()
    executor.chain.memory.put(mode_key(x, "forward"), toy_cfg(MEMORY))
    executor.chain.memory.put(mode_key(x, "train"), toy_cfg(PERSISTENT))
    call = lambda v: executor(kernel, v)
    slope = lambda f: float(jax.grad(lambda v: jnp.sum(f(v)))(x)[0])
    with dispatch_lines() as lines:
        assert factor(call(x), x) == MEMORY
    configs = [line.rsplit(", ", 1)[-1] for line in lines if ": config " in line]
    assert configs == ["forward call"]  # the mode that runs, and only it
    assert factor(jax.jit(call)(x), x) == MEMORY
    assert factor(jax.vmap(call)(x[None]), x[None]) == MEMORY
    assert slope(call) == PERSISTENT
    assert slope(jax.jit(call)) == PERSISTENT
    assert slope(jax.checkpoint(call)) == PERSISTENT
    assert float(jax.jit(jax.grad(lambda v: jnp.sum(call(v))))(x)[0]) == PERSISTENT
    second = jax.grad(lambda v: jnp.sum(jax.grad(lambda w: jnp.sum(call(w) ** 2))(v)))(x)
    np.testing.assert_allclose(second, 2 * PERSISTENT**2)  # the train config's pullback is differentiable


def test_concrete_integer_options_reach_both_modes_concrete():
    """The per-mode custom VJP closes over a concrete integer option instead of tracing it through (the
    structure toy declines a traced table), in forward and training calls, eager and under jit."""

    class TrainedStructureKernel(StructureToyKernel):
        tune_argnums = (0,)

    executor, kernel, x = make_executor(), TrainedStructureKernel(), toy_input()
    table = jnp.array([1, 2], jnp.int32)
    call = lambda v: executor(kernel, v, table=table, scale=jnp.float32(0.5))
    np.testing.assert_allclose(jax.jit(call)(x), x * 0.5 * HEURISTIC + 3)
    np.testing.assert_allclose(jax.grad(lambda v: jnp.sum(call(v)))(x), np.full(4, 0.5 * HEURISTIC))


def test_forward_calls_tune_forward_tilings_only_training_calls_every_candidate():
    with_backward = lambda n, b: dataclasses.replace(toy_cfg(n), bwd_params=BwdParams(block_q=b))
    candidates = [with_backward(FAST, 16), with_backward(FAST, 32), with_backward(MEDIUM, 16)]
    tuner = CountingTuner()
    executor, kernel, x = make_executor("autotune", tuner), TrainedToyKernel(candidates), toy_input()
    executor(kernel, x)
    assert tuner.prepared == [toy_cfg(FAST), toy_cfg(MEDIUM)]  # the backward's tiling stripped, then deduplicated
    tuner.prepared.clear()
    jax.grad(lambda v: jnp.sum(executor(kernel, v)))(x)
    assert tuner.prepared == candidates
    assert tuner.tunes == 2
    stored = PersistentCache().entries()
    assert mode_key(x, "forward") in stored and mode_key(x, "train") in stored


def test_forward_autotune_only_times_training_calls_forward_only(monkeypatch):
    """EasyDeL's `with forward_autotune_only():` around compiled serving steps: a training call tuned inside
    the block times its forward alone (no gradient traced per candidate); it nests, and ends with the block."""
    from ejkernel.ops import forward_autotune_only
    from ejkernel.ops.config import forward_autotune_only as at_upstream_path

    assert at_upstream_path is forward_autotune_only
    grad, traced = jax.grad, []
    monkeypatch.setattr(jax, "grad", lambda *a, **k: traced.append(1) or grad(*a, **k))
    kernel = TrainedToyKernel([toy_cfg(n) for n in (SLOW, FAST, MEDIUM)])
    train = lambda x: grad(lambda v: jnp.sum(make_executor("autotune")(kernel, v)))(x)
    with forward_autotune_only() as outer, forward_autotune_only():
        train(toy_input())
    assert isinstance(outer, forward_autotune_only) and traced == []
    train(toy_input()[:3])  # another signature: tuned again, outside the block
    assert len(traced) == 3  # one per candidate


def test_invocation_mode_is_checked():
    with pytest.raises(ValueError, match="mode"):
        Invocation(TOY_OP, (), {}, "auto", "inference")


# --- tier 6: heuristics ------------------------------------------------------------------------------


def test_heuristics_by_default_without_tuning():
    tuner = CountingTuner()
    executor, kernel, x = make_executor(None, tuner), ToyKernel(), toy_input()
    assert factor(executor(kernel, x), x) == HEURISTIC
    assert factor(executor(kernel, x), x) == HEURISTIC
    assert tuner.tunes == 0 and tuner.prepared == []
    assert kernel.heuristic_calls >= 1
    assert PersistentCache().entries() == {}
    assert factor(create_default_executor()(kernel, x), x) == HEURISTIC


def test_heuristics_policy_wins_over_env_and_override_wins_over_executor(monkeypatch):
    monkeypatch.setenv("EJKERNEL_AUTOTUNE_POLICY", "autotune")
    tuner = CountingTuner()
    kernel, x = ToyKernel(), toy_input()
    assert factor(make_executor("heuristics", tuner)(kernel, x), x) == HEURISTIC
    with policy_override("heuristics"):
        assert factor(make_executor("autotune", tuner)(kernel, x), x) == HEURISTIC
    assert factor(create_default_executor(policy="heuristics")(kernel, x), x) == HEURISTIC
    assert tuner.tunes == 0


def test_heuristic_config_gets_the_requested_platform():
    kernel, x = ToyKernel(), toy_input()
    seen = []
    kernel.run = lambda *a, cfg, **kw: seen.append(cfg) or Kernel.run(kernel, *a, cfg=cfg, **kw)
    make_executor()(kernel, x, platform="xla")
    assert seen == [toy_cfg(HEURISTIC, "xla")]


# --- tier 7: error -----------------------------------------------------------------------------------


class BrokenHeuristicKernel(ToyKernel):
    def heuristic_cfg(self, inv):
        raise ValueError("no heuristic for these shapes")


class WrongTypeHeuristicKernel(ToyKernel):
    def heuristic_cfg(self, inv):
        return MeanPoolingConfig()


def test_heuristic_that_raises_is_runtime_error_naming_op():
    with pytest.raises(RuntimeError, match=TOY_OP) as err:
        make_executor()(BrokenHeuristicKernel(), toy_input())
    assert "no heuristic for these shapes" in str(err.value)


def test_heuristic_of_wrong_type_is_runtime_error_naming_op():
    with pytest.raises(RuntimeError, match=TOY_OP):
        make_executor()(WrongTypeHeuristicKernel(), toy_input())


def test_cached_configs_rescue_a_broken_heuristic():
    executor, x = make_executor(), toy_input()
    executor.chain.memory.put(toy_key(x), toy_cfg(MEMORY))
    assert factor(executor(BrokenHeuristicKernel(), x), x) == MEMORY
