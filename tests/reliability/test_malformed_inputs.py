"""Malformed arrays, for every op: each demo call with one array argument given a dropped axis, its last dimension one
longer, or a float/int dtype swapped is either a valid call (a value head dim other than the key's, more cache pages
than used) or refused in one line by our own checks, never by an error from inside JAX (traced, not compiled)."""

import pathlib
import traceback

import jax
import jax.numpy as jnp
import pytest

import ejkernel
from ejkernel.demo import demo_cases

PACKAGE = pathlib.Path(ejkernel.__file__).parent
CASES = {case.op: case for case in reversed(demo_cases())}  # (the first case of each op)


def malformed(a):
    """(what, array) variants of `a` that no op should turn into a crash deep inside JAX."""
    yield "without its last axis", a[..., 0]
    yield "its last dimension + 1", jnp.concatenate([a, a[..., :1]], axis=-1)
    swapped = jnp.int32 if jnp.issubdtype(a.dtype, jnp.floating) else jnp.float32
    yield f"as {jnp.dtype(swapped).name}", a.astype(swapped)


@pytest.mark.parametrize("op", CASES)
def test_a_malformed_array_is_refused_in_one_line_or_valid(op):
    case = CASES[op]
    args, options = case.make_inputs(jax.random.PRNGKey(0))
    call = case.call({**options, "platform": "xla"} if case.takes_platform else options)
    for i, a in enumerate(args):
        if getattr(a, "ndim", 0) == 0:
            continue
        for what, bad in malformed(a):
            try:
                jax.eval_shape(call, *args[:i], bad, *args[i + 1 :])
            except (TypeError, ValueError, NotImplementedError) as err:
                where = pathlib.Path(traceback.extract_tb(err.__traceback__)[-1].filename)
                assert where.is_relative_to(PACKAGE), f"{op}, argument {i} {what}: raised inside {where}: {err}"
                assert "\n" not in str(err).strip(), f"{op}, argument {i} {what}: not one line: {err}"
