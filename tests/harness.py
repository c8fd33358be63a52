"""Shared test harness: fresh random inputs, per-dtype tolerances, forward + gradient checks.

Pallas interpret mode fills every output buffer with NaN before the kernel runs, so `assert_close`
(which rejects NaN) also proves that a kernel wrote every element it returns.
"""

import itertools
import zlib

import jax
import jax.numpy as jnp
import numpy as np

# Relative error bound (‖out − ref‖ / ‖ref‖) per dtype, forward and gradients.
TOLERANCE = {jnp.dtype(jnp.float32): 2e-5, jnp.dtype(jnp.bfloat16): 2e-2, jnp.dtype(jnp.float16): 5e-3}
GRAD_TOLERANCE = {jnp.dtype(jnp.float32): 1e-4, jnp.dtype(jnp.bfloat16): 4e-2, jnp.dtype(jnp.float16): 1e-2}

_counter = itertools.count(1000)


def reseed(test_id: str) -> None:
    """Start the keys of one test at a point fixed by its id: its inputs are the same whichever worker
    runs it and whatever ran before, so a failure reproduces."""
    global _counter
    _counter = itertools.count((zlib.crc32(test_id.encode()) & 0xFFFFF) << 10)


def fresh_key() -> jax.Array:
    """A key never handed out before in this test, so no two tensors are drawn alike."""
    return jax.random.PRNGKey(next(_counter))


def randn(shape, dtype=jnp.float32, scale=1.0) -> jax.Array:
    """Standard normal values (times `scale`) in `dtype`, never drawn before in this test. Drawn by numpy: each
    new shape drawn by `jax.random` compiled a program of its own, a large share of a CPU test's time."""
    values = scale * np.random.default_rng(next(_counter)).standard_normal(shape, np.float32)
    return jnp.asarray(values.astype(dtype))


def relative_error(actual, expected) -> float:
    """‖actual − expected‖ / ‖expected‖ in float64, on the host (no compiled program per shape)."""
    a, e = np.asarray(actual).astype(np.float64), np.asarray(expected).astype(np.float64)
    return float(np.linalg.norm(a - e) / max(np.linalg.norm(e), 1e-30))


def assert_close(actual, expected, dtype=None, tol=None, name="output"):
    """Finite everywhere, same shape, and relative error within the dtype's tolerance."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
    assert np.isfinite(actual.astype(np.float32)).all(), f"{name}: non-finite values"
    tol = tol if tol is not None else TOLERANCE[jnp.dtype(dtype or actual.dtype)]
    err = relative_error(actual, expected)
    assert err <= tol, f"{name}: relative error {err:.3g} > {tol:.3g}"


def copies_in(compiled_text: str, array_type: str) -> list[str]:
    """The copy instructions producing an array of `array_type` (e.g. "f32[128,8,128,128]") in a compiled module's
    text: a donated buffer updated in place has none."""
    results = (line.split("=", 1) for line in compiled_text.splitlines() if "=" in line)
    return [r for name, r in results if "copy" in name + r.split("(")[0] and r.strip().startswith(array_type)]


def check_forward_and_grads(fn, reference, args, argnums, dtype, fwd_tol=None, grad_tol=None):
    """`fn(*args)` matches `reference(*args)` (run in float32) forward and in the VJP of each argnum.

    The cotangent is random, so a gradient that is right only for a sum-of-outputs loss fails.
    """
    f32 = [
        a.astype(jnp.float32) if isinstance(a, jax.Array) and jnp.issubdtype(a.dtype, jnp.floating) else a for a in args
    ]
    out, vjp = jax.vjp(lambda *d: fn(*_put(args, argnums, d)), *[args[i] for i in argnums])
    ref_out, ref_vjp = jax.vjp(lambda *d: reference(*_put(f32, argnums, d)), *[f32[i] for i in argnums])
    assert_close(out, ref_out, dtype, fwd_tol)
    cotangent = randn(out.shape, out.dtype)
    grads = vjp(cotangent)
    ref_grads = ref_vjp(cotangent.astype(jnp.float32))
    tol = grad_tol if grad_tol is not None else GRAD_TOLERANCE[jnp.dtype(dtype)]
    for i, g, rg in zip(argnums, grads, ref_grads, strict=True):
        assert_close(g, rg, dtype, tol, name=f"grad of argument {i}")


def highest(fn):
    """`fn` traced with float32 matmuls at full precision: an oracle on a GPU, where XLA's default is TF32."""

    def call(*args, **kwargs):
        with jax.default_matmul_precision("highest"):
            return fn(*args, **kwargs)

    return call


def _put(args, argnums, values):
    args = list(args)
    for i, v in zip(argnums, values, strict=True):
        args[i] = v
    return args
