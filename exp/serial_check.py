"""GPU check: which Mosaic GPU attention kernels ptxas compiles with serialised wgmma (its info C7513, "wgmma.mma_async
instructions are serialized": every matmul then waits for the one before, about 1.4x slower per step), for
block-sparse attention with and without partial tiles and dense flash attention causal and windowed, then
their times (S=16384 H=16 D=128, random 10% / 25% blocks). Run on an H100/H200 from the repository root:

    MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_TO=/tmp/mgpu_dump PYTHONPATH=$PWD/src python3 exp/serial_check.py

(a compile per call: run it in a fresh process, without a warm persistent compilation cache).
"""

import functools
import os
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, "exp")
from bsa_gpu import block_pattern

from ejkernel.modules import BlockSparseAttentionConfig, FlashAttentionConfig, blocksparse_attention, flash_attention
from ejkernel.ops.autotune import time_fns

DUMP = os.environ["MOSAIC_GPU_DUMP_TO"]
os.makedirs(DUMP, exist_ok=True)
seen = set(os.listdir(DUMP))


def report(label, call):
    jax.block_until_ready(call())
    new = sorted(set(os.listdir(DUMP)) - seen)
    seen.update(new)
    serial, spills = [], []
    for name in new:
        if name.endswith(".ptxas"):
            with open(os.path.join(DUMP, name), errors="replace") as f:
                text = f.read()
            serial += [name] if "C7513" in text else []
            spills += [f"{name}: {line.strip()}" for line in text.splitlines() if "bytes spill stores" in line]
    spilled = [line for line in spills if not line.endswith(" 0 bytes spill stores, 0 bytes spill loads")]
    print(f"{label}: {len(spills)} kernels, serialised: {serial}, spilling: {spilled}", flush=True)


S, H, D = 16384, 16, 128
keys = jax.random.split(jax.random.PRNGKey(0), 3)
q, k, v = (jax.random.normal(kk, (1, H, S, D), jnp.bfloat16) for kk in keys)
qs, ks, vs = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))
grad = lambda f: jax.jit(jax.grad(lambda q, k, v: jnp.sum(f(q, k, v).astype(jnp.float32)), argnums=(0, 1, 2)))
pallas = FlashAttentionConfig(platform="pallas")
cfg = BlockSparseAttentionConfig(platform="pallas")
calls, dens = {}, {}
for causal in (False, True):
    name = "causal" if causal else "full"
    calls[f"fwd+bwd dense auto {name}"] = functools.partial(
        grad(lambda q, k, v, c=causal: flash_attention(q, k, v, causal=c)), qs, ks, vs
    )
    for density in (0.10, 0.25):
        mask, d = block_pattern(S, S, density, seed=0)
        fn = functools.partial(blocksparse_attention, platform="pallas", cfg=cfg, attention_mask=mask, causal=causal)
        tag = f"{density:.2f} {name}"
        calls[f"fwd {tag}"] = functools.partial(jax.jit(fn), q, k, v)
        calls[f"fwd+bwd {tag}"] = functools.partial(grad(fn), q, k, v)
        # (causal: the blocks on or under the diagonal, about half of them, against the causal dense time)
        dens[f"fwd {tag}"] = dens[f"fwd+bwd {tag}"] = d
calls["fwd+bwd dense pallas causal"] = functools.partial(
    grad(lambda q, k, v: flash_attention(q, k, v, causal=True, cfg=pallas)), qs, ks, vs
)
calls["fwd+bwd dense pallas window"] = functools.partial(
    grad(lambda q, k, v: flash_attention(q, k, v, sliding_window=(2048, 0), cfg=pallas)), qs, ks, vs
)
calls["fwd dense pallas window"] = functools.partial(
    jax.jit(lambda q, k, v: flash_attention(q, k, v, sliding_window=(2048, 0), cfg=pallas)), qs, ks, vs
)
for key, c in calls.items():
    report(key, c)
sec = time_fns(calls, repeats=10, warmup=2)
for key, s in sec.items():
    base = sec["fwd+bwd dense auto causal" if "causal" in key else "fwd+bwd dense auto full"]
    ratio = f" t/(d*dense fwd+bwd) {s / (dens[key] * base):.3f}" if key in dens else ""
    print(f"{key:36s} {1e3 * s:8.3f} ms{ratio}", flush=True)
