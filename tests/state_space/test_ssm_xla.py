"""XLA state-space scans against the step-by-step references: outputs, final states and every gradient,
one-token decode steps chained against the full sequence, and empty sequences."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from state_space_cases import check_scan, v1_inputs, v2_inputs

from ejkernel.kernels._xla.state_space_v1._interface import state_space_v1_xla
from ejkernel.kernels._xla.state_space_v2._interface import state_space_v2_xla
from ejkernel.modules import StateSpaceV1Config, StateSpaceV2Config
from ejkernel.reference.state_space import state_space_v1_reference, state_space_v2_reference
from harness import assert_close

# Chunks of 16: several per sequence, the last one partial.
V1 = functools.partial(state_space_v1_xla, cfg=StateSpaceV1Config(chunk_size=16))
V2 = functools.partial(state_space_v2_xla, n_groups=2, cfg=StateSpaceV2Config(chunk_size=16))
V2_REF = functools.partial(state_space_v2_reference, n_groups=2)


@pytest.mark.parametrize(
    ("seq", "dtype", "gate", "initial", "act_fn"),
    [
        (37, jnp.float32, True, True, None),
        (63, jnp.bfloat16, True, False, jnp.tanh),
        (1, jnp.float32, False, True, None),  # one decode step
    ],
)
def test_v1_matches_reference(seq, dtype, gate, initial, act_fn):
    args = v1_inputs(seq=seq, dtype=dtype, gate=gate, initial=initial)
    check_scan(
        functools.partial(V1, act_fn=act_fn),
        functools.partial(state_space_v1_reference, act_fn=act_fn),
        args,
        dtype,
    )


@pytest.mark.parametrize(
    ("seq", "dtype", "gate", "initial", "options"),
    [
        (37, jnp.float32, True, True, {}),
        (63, jnp.bfloat16, True, False, {"use_gated_rmsnorm": True, "rmsnorm_eps": 1e-3}),
        (1, jnp.float32, False, True, {}),  # one decode step
    ],
)
def test_v2_matches_reference(seq, dtype, gate, initial, options):
    args = v2_inputs(seq=seq, dtype=dtype, gate=gate, initial=initial)
    check_scan(functools.partial(V2, **options), functools.partial(V2_REF, **options), args, dtype)


def _chained(fn, args, prefix):
    """`fn` over the first `prefix` tokens, then one token at a time carrying the state."""
    x, A, B, C, D, dt, gate, state = args
    step = jax.jit(lambda *a: fn(*a)[:2])
    ys = []
    for lo, hi in [(0, prefix)] + [(t, t + 1) for t in range(prefix, x.shape[1])]:
        y, state = step(x[:, lo:hi], A, B[:, lo:hi], C[:, lo:hi], D, dt[:, lo:hi], gate[:, lo:hi], state)
        ys.append(y)
    return jnp.concatenate(ys, axis=1), state


@pytest.mark.parametrize(("fn", "inputs"), [(V1, v1_inputs), (V2, v2_inputs)], ids=["v1", "v2"])
def test_chained_decode_steps_equal_the_full_sequence(fn, inputs):
    args = inputs(seq=12)
    full_y, full_state, _ = fn(*args)
    y, state = _chained(fn, args, prefix=5)
    assert_close(y, full_y)
    assert_close(state, full_state)


@pytest.mark.parametrize(("fn", "inputs"), [(V1, v1_inputs), (V2, v2_inputs)], ids=["v1", "v2"])
def test_empty_sequence_returns_the_initial_state(fn, inputs):
    args = inputs(seq=0)
    y, state, _ = fn(*args)
    assert y.shape == (*args[0].shape[:2], args[6].shape[-1])
    np.testing.assert_array_equal(np.asarray(state), np.asarray(args[7]))
    grad = jax.grad(lambda h: jnp.sum(fn(*args[:7], h)[1] ** 2))(args[7])
    assert_close(grad, 2 * args[7])
