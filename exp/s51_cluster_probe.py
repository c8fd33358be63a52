"""Session 51: does a 2-CTA cluster with TMA multicast lift a Hopper bf16 matmul at the MoE shape (issue 42's grouped
matmul forward, 0.78-0.84 of the dense matmul)? Times, in one interleaved run on M 32768, K 4096, N 1536 bf16:

- `dense`: XLA's `jnp.dot` (cuBLAS), the bench's reference;
- `ours 64 groups` / `ours 1 group`: our Mosaic GPU grouped matmul (`platform="pallas"`) on the bench's random groups
  and on one group of all rows (the kernel's own speed without group boundaries);
- `jax c=<cluster> ...`: JAX's own Hopper matmul (`jax.experimental.pallas.ops.gpu.hopper_matmul_mgpu`, read only
  here) at a 128 x 256 CTA tile with no cluster, and with 2-CTA clusters along M (the weights multicast) or N (the
  activations multicast).

    PYTHONPATH=src python exp/s51_cluster_probe.py     # on an H100/H200, about a minute
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from _kit import log, rel

from ejkernel.benchmarks.grouped_matmul import random_group_sizes
from ejkernel.modules import grouped_matmul
from ejkernel.ops.autotune import time_fns

M, K, N, G = 32768, 4096, 1536, 64


def jax_matmuls():
    """name -> fn(a, b) of JAX's Hopper matmul at a few configs (empty where this JAX lacks the module)."""
    try:
        from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hm
    except ImportError as err:
        log("no hopper_matmul_mgpu:", err)
        return {}
    fns = {}
    for cluster in (None, hm.MatmulDimension.M, hm.MatmulDimension.N):
        for width in (1, 8):
            config = hm.TuningConfig(
                tile_m=128,
                tile_n=128,
                tile_k=64,
                max_concurrent_steps=4,
                epi_tile_m=64,
                epi_tile_n=64,
                grid_minor_dim=hm.MatmulDimension.N,
                grid_tile_width=width,
                wg_dimension=hm.MatmulDimension.N,
                cluster_dimension=cluster,
            )
            fns[f"jax c={cluster} w={width}"] = jax.jit(lambda a, b, c=config: hm.matmul(a, b, None, config=c))
    return fns


def main() -> None:
    log(f"device {jax.devices()[0].device_kind}, jax {jax.__version__}")
    ka, kb = jax.random.split(jax.random.PRNGKey(0))
    lhs = jax.random.normal(ka, (M, K), jnp.bfloat16)
    rhs = (jax.random.normal(kb, (G, K, N), jnp.float32) * K**-0.5).astype(jnp.bfloat16)
    sizes, one = random_group_sizes(M, G), jnp.asarray([M] + [0] * (G - 1), jnp.int32)
    gmm = jax.jit(lambda a, b, s: grouped_matmul(a, b, s, preferred_element_type=a.dtype, platform="pallas"))
    dense = jax.jit(jnp.dot)
    fns = {
        "dense": lambda: dense(lhs, rhs[0]),
        "ours 64 groups": lambda: gmm(lhs, rhs, sizes),
        "ours 1 group": lambda: gmm(lhs, rhs, one),
    }
    for name, fn in jax_matmuls().items():
        fns[name] = lambda fn=fn: fn(lhs, rhs[0])
    reference = fns["dense"]()
    calls = {}
    for name, fn in fns.items():
        try:
            out = jax.block_until_ready(fn())
        except Exception as err:  # a config this JAX or GPU refuses
            log(f"{name} failed: {type(err).__name__}: {str(err).splitlines()[0][:160]}")
            continue
        if name != "ours 64 groups":
            log(f"{name}: rel {rel(out, reference):.2e}")
        calls[name] = fn
    seconds = time_fns(calls, repeats=20)
    flops = 2 * M * K * N
    for name, s in seconds.items():
        log(f"{name:24s} {s * 1e3:.4f} ms  {flops / s / 1e12:6.1f} TFLOP/s  x dense {seconds['dense'] / s:.3f}")


if __name__ == "__main__":
    main()
