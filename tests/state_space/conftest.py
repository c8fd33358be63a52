"""The state-space tests compile many small programs and run each once: skip XLA's optimisations."""

import pytest


@pytest.fixture(autouse=True)
def _cheap(cheap_compiles):
    yield
