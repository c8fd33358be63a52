"""Issue 46's ring on 2 GPUs: where the time goes, and the Mosaic GPU per-step kernels beside cuDNN's.

Times, in one interleaved run per mode (forward, forward+backward), at S=65536 causal H=16 D=128 bf16:
- the ring with cuDNN and with Mosaic GPU per-step kernels (`platform="cuda"`, `"pallas"`);
- the same rings with every `ppermute` replaced by the identity ("nocomm": the same kernels and merges on the
  same pieces, wrong values, no transfers): ring - nocomm is the exposed communication; and ("bf16t") with the
  float32 transfers (the backward's partial dK / dV) sent as bfloat16;
- flash attention on one GPU at S and at S/2 with cuDNN and with Mosaic GPU (2 x S/2 is what one device of
  the ring computes, in two calls' worth of kernels).
Prints ms and the ring / flash ratios; with --schedules writes the compiled schedules of the rings to $OUT.

    python exp/s33_ring.py --kv-heads 16 --out $OUT
"""

import argparse
import contextlib
import functools
import json
import pathlib
import sys

import jax
import jax.numpy as jnp

from ejkernel.modules import flash_attention, ring_attention
from ejkernel.ops.autotune import time_fns

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from ring_schedule import schedule
from s35_ring_bisect import ring_inputs


@contextlib.contextmanager
def no_transfers():
    real = jax.lax.ppermute
    jax.lax.ppermute = lambda x, axis_name, perm: x
    try:
        yield
    finally:
        jax.lax.ppermute = real


@contextlib.contextmanager
def bf16_float_transfers():
    """float32 arrays travel as bfloat16 (the backward's partial dK / dV: half the bytes, one more rounding)."""
    real = jax.lax.ppermute

    def send(x, axis_name, perm):
        narrow = lambda t: t.astype(jnp.bfloat16) if t.dtype == jnp.float32 else t
        widen = lambda t, like: t.astype(like.dtype)
        sent = real(jax.tree_util.tree_map(narrow, x), axis_name, perm)
        return jax.tree_util.tree_map(widen, sent, x)

    jax.lax.ppermute = send
    try:
        yield
    finally:
        jax.lax.ppermute = real


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--kv-heads", type=int, default=16)
    p.add_argument("--seq", type=int, default=65536)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--platforms", default="cuda,pallas")
    p.add_argument("--nocomm", action="store_true")
    p.add_argument("--bf16t", action="store_true", help="also each ring with float32 transfers sent as bfloat16")
    p.add_argument("--flash", default="cuda,pallas", help="one-GPU flash attention platforms ('' for none)")
    p.add_argument("--tag", default="", help="suffix of the output files")
    p.add_argument("--out", default="out")
    p.add_argument("--modes", default="fwd,fwd+bwd")
    p.add_argument("--schedules", action="store_true", help="write the rings' compiled schedules to --out")
    args = p.parse_args()
    devices, mesh, spec, qkv, sharded = ring_inputs(args.seq, args.kv_heads)
    n = len(devices)
    single = [jax.device_put(x, devices[0]) for x in qkv]
    half = [x[:, : args.seq // n] for x in single]

    def ring(platform):
        return lambda q, k, v: ring_attention(
            q, k, v, causal=True, platform=platform, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec
        )

    def flash(platform):
        return lambda q, k, v: flash_attention(q, k, v, causal=True, platform=platform)

    platforms = args.platforms.split(",")
    variants = {}
    for plat in platforms:
        variants[f"ring-{plat}"] = (ring(plat), sharded, contextlib.nullcontext)
        if args.nocomm:
            variants[f"ring-{plat}-nocomm"] = (ring(plat), sharded, no_transfers)
        if args.bf16t:
            variants[f"ring-{plat}-bf16t"] = (ring(plat), sharded, bf16_float_transfers)
    for plat in filter(None, args.flash.split(",")):
        variants[f"flash-{plat} S"] = (flash(plat), single, contextlib.nullcontext)
        variants[f"flash-{plat} S/n"] = (flash(plat), half, contextlib.nullcontext)

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for mode in args.modes.split(","):
        backward = mode == "fwd+bwd"
        calls = {}
        for name, (fn, inputs, transfers) in variants.items():
            if backward:
                fn = jax.grad(lambda q, k, v, fn=fn: jnp.sum(fn(q, k, v).astype(jnp.float32)), argnums=(0, 1, 2))
            try:
                with transfers():
                    compiled = jax.jit(fn).lower(*inputs).compile()
                if args.schedules and name.startswith("ring") and transfers is contextlib.nullcontext:
                    lines = schedule(compiled.as_text())
                    path = out / f"schedule_{name}_{mode.replace('+', '_')}_kv{args.kv_heads}{args.tag}.txt"
                    path.write_text("\n".join(lines))
                call = functools.partial(compiled, *inputs)
                jax.block_until_ready(call())
                calls[name] = call
            except Exception as err:
                print(f"{name} {mode}: {type(err).__name__}: {str(err)[:300]}", flush=True)
        times = time_fns(calls, repeats=args.repeats, warmup=2)
        results[mode] = {k: t * 1e3 for k, t in times.items()}
        print(f"== {mode}, kv heads {args.kv_heads}, {n} x {devices[0].device_kind}", flush=True)
        for name, ms in results[mode].items():
            line = f"  {name:24s} {ms:8.3f} ms"
            if name.startswith("ring"):
                ratios = [
                    f"{results[mode][f] / ms:.3f}x {f}"
                    for f in results[mode]
                    if f.startswith("flash") and f.endswith(" S")
                ]
                line += "   " + ", ".join(ratios)
            print(line, flush=True)
    (out / f"s33_ring_kv{args.kv_heads}{args.tag}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
