"""Issue 46, session 39: versions of the ring driver side by side on 2 GPUs, beside one-GPU flash attention.

Loads each `ring.py`-shaped file as its own module (`exp/s35_ring_bisect.load`), runs it around the `auto` ring's
per-step kernels (Mosaic GPU forward onto the running result, cuDNN backward) at S=65536 causal, H=16, D=128 bf16,
sequence split, mirrored layout, and times every version and cuDNN flash attention on one GPU at S interleaved in one
run per mode. A version may name which directions annotate their steps as XLA scheduling groups
(`name=path:fwd+bwd`, read by the copy `exp/s39_ring_groups.patch` makes of `ring.py`). A version that fails to
compile is reported and skipped.

    python exp/s39_ring.py --versions head=/tmp/head_ring.py,new=src/ejkernel/kernels/_common/ring.py --out $OUT
"""

import argparse
import functools
import json
import pathlib
import sys

import jax
import jax.numpy as jnp

from ejkernel.kernels._pallas.gpu.ring_attention._interface import MosaicGpuBlock
from ejkernel.modules import flash_attention
from ejkernel.ops.autotune import time_fns

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from ring_schedule import schedule
from s35_ring_bisect import load, ring_inputs


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--versions", required=True, help="name=path[:groups],... of ring.py files")
    p.add_argument("--kv-heads", type=int, default=16)
    p.add_argument("--seq", type=int, default=65536)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--modes", default="fwd,fwd+bwd")
    p.add_argument("--out", default="out")
    args = p.parse_args()
    devices, mesh, spec, qkv, sharded = ring_inputs(args.seq, args.kv_heads)
    n = len(devices)
    single = [jax.device_put(x, devices[0]) for x in qkv]
    block = MosaicGpuBlock(128 ** (-0.5), True, None)

    def ring(module):
        layout = module.RingSpec(axis_name="sp", layout="mirrored", causal=True, window=None)
        return jax.shard_map(
            lambda q, k, v: module.run_ring(block, layout, n, q, k, v), mesh=mesh, in_specs=(spec,) * 3, out_specs=spec
        )

    variants = {}
    for item in args.versions.split(","):
        name, where = item.split("=", 1)
        path, _, groups = where.partition(":")
        module = load(name, path)
        if groups:
            module.GROUPS = tuple(g for g in groups.split("+") if g != "none")
        variants[name] = (ring(module), sharded)
    variants["flash-cuda S"] = (lambda q, k, v: flash_attention(q, k, v, causal=True, platform="cuda"), single)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for mode in args.modes.split(","):
        calls = {}
        for name, (fn, inputs) in variants.items():
            if mode == "fwd+bwd":
                fn = jax.grad(lambda q, k, v, fn=fn: jnp.sum(fn(q, k, v).astype(jnp.float32)), argnums=(0, 1, 2))
            try:
                compiled = jax.jit(fn).lower(*inputs).compile()
            except Exception as err:  # a version XLA refuses: reported, the others still timed
                print(f"{name} {mode}: {type(err).__name__}: {str(err)[:400]}", flush=True)
                continue
            if not name.startswith("flash"):
                tag = f"{name}_{mode.replace('+', '_')}_kv{args.kv_heads}"
                (out / f"schedule_{tag}.txt").write_text("\n".join(schedule(compiled.as_text())))
            call = functools.partial(compiled, *inputs)
            jax.block_until_ready(call())
            calls[name] = call
        times = time_fns(calls, repeats=args.repeats, warmup=2)
        results[mode] = {k: t * 1e3 for k, t in times.items()}
        print(f"== {mode}, kv heads {args.kv_heads}, {n} x {devices[0].device_kind}", flush=True)
        one = results[mode].get("flash-cuda S")
        for name, ms in results[mode].items():
            ratio = f"   {one / ms:.3f}x one GPU" if one and not name.startswith("flash") else ""
            print(f"  {name:14s} {ms:8.3f} ms{ratio}", flush=True)
    (out / f"s39_ring_kv{args.kv_heads}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
