"""Session 51: the Mosaic GPU fused backward at head dim 128 with dQ shared between the warpgroups (prototype switches
`flash_attention._interface.FUSED_D128` / `SHARED_DQ`; issue 42: the backward past cuDNN, block-sparse at 10%).

The fused backward computes each score tile once (five matmuls a tile pair, not the split kernels' seven) and adds dQ
into float32 HBM by TMA reductions. Until now each warpgroup added its own 64 keys' share of the whole dQ tile (a 32
KiB reduction a warpgroup a step, and 64 KiB of float32 staging, which left shared memory for two stages at head dim
128); shared, each adds half of dQ's columns over both warpgroups' keys (half the reduction traffic and staging, so
three stages fit). Variants, forward+backward (grad of sum(out) in q, k, v), bf16:

- block-sparse, S 16384, H 16, D 128, random 128 x 128 blocks at 10% (`ejkernel bench sparse_attention`'s rows):
  `split` (the default two backward kernels, 3 stages), `fused` (each warpgroup its own dQ, 2 stages),
  `shared s2`, `shared s3`;
- dense flash attention 1 x 16384 x 16 x 128 non-causal, the Mosaic GPU kernels: `split`, `shared s3`.

    git apply exp/s51_shared_dq.patch && PYTHONPATH=src python exp/s51_fused_bwd.py   # H100/H200, ~2 minutes
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from _kit import log, rel, start_watchdog

from ejkernel.benchmarks.sparse_attention import random_blocks
from ejkernel.kernels._pallas.gpu.blocksparse_attention._interface import mosaic_blocksparse
from ejkernel.kernels._pallas.gpu.flash_attention import _interface as flash
from ejkernel.ops import BwdParams
from ejkernel.ops.autotune import time_fns

S, H, D = 16384, 16, 128
VARIANTS = {  # name: (FUSED_D128 / fused_backward, SHARED_DQ, backward stages)
    "split": (False, False, None),
    "fused": (True, False, 2),
    "shared s2": (True, True, 2),
    "shared s3": (True, True, 3),
}


def main() -> None:
    start_watchdog(120.0)  # a deadlocked barrier hangs the GPU: name the variant and exit
    log(f"device {jax.devices()[0].device_kind}, jax {jax.__version__}")
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    q, k, v = (jax.random.normal(key, (1, H, S, D), jnp.bfloat16) for key in keys)
    builder, density = random_blocks(S, 0.10)
    bshd = lambda x: jnp.swapaxes(x, 1, 2)
    calls, outs = {}, {}
    for op in ("sparse", "dense"):
        for name, (fused, shared, stages) in VARIANTS.items():
            if op == "dense" and name not in ("split", "shared s3"):
                continue
            flash.FUSED_D128, flash.SHARED_DQ = fused and op == "dense", shared
            bwd = None if stages is None else BwdParams(num_stages=stages)
            if op == "sparse":
                fn = functools.partial(
                    mosaic_blocksparse, mask_builder=builder, causal=False, fused_backward=fused, bwd_params=bwd
                )
                args = (q, k, v)
            else:
                fn = functools.partial(flash.mosaic_attention, causal=False, sliding_window=None, bwd_params=bwd)
                args = (bshd(q), bshd(k), bshd(v))
            loss = lambda q, k, v, fn=fn: jnp.sum(fn(q, k, v, softmax_scale=D**-0.5).astype(jnp.float32))
            label = f"{op} {name}"
            log(f"{label}: compiling and running")
            try:
                step = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(*args).compile()
                outs[label] = jax.block_until_ready(step(*args))
                calls[label] = functools.partial(step, *args)
            except Exception as err:
                log(f"{label} failed: {type(err).__name__}: {str(err).splitlines()[0][:200]}")
    flash.FUSED_D128 = flash.SHARED_DQ = False
    for label, grads in outs.items():
        base = outs[label.split()[0] + " split"]
        log(f"{label}: rel dq/dk/dv " + " ".join(f"{rel(g, b):.1e}" for g, b in zip(grads, base, strict=True)))
    seconds = time_fns(calls, repeats=10)
    for label, s in seconds.items():
        base = seconds[label.split()[0] + " split"]
        log(f"{label:18s} {s * 1e3:.4f} ms  x split {base / s:.3f}  (density {density:.3f})")


if __name__ == "__main__":
    main()
