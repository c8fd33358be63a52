"""Session 36: the gated delta rule's forward+backward with the WY pullback in one Triton kernel
(`_delta._wy_pullback`, 4 or 2 warps), beside GLA's forward+backward (issue 42 asks GDR <= 1.2x GLA), on the
bench's shape: B 2, T 16384, H 16, D 128, bf16, gradients of every input. Prints ms and the ratio.

    python3 exp/s36_gdr_train.py
"""

import functools

import jax
import jax.numpy as jnp

from ejkernel.kernels._triton.linear_attention import _delta
from ejkernel.kernels._triton.linear_attention._gla_common import call_pallas
from ejkernel.modules import gated_delta_rule, gla_attention
from ejkernel.ops.autotune import time_fns

B, T, H, D = 2, 16384, 16, 128


def grad_step(fn, *args):
    loss = lambda *a: jnp.sum(fn(*a).astype(jnp.float32))
    return functools.partial(jax.jit(jax.grad(loss, argnums=tuple(range(len(args))))), *args)


def pullback_warps(warps):
    """`_delta.call_pallas` with the pullback kernel's warps set (read while a call traces)."""

    def wrapped(kernel, t, default, grid, in_specs, out_specs, out_shape, name, **static):
        chosen = warps if name == "ejkernel_delta_wy_grads" else default
        return call_pallas(kernel, t, chosen, grid, in_specs, out_specs, out_shape, name, **static)

    _delta.call_pallas = wrapped


def main():
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 8))
    x = lambda *shape: jax.random.normal(next(keys), shape, jnp.float32)
    q, k, v = (x(B, T, H, D).astype(jnp.bfloat16) for _ in range(3))
    g = -0.05 * jax.nn.softplus(x(B, T, H, D))
    beta, decay = jax.nn.sigmoid(x(B, T, H)), -0.05 * jax.nn.softplus(x(B, T, H))
    calls = {"gla": grad_step(lambda q, k, v, g: gla_attention(q, k, v, g), q, k, v, g)}
    for warps in (4, 2):
        pullback_warps(warps)
        call = grad_step(lambda q, k, v, b, d: gated_delta_rule(q, k, v, b, d), q, k, v, beta, decay)
        jax.block_until_ready(call())  # traced now, with these warps
        calls[f"gdr, pullback {warps} warps"] = call
    jax.block_until_ready(calls["gla"]())
    timings = time_fns(calls, repeats=10, warmup=2)
    for name, seconds in timings.items():
        print(f"{name:24s} {1e3 * seconds:7.3f} ms  {seconds / timings['gla']:.3f}x gla", flush=True)


if __name__ == "__main__":
    main()
