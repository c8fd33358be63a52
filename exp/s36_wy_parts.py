"""Session 36: the gated delta rule's WY transform on the GPU, kernel (`wy_in_kernel`, session 35) against XLA's
(`wy_transform` over the chunk layout, main until session 35), at several launch settings, beside the whole
dense op. The diagonal blocks' inverses by forward substitution (the kernel's) or by masked doubling
(`doubling`: `D <- D - D (L masked to the cross blocks of size s) D` for s = 1, 2, 4, 8; float32 products in full
precision, or `tf32x3`). B 8, T 2048, H 32, D 128, bf16, chunk 64, forward only.

    python3 exp/s36_wy_parts.py
"""

import functools

import jax
import jax.numpy as jnp

from ejkernel.kernels._common.linear_attention.layout import ChunkLayout
from ejkernel.kernels._common.linear_attention.numerics import wy_transform
from ejkernel.kernels._triton.linear_attention import _delta
from ejkernel.kernels._triton.linear_attention._gla_common import F32, TritonGlaTiling, call_pallas, iota
from ejkernel.modules import gated_delta_rule
from ejkernel.ops.autotune import time_fns

B, T, H, D, C = 8, 2048, 32, 128, 64


def xla_wy(k, v, beta, a):
    layout = ChunkLayout.dense(B, T, C)
    gates = jnp.cumsum(layout.to_chunks(a), axis=-1)
    u, w = wy_transform(*(layout.to_chunks(x) for x in (k, v, beta)), gates)
    return layout.from_chunks(u), layout.from_chunks(w)


SUBSTITUTION = _delta._unit_lower_inverse


def doubling(precision, lower):
    """`(I + lower)⁻¹` of a strictly lower `[n, n]` tile by masked doubling."""
    rows, cols = iota(lower.shape, 0), iota(lower.shape, 1)
    dot = lambda x, y: jax.lax.dot(x, y, precision=precision, preferred_element_type=F32)
    inverse = (rows == cols).astype(F32)
    size = 1
    while size < lower.shape[0]:
        pair = (rows // (2 * size) == cols // (2 * size)) & ((rows // size) % 2 == 1) & ((cols // size) % 2 == 0)
        inverse = inverse - dot(inverse, dot(jnp.where(pair, lower, 0.0), inverse))
        size *= 2
    return inverse


DIAGONAL = {
    "substitution": SUBSTITUTION,
    "doubling": functools.partial(doubling, jax.lax.Precision.HIGHEST),
    "doubling tf32x3": functools.partial(doubling, jax.lax.DotAlgorithmPreset.TF32_TF32_F32_X3),
}


def kernel_wy(warps, stages, inverse, k, v, beta, a, diagonal="substitution"):
    """`_wy_triton` with the kernel's warps and stages and its diagonal blocks' inverse set here (the module's
    `call_pallas` and `_unit_lower_inverse` replaced while it is traced)."""
    _delta.call_pallas = lambda kernel, t, _, *rest, **s: call_pallas(kernel, t, warps, *rest, **s)
    _delta._unit_lower_inverse = DIAGONAL[diagonal]
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
    for diagonal in DIAGONAL:
        for warps in (2, 4):
            fn = jax.jit(functools.partial(kernel_wy, warps, 1, False, diagonal=diagonal))
            calls[f"WY kernel {diagonal} {warps} warps"] = functools.partial(fn, k, v, beta, a)
        fn = jax.jit(functools.partial(kernel_wy, 2, 1, True, diagonal=diagonal))
        calls[f"WY kernel {diagonal} 2 warps, with inverse"] = functools.partial(fn, k, v, beta, a)
    ready = {}
    for name, call in calls.items():
        try:
            jax.block_until_ready(call())
            ready[name] = call
        except Exception as err:
            print(f"{name}: {type(err).__name__}: {str(err)[:300]}")
    u0, w0 = calls["WY in XLA"]()
    for diagonal in DIAGONAL:
        u1, w1 = calls[f"WY kernel {diagonal} 2 warps"]()
        errors = [float(jnp.max(jnp.abs(x - y))) for x, y in ((u0, u1), (w0, w1))]
        print(f"{diagonal}: max |u - u_xla| {errors[0]:.3g}, max |w - w_xla| {errors[1]:.3g}")
    for name, seconds in time_fns(ready, repeats=10, warmup=2).items():
        print(f"{name:36s} {1e3 * seconds:7.3f} ms", flush=True)


if __name__ == "__main__":
    main()
