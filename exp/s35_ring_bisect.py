"""Issue 46: which change since `ff12ef9` made the 4-KV-head ring's forward+backward slower (58.6 -> 66 ms).

Loads several versions of `ejkernel/kernels/_common/ring.py` side by side (each file its own module, with its own
`RingSpec` and `run_ring`), runs each around the same cuDNN step kernel on every GPU (S=65536 causal, H=16,
D=128, bf16, sequence split, mirrored layout), and times them interleaved in one run per mode, so that their
ratios are free of run-to-run drift. Writes the compiled schedules and a JSON of the times to --out.

    python exp/s35_ring_bisect.py --versions ff12=/tmp/v/ff12.py,head=src/.../ring.py --kv-heads 4 --out $OUT
"""

import argparse
import functools
import gzip
import importlib.util
import json
import pathlib
import sys

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ejkernel.kernels._cuda.ring_attention._interface import CudnnBlock
from ejkernel.kernels._pallas.gpu.ring_attention._interface import MosaicGpuBlock
from ejkernel.ops.autotune import time_fns

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from ring_schedule import schedule


def load(name: str, path: str):
    spec = importlib.util.spec_from_file_location(f"ring_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def ring_inputs(seq: int, kv_heads: int):
    """(devices, a mesh of them over axis "sp", the sequence-split spec, q / k / v [1, seq, 16 | kv_heads, 128] bf16,
    the same split over the mesh): issue 46's ring call."""
    devices = jax.devices()
    mesh = jax.make_mesh((len(devices),), ("sp",), axis_types=(jax.sharding.AxisType.Auto,), devices=devices)
    spec = P(None, "sp")
    keys = jax.random.split(jax.random.PRNGKey(1), 3)
    shapes = [(1, seq, 16, 128)] + [(1, seq, kv_heads, 128)] * 2
    qkv = [jax.random.normal(k, s, jnp.bfloat16) for k, s in zip(keys, shapes, strict=True)]
    return devices, mesh, spec, qkv, [jax.device_put(x, NamedSharding(mesh, spec)) for x in qkv]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--versions", required=True, help="name=path,... of ring.py files")
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=65536)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--modes", default="fwd,fwd+bwd")
    p.add_argument("--block", default="cudnn", choices=("cudnn", "mosaic"), help="the per-step kernels")
    p.add_argument("--hlo", default="", help="versions whose compiled HLO is written too (gzipped)")
    p.add_argument("--out", default="out")
    args = p.parse_args()
    devices, mesh, spec, _, sharded = ring_inputs(args.seq, args.kv_heads)
    n = len(devices)
    block = MosaicGpuBlock(128 ** (-0.5), True, None) if args.block == "mosaic" else CudnnBlock(128 ** (-0.5), True)

    def ring(module):
        layout = module.RingSpec(axis_name="sp", layout="mirrored", causal=True, window=None)
        body = lambda q, k, v: module.run_ring(block, layout, n, q, k, v)
        return jax.shard_map(body, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec)

    versions = dict(item.split("=", 1) for item in args.versions.split(","))
    rings = {name: ring(load(name, path)) for name, path in versions.items()}
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for mode in args.modes.split(","):
        calls = {}
        for name, fn in rings.items():
            if mode == "fwd+bwd":
                fn = jax.grad(lambda q, k, v, fn=fn: jnp.sum(fn(q, k, v).astype(jnp.float32)), argnums=(0, 1, 2))
            compiled = jax.jit(fn).lower(*sharded).compile()
            tag = mode.replace("+", "_")
            (out / f"schedule_{name}_{tag}_kv{args.kv_heads}.txt").write_text("\n".join(schedule(compiled.as_text())))
            if name in args.hlo.split(","):
                hlo = gzip.compress(compiled.as_text().encode())
                (out / f"hlo_{name}_{tag}_kv{args.kv_heads}.txt.gz").write_bytes(hlo)
            call = functools.partial(compiled, *sharded)
            jax.block_until_ready(call())
            calls[name] = call
        times = time_fns(calls, repeats=args.repeats, warmup=2)
        results[mode] = {k: t * 1e3 for k, t in times.items()}
        print(f"== {mode}, {args.block} steps, kv heads {args.kv_heads}, {n} x {devices[0].device_kind}", flush=True)
        for name, ms in results[mode].items():
            print(f"  {name:12s} {ms:8.3f} ms", flush=True)
    (out / f"s35_bisect_{args.block}_kv{args.kv_heads}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
