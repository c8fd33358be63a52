"""Pallas Mosaic TPU kernels, one folder per op (imported when an op first uses its kernel)."""

import jax
from jax.experimental.pallas import tpu as pltpu


def resolve_interpret(interpret):
    """What a TPU kernel's `interpret` argument means: None compiles on a TPU and runs TPU interpret mode
    elsewhere (how CPU CI checks the kernels); True is interpret mode with default parameters; False, or a
    `pltpu.InterpretParams`, as given. Returns False or the `InterpretParams` to run with."""
    if interpret is None:
        interpret = jax.default_backend() != "tpu"
    return pltpu.InterpretParams() if interpret is True else interpret
