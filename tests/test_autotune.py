"""The tuner (timing, preparation, failures) and the autotune policy (env, default, scoping)."""

import logging

import jax
import jax.numpy as jnp
import pytest

from ejkernel.ops import AutotunePolicy, Tuner, autotune, policy_override
from ejkernel.ops.autotune import active_policy, time_fns

pytestmark = pytest.mark.lowest

LOGGER = "ejkernel.autotune"
CLOCK = [0.0]  # seconds on the fake clock the tuner reads: timings here do not depend on the machine's load


@pytest.fixture(autouse=True)
def fake_clock(monkeypatch):
    monkeypatch.setattr(autotune.time, "perf_counter", lambda: CLOCK[0])


class Candidates:
    """Candidates named by how long one run takes (ms, on the fake clock); records what was prepared and run."""

    def __init__(self, fail_prepare=(), fail_run=()):
        self.prepared = []
        self.runs = {}
        self.fail_prepare, self.fail_run = set(fail_prepare), set(fail_run)

    def prepare(self, ms):
        self.prepared.append(ms)
        if ms in self.fail_prepare:
            raise ValueError(f"cannot compile {ms}")

        def run():
            self.runs[ms] = self.runs.get(ms, 0) + 1
            if ms in self.fail_run:
                raise RuntimeError(f"crashed at run {ms}")
            CLOCK[0] += ms / 1000
            return jnp.float32(ms)

        return run


def quick_tuner():
    return Tuner(warmup=1, repeats=3, progress=False)


@pytest.mark.parametrize("order", [(1, 10, 20), (20, 1, 10), (10, 20, 1)])
def test_picks_the_fastest(order):
    cands = Candidates()
    best, timings = quick_tuner().tune(list(order), cands.prepare)
    assert best == 1
    assert set(timings) == set(order)
    assert timings[1] == min(timings.values())
    assert timings[10] == pytest.approx(0.010) and timings[20] == pytest.approx(0.020)  # seconds per call


def test_default_kept_unless_beaten_by_more_than_the_margin():
    """The first candidate (the default) survives a win within the margin; a clear win replaces it."""
    cands = Candidates()
    generous = Tuner(warmup=0, repeats=3, progress=False, margin=1.5)  # 10 ms is within 150% of 5 ms
    assert generous.tune([10, 5], cands.prepare)[0] == 10
    strict = Tuner(warmup=0, repeats=3, progress=False, margin=0.5)
    assert strict.tune([10, 5], cands.prepare)[0] == 5


def test_each_candidate_prepared_once_and_run_warmup_calibration_and_repeats():
    cands = Candidates()
    Tuner(warmup=2, repeats=5, progress=False, min_sample_s=0).tune([1, 5, 10], cands.prepare)
    assert sorted(cands.prepared) == [1, 5, 10]
    assert cands.runs == {1: 8, 5: 8, 10: 8}  # 2 warm-up, 1 to size the samples, 5 timed


def test_short_runs_are_queued_to_fill_a_sample():
    """1 ms calls, 20 ms samples: one sizing call, then 20 calls per sample."""
    cands = Candidates()
    Tuner(warmup=0, repeats=2, progress=False, min_sample_s=0.02).tune([1], cands.prepare)
    assert cands.runs[1] == 1 + 2 * 20


def test_samples_of_several_fns_are_interleaved_round_by_round():
    calls = []
    fns = {name: (lambda name=name: calls.append(name)) for name in "abcd"}
    timings = time_fns(fns, warmup=1, repeats=6, min_sample_s=0)
    assert set(timings) == set("abcd")
    assert calls[:8] == ["a", "a", "b", "b", "c", "c", "d", "d"]  # warm-up and sizing, one fn after another
    rounds = [calls[i : i + 4] for i in range(8, len(calls), 4)]
    assert len(rounds) == 6 and all(sorted(r) == list("abcd") for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1  # the order changes between rounds


def test_zero_warmup():
    cands = Candidates()
    Tuner(warmup=0, repeats=1, progress=False, min_sample_s=0).tune([1], cands.prepare)
    assert cands.runs == {1: 2}


def test_timing_takes_the_median():
    durations = iter([0.0, 0.0, 0.001, 0.030, 0.001])  # warm-up, sizing, then an outlier among three repeats

    def run():
        CLOCK[0] += next(durations)

    median = time_fns({0: run}, warmup=1, repeats=3, min_sample_s=0)[0]
    assert 0.001 <= median < 0.025


@pytest.mark.parametrize("warmup, repeats, threads", [(-1, 3, 1), (1, 0, 1), (0, -2, 1), (1, 3, 0)])
def test_invalid_tuner_settings(warmup, repeats, threads):
    with pytest.raises(ValueError):
        Tuner(warmup=warmup, repeats=repeats, compile_threads=threads)


def test_threads_prepare_every_candidate_and_skip_failures(monkeypatch):
    """`EJKERNEL_AUTOTUNE_THREADS`: candidates prepared in threads, then timed; a failed one is skipped."""
    monkeypatch.setenv("EJKERNEL_AUTOTUNE_THREADS", "3")
    tuner = Tuner(warmup=1, repeats=3, progress=False)
    assert tuner.compile_threads == 3
    cands = Candidates(fail_prepare={1})
    best, timings = tuner.tune([20, 1, 10, 5], cands.prepare)
    assert best == 5 and set(timings) == {20, 10, 5} and sorted(cands.prepared) == [1, 5, 10, 20]


def test_failing_candidate_is_skipped_and_logged(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    cands = Candidates(fail_prepare={1}, fail_run={5})
    best, timings = quick_tuner().tune([1, 5, 10, 20], cands.prepare, label="autotune toy")
    assert best == 10
    assert set(timings) == {10, 20}
    assert sorted(cands.prepared) == [1, 5, 10, 20]
    messages = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert any("cannot compile 1" in m and "ValueError" in m for m in messages), messages
    assert any("crashed at run 5" in m and "RuntimeError" in m for m in messages), messages
    assert all("autotune toy" in m for m in messages)


def test_all_failing_is_runtime_error_listing_reasons(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    cands = Candidates(fail_prepare={1, 5}, fail_run={10})
    with pytest.raises(RuntimeError, match="autotune toy") as err:
        quick_tuner().tune([1, 5, 10], cands.prepare, label="autotune toy")
    message = str(err.value)
    assert "cannot compile 1" in message and "cannot compile 5" in message
    assert "crashed at run 10" in message


def test_no_candidates_is_runtime_error():
    with pytest.raises(RuntimeError, match="none"):
        quick_tuner().tune([], Candidates().prepare)


def test_timings_logged_when_asked(caplog, monkeypatch):
    monkeypatch.setenv("EJKERNEL_LOG_AUTOTUNE", "1")
    caplog.set_level(logging.INFO, logger=LOGGER)
    quick_tuner().tune([1, 5], Candidates().prepare, label="autotune toy")
    timed = [r.getMessage() for r in caplog.records if r.name == LOGGER and " ms" in r.getMessage()]
    assert len(timed) == 2


def test_progress_bar_does_not_change_the_result(capsys):
    best, _ = Tuner(warmup=0, repeats=1, progress=True).tune([5, 1], Candidates().prepare, label="bar")
    assert best == 1


def test_progress_from_env(monkeypatch):
    monkeypatch.setenv("EJKERNEL_AUTOTUNE_PROGRESS", "1")
    assert Tuner().progress is True
    monkeypatch.setenv("EJKERNEL_AUTOTUNE_PROGRESS", "0")
    assert Tuner().progress is False
    assert Tuner(progress=True).progress is True


# --- policy ------------------------------------------------------------------------------------------


def test_policy_default_is_heuristics(monkeypatch):
    monkeypatch.delenv("EJKERNEL_AUTOTUNE_POLICY", raising=False)
    assert active_policy() is AutotunePolicy.HEURISTICS


@pytest.mark.parametrize(
    "value, expected",
    [
        ("autotune", AutotunePolicy.AUTOTUNE),
        ("heuristics", AutotunePolicy.HEURISTICS),
        (" AutoTune \n", AutotunePolicy.AUTOTUNE),
        ("HEURISTICS", AutotunePolicy.HEURISTICS),
    ],
)
def test_policy_from_env(monkeypatch, value, expected):
    monkeypatch.setenv("EJKERNEL_AUTOTUNE_POLICY", value)
    assert active_policy() is expected


@pytest.mark.parametrize("value", ["fast", "tune", "1", "auto"])
def test_invalid_env_policy_is_value_error(monkeypatch, value):
    monkeypatch.setenv("EJKERNEL_AUTOTUNE_POLICY", value)
    with pytest.raises(ValueError, match="EJKERNEL_AUTOTUNE_POLICY") as err:
        active_policy()
    assert "autotune" in str(err.value) and "heuristics" in str(err.value)


def test_policy_enum_values():
    assert AutotunePolicy("autotune") is AutotunePolicy.AUTOTUNE
    assert AutotunePolicy.HEURISTICS == "heuristics"
    with pytest.raises(ValueError):
        AutotunePolicy("sometimes")


def test_executor_policy_beats_env(monkeypatch):
    monkeypatch.setenv("EJKERNEL_AUTOTUNE_POLICY", "autotune")
    assert active_policy(AutotunePolicy.HEURISTICS) is AutotunePolicy.HEURISTICS
    monkeypatch.setenv("EJKERNEL_AUTOTUNE_POLICY", "heuristics")
    assert active_policy(AutotunePolicy.AUTOTUNE) is AutotunePolicy.AUTOTUNE


def test_policy_override_scoping(monkeypatch):
    monkeypatch.setenv("EJKERNEL_AUTOTUNE_POLICY", "heuristics")
    assert active_policy() is AutotunePolicy.HEURISTICS
    with policy_override("autotune"):
        assert active_policy() is AutotunePolicy.AUTOTUNE
        assert active_policy(AutotunePolicy.HEURISTICS) is AutotunePolicy.AUTOTUNE  # beats the executor's
        with policy_override(AutotunePolicy.HEURISTICS):
            assert active_policy() is AutotunePolicy.HEURISTICS
            assert active_policy(AutotunePolicy.AUTOTUNE) is AutotunePolicy.HEURISTICS
        assert active_policy() is AutotunePolicy.AUTOTUNE
    assert active_policy() is AutotunePolicy.HEURISTICS


def test_policy_override_beats_invalid_env(monkeypatch):
    monkeypatch.setenv("EJKERNEL_AUTOTUNE_POLICY", "nonsense")
    with policy_override("heuristics"):
        assert active_policy() is AutotunePolicy.HEURISTICS


def test_policy_override_restored_after_exception():
    with pytest.raises(KeyError), policy_override("autotune"):
        raise KeyError("x")
    assert active_policy() is AutotunePolicy.HEURISTICS


def test_policy_override_rejects_unknown():
    with pytest.raises(ValueError), policy_override("always"):
        pass


def test_large_float_stand_ins_repeat_one_drawn_block(monkeypatch):
    """Traced floats get random normals in their dtype; past `STAND_IN_BLOCK` elements one drawn block repeats."""
    from ejkernel.ops import kernel

    monkeypatch.setattr(kernel, "STAND_IN_BLOCK", 64)
    seen = {}

    def traced(big, small):
        with jax.ensure_compile_time_eval():
            seen["args"] = kernel.Invocation("toy", (big, small), {}).sample_inputs()[0]
        return big

    jax.jit(traced)(jnp.ones((3, 50), jnp.bfloat16), jnp.ones((10,), jnp.float32))
    big, small = seen["args"]
    assert (big.shape, big.dtype, small.shape, small.dtype) == ((3, 50), jnp.bfloat16, (10,), jnp.float32)
    flat = big.reshape(-1).astype(jnp.float32)
    assert bool(jnp.all(jnp.isfinite(flat))) and float(jnp.std(flat[:64])) > 0.5
    assert bool(jnp.array_equal(flat[64:128], flat[:64]))
