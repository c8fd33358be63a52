"""Test set-up: 8 simulated CPU devices, JAX's persistent compilation cache, the `gpu` marker."""

import os
import pathlib

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_ENABLE_X64", "0")

import jax

# Imported first: otherwise the first Pallas jit compiles twice.
import jax.experimental.pallas.tpu
import pytest

_CACHE = pathlib.Path(__file__).resolve().parent.parent / ".cache" / "jax"
jax.config.update("jax_compilation_cache_dir", str(_CACHE))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)

HAS_GPU = jax.default_backend() == "gpu"


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _isolated_caches(tmp_path, monkeypatch):
    """Every test gets its own persistent config cache and the default autotune policy."""
    monkeypatch.setenv("EJKERNEL_PERSISTENT_CACHE_DIR", str(tmp_path / "ejkernel-cache"))
    monkeypatch.delenv("EJKERNEL_AUTOTUNE_POLICY", raising=False)
    from ejkernel.ops import reset_caches

    reset_caches()
    yield
    reset_caches()
