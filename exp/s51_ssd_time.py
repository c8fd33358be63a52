"""Session 51: our Mamba-2 scan as users call it (`state_space_v2(..., platform="triton")`), forward and
forward+backward (gradients of x, A, B, C, D, dt under the sum of y and the final state), at the anchor harness's
shape: B=2 S=16384 H=32 P=64 N=128 G=1 bf16, no gate, no initial state. Run beside `.anchors/bench_ssd_triton.py`
(mamba's Triton kernels) in the same device call.

    PYTHONPATH=src python exp/s51_ssd_time.py     # on a GPU, about a minute
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from _kit import log

from ejkernel.modules import state_space_v2
from ejkernel.ops.autotune import time_fns


def main() -> None:
    log(f"device {jax.devices()[0].device_kind}, jax {jax.__version__}")
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 8))
    normal = lambda *shape: jax.random.normal(next(keys), shape, jnp.float32)
    b, s, h, p, n = 2, 16384, 32, 64, 128
    args = [
        normal(b, s, h, p).astype(jnp.bfloat16),
        -jnp.exp(0.5 * normal(h)),
        normal(b, s, 1, n).astype(jnp.bfloat16),
        normal(b, s, 1, n).astype(jnp.bfloat16),
        normal(h),
        jax.nn.softplus(normal(b, s, h) - 2.0).astype(jnp.bfloat16),
    ]
    scan = lambda *a: state_space_v2(*a, None, None, platform="triton")[:2]
    loss = lambda *a: sum(jnp.sum(o.astype(jnp.float32)) for o in scan(*a))
    calls = {
        "triton fwd": functools.partial(jax.jit(scan), *args),
        "triton fwd+bwd": functools.partial(jax.jit(jax.grad(loss, argnums=tuple(range(6)))), *args),
    }
    for call in calls.values():
        jax.block_until_ready(call())
    for name, seconds in time_fns(calls, repeats=20).items():
        log(f"{name:16s} {seconds * 1e3:.4f} ms")


if __name__ == "__main__":
    main()
