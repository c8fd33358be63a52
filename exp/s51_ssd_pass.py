"""Session 51: the Mamba-2 plain forward in one sequential pass (`_gla_forward.head_pass_forward`) against the three
kernels before it (cumulative gates, entry states written to memory, outputs), issue 42's SSD forward target (<= 0.6x
mamba's `mamba_chunk_scan_combined`, whose harness runs beside this in the same call).

    PYTHONPATH=src python exp/s51_ssd_pass.py            # on a GPU, about 2 minutes with compilation

B=2 S=16384 H=32 P=64 N=128 G=1 bf16 (the bench's shape) and B=1 (half the programs), no gate, no initial state,
`state_space_v2(..., platform="triton")` as users call it. Variants: `three kernels` (`head_pass_programs` out of
reach), `pass vN wM sK` (value columns a program, warps, pipeline stages). Each is checked against `three kernels`
(`rel` of y and the final state), then all are timed together."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from _kit import log, rel

from ejkernel.kernels._triton.state_space_v2 import _interface as ssd
from ejkernel.modules import state_space_v2
from ejkernel.ops.autotune import time_fns

DEFAULT = ssd.GLA_TILING
VARIANTS = {"three kernels": dataclasses.replace(DEFAULT, head_pass_programs=1 << 30)}
for v, w, stages in [(32, 4, 2), (16, 4, 2), (64, 4, 2), (32, 8, 2), (64, 8, 2), (32, 4, 3), (16, 2, 2)]:
    VARIANTS[f"pass v{v} w{w} s{stages}"] = dataclasses.replace(
        DEFAULT, head_pass_programs=1, head_pass_v=v, head_pass_warps=w, num_stages=stages
    )


def inputs(batch, seq=16384, heads=32, head_dim=64, state=128):
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 8))
    normal = lambda *shape: jax.random.normal(next(keys), shape, jnp.float32)
    return [
        normal(batch, seq, heads, head_dim).astype(jnp.bfloat16),
        -jnp.exp(0.5 * normal(heads)),
        normal(batch, seq, 1, state).astype(jnp.bfloat16),
        normal(batch, seq, 1, state).astype(jnp.bfloat16),
        normal(heads),
        jax.nn.softplus(normal(batch, seq, heads) - 2.0).astype(jnp.bfloat16),
    ]


def main() -> None:
    log(f"device {jax.devices()[0].device_kind}, jax {jax.__version__}")
    for batch in (2, 1):
        args = inputs(batch)
        calls, outs = {}, {}
        for name, tiling in VARIANTS.items():
            ssd.GLA_TILING = tiling  # read when the call is traced
            try:
                fn = jax.jit(lambda *a: state_space_v2(*a, None, None, platform="triton")[:2]).lower(*args).compile()
                outs[name] = jax.block_until_ready(fn(*args))
                calls[name] = functools.partial(fn, *args)
            except Exception as err:
                log(f"B{batch} {name} failed: {type(err).__name__}: {str(err).splitlines()[0][:200]}")
        ssd.GLA_TILING = DEFAULT
        base = outs["three kernels"]
        for name, out in outs.items():
            log(f"B{batch} {name}: rel y {rel(out[0], base[0]):.2e}, state {rel(out[1], base[1]):.2e}")
        seconds = time_fns(calls, repeats=20)
        for name, s in seconds.items():
            log(f"B{batch} {name:20s} {s * 1e3:.4f} ms  x three kernels {seconds['three kernels'] / s:.3f}")


if __name__ == "__main__":
    main()
