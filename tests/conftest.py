"""Test set-up: 8 simulated CPU devices, JAX's persistent compilation cache, the `gpu`, `multigpu` and `long`
markers."""

import os
import pathlib

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_ENABLE_X64", "0")

import jax

# Imported first: otherwise the first Pallas jit compiles twice.
import jax.experimental.pallas.tpu
import pytest

# One compilation cache per JAX version: `make unit` and `make unit-lowest` run two of them on one tree.
_CACHE = pathlib.Path(__file__).resolve().parent.parent / ".cache" / f"jax-{jax.__version__}"
jax.config.update("jax_compilation_cache_dir", str(_CACHE))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)

HAS_GPU = jax.default_backend() == "gpu"


def pytest_collection_modifyitems(config, items):
    gpus = jax.device_count() if HAS_GPU else 0
    for item in items:
        if item.get_closest_marker("gpu") and not gpus:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        elif item.get_closest_marker("multigpu") and gpus < 2:
            item.add_marker(pytest.mark.skip(reason="needs two CUDA GPUs"))
    # Long tests first (stable otherwise): xdist hands tests out in this order, and a long one collected last
    # would run alone at the end while the other workers idle.
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


def pytest_runtest_logreport(report):
    """With `TEST_FAILURE_LOG` set, each failure's traceback is appended to that file as it happens: a GPU session cut
    short by its time limit loses pytest's summary at the end (twice, a GPU test's failure was known by name only).
    Written by the controller alone under xdist (workers forward their reports to it)."""
    path = os.environ.get("TEST_FAILURE_LOG")
    if path and report.failed and "PYTEST_XDIST_WORKER" not in os.environ:
        with open(path, "a") as log:
            log.write(f"=== {report.nodeid} ({report.when})\n{report.longreprtext}\n")


@pytest.fixture(autouse=True)
def _isolated_caches(tmp_path, monkeypatch):
    """Every test gets its own persistent config cache and the default autotune policy."""
    monkeypatch.setenv("EJKERNEL_PERSISTENT_CACHE_DIR", str(tmp_path / "ejkernel-cache"))
    monkeypatch.delenv("EJKERNEL_AUTOTUNE_POLICY", raising=False)
    from ejkernel.ops import reset_caches

    reset_caches()
    yield
    reset_caches()


@pytest.fixture(autouse=True)
def _reproducible_inputs(request):
    from harness import reseed

    reseed(request.node.nodeid)


@pytest.fixture(autouse=True)
def cheap_compiles():
    """The tests compile many small programs and run each once (interpret-mode kernels run in
    milliseconds per step but compile in seconds): XLA's optimisations would cost more than they save."""
    previous = jax.config.values["jax_disable_most_optimizations"]
    jax.config.update("jax_disable_most_optimizations", True)
    yield
    jax.config.update("jax_disable_most_optimizations", previous)


@pytest.fixture
def cuda_lowering(monkeypatch):
    """Lower Pallas-Triton kernels for an H100 (compute capability 9.0) on this CPU host, and verify each
    Triton module as the GPU compiler will (operand types of loops, ...), which lowering alone skips.

    Use `jax.jit(f).trace(...).lower(lowering_platforms=("cuda",))` in the test.
    """
    import types

    from jax._src.pallas.triton import lowering, pallas_call_registration

    monkeypatch.setattr(
        pallas_call_registration.gpu_info_lib, "get_gpu_info", lambda: types.SimpleNamespace(compute_capability=90)
    )
    lower = lowering.lower_jaxpr_to_triton_module

    def lower_and_verify(*args, **kwargs):
        result = lower(*args, **kwargs)
        with result.module.context:
            assert result.module.operation.verify(), "the Triton module does not verify"
        return result

    monkeypatch.setattr(lowering, "lower_jaxpr_to_triton_module", lower_and_verify)
