"""Session 36: the gated delta rule's WY transform on the GPU, kernel (`wy_in_kernel`, session 35) against XLA's
(`wy_transform` over the chunk layout, main until session 35), at several launch settings, beside the whole
dense op and its ragged prefill form. B 8, T 2048, H 32, D 128, bf16, chunk 64, forward only.

    python3 exp/s36_wy_parts.py
"""

import functools

import jax
import jax.numpy as jnp

from ejkernel.kernels._common.linear_attention.layout import ChunkLayout
from ejkernel.kernels._common.linear_attention.numerics import wy_transform
from ejkernel.kernels._triton.linear_attention import _delta
from ejkernel.kernels._triton.linear_attention._gla_common import TritonGlaTiling, call_pallas
from ejkernel.modules import gated_delta_rule
from ejkernel.ops.autotune import time_fns

B, T, H, D, C = 8, 2048, 32, 128, 64


def xla_wy(k, v, beta, a):
    layout = ChunkLayout.dense(B, T, C)
    gates = jnp.cumsum(layout.to_chunks(a), axis=-1)
    u, w = wy_transform(*(layout.to_chunks(x) for x in (k, v, beta)), gates)
    return layout.from_chunks(u), layout.from_chunks(w)


def kernel_wy(warps, stages, inverse, k, v, beta, a):
    """`_wy_triton` with the kernel's warps and stages set here (the module's `call_pallas` wrapped)."""
    _delta.call_pallas = lambda kernel, t, _, *rest, **s: call_pallas(kernel, t, warps, *rest, **s)
    t = TritonGlaTiling(num_stages=stages)
    return _delta._wy_triton(t, C, k, v, beta, a, with_inverse=inverse)


def main():
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 8))
    x = lambda *shape: jax.random.normal(next(keys), shape, jnp.float32)
    q, k, v = (x(B, T, H, D).astype(jnp.bfloat16) for _ in range(3))
    k = (k / jnp.linalg.norm(k.astype(jnp.float32), axis=-1, keepdims=True)).astype(jnp.bfloat16)
    beta = jax.nn.sigmoid(x(B, T, H))
    a = -0.05 * jax.nn.softplus(x(B, T, H))
    init = x(B, H, D, D)
    calls = {
        "op (gated_delta_rule, triton)": functools.partial(
            jax.jit(functools.partial(gated_delta_rule, return_state=True, platform="triton")),
            q, k, v, beta, a, None, init,
        ),
        "WY in XLA": functools.partial(jax.jit(xla_wy), k, v, beta, a),
    }  # fmt: skip
    for warps in (2, 4, 8):
        for stages in (1, 2):
            fn = jax.jit(functools.partial(kernel_wy, warps, stages, False))
            calls[f"WY kernel {warps} warps {stages} stages"] = functools.partial(fn, k, v, beta, a)
    calls["WY kernel 4 warps, with inverse"] = functools.partial(
        jax.jit(functools.partial(kernel_wy, 4, 1, True)), k, v, beta, a
    )
    ready = {}
    for name, call in calls.items():
        try:
            jax.block_until_ready(call())
            ready[name] = call
        except Exception as err:
            print(f"{name}: {type(err).__name__}: {str(err)[:300]}")
    u0, w0 = calls["WY in XLA"]()
    u1, w1 = calls["WY kernel 4 warps 1 stages"]()
    print("max |u - u_xla|", float(jnp.max(jnp.abs(u0 - u1))), "max |w - w_xla|", float(jnp.max(jnp.abs(w0 - w1))))
    for name, seconds in time_fns(ready, repeats=10, warmup=2).items():
        print(f"{name:36s} {1e3 * seconds:7.3f} ms", flush=True)


if __name__ == "__main__":
    main()
