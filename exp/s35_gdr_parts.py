"""Where our gated delta rule's prefill time goes (issue 42/44: fla's `chunk_gated_delta_rule` ran the 8 x 2048
prefill in 0.95 ms, ours in 2.0): the public op, its chunked core (`delta_chunked`), the core's WY transform (XLA)
alone and inside it the block-doubling inverse, and the core's Triton rest given u and w. B 8, T 2048, H 32,
D 128, bf16, chunk 64, from and to float32 states; forward only.

    python3 exp/s35_gdr_parts.py
"""

import functools

import jax
import jax.numpy as jnp

from ejkernel.kernels._common.linear_attention.numerics import decay_matrix, unit_lower_inverse
from ejkernel.kernels._triton.linear_attention._delta import _forward, _wy, delta_chunked
from ejkernel.kernels._triton.linear_attention._gla_common import TritonGlaTiling
from ejkernel.kernels._triton.linear_attention._state_passes import TritonStatePassTiling
from ejkernel.modules import gated_delta_rule
from ejkernel.ops.autotune import time_fns

B, T, H, D, C = 8, 2048, 32, 128, 64


def main():
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 8))
    x = lambda *shape: jax.random.normal(next(keys), shape, jnp.float32)
    q, k, v = (x(B, T, H, D).astype(jnp.bfloat16) for _ in range(3))
    k = (k / jnp.linalg.norm(k.astype(jnp.float32), axis=-1, keepdims=True)).astype(jnp.bfloat16)
    beta = jax.nn.sigmoid(x(B, T, H))
    a = -0.05 * jax.nn.softplus(x(B, T, H))
    init = x(B, H, D, D)
    tiling = TritonGlaTiling()
    passes = TritonStatePassTiling(block_v=32, num_warps=4, num_stages=2, interpret=False)
    scale = D**-0.5
    u, w = jax.jit(functools.partial(_wy, C))(k, v, beta, a)
    chunks = lambda y: y.reshape(B, T // C, C, H, -1).swapaxes(2, 3)
    kc = chunks(k)
    system = jnp.matmul(kc, kc.swapaxes(-1, -2), preferred_element_type=jnp.float32)
    system = system * decay_matrix(jnp.zeros((B, T // C, H, C)), strict=True)
    calls = {
        "op (gated_delta_rule, triton)": functools.partial(
            jax.jit(functools.partial(gated_delta_rule, return_state=True, platform="triton")),
            q, k, v, beta, a, None, init,
        ),
        "core (delta_chunked)": functools.partial(
            jax.jit(functools.partial(delta_chunked, tiling, passes, scale, C)), q, k, v, a, beta, init
        ),
        "WY transform (XLA)": functools.partial(jax.jit(functools.partial(_wy, C)), k, v, beta, a),
        "  its inverse alone": functools.partial(jax.jit(unit_lower_inverse), system),
        "core less WY (Triton)": functools.partial(
            jax.jit(functools.partial(_forward, tiling, passes, scale, C)), q, k, v, a, init, u, w
        ),
    }  # fmt: skip
    for call in calls.values():
        jax.block_until_ready(call())
    for name, seconds in time_fns(calls, repeats=10, warmup=2).items():
        print(f"{name:32s} {1e3 * seconds:7.3f} ms", flush=True)


if __name__ == "__main__":
    main()
