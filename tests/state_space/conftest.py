"""The state-space tests compile many small programs and run each once: skip XLA's optimisations."""

import jax
import pytest


@pytest.fixture(autouse=True)
def _cheap_compiles():
    previous = jax.config.values["jax_disable_most_optimizations"]
    jax.config.update("jax_disable_most_optimizations", True)
    yield
    jax.config.update("jax_disable_most_optimizations", previous)
