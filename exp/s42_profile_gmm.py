"""Session 42: where the 4-bit grouped matmul's steps spend their cycles (issue 45), beside the bf16 Mosaic GPU forward.

Mosaic GPU's on-device profiler (`CompilerParams(profile_space=...)`) records, per warpgroup, the SM clock at entering
and leaving each `jax.named_scope` of the kernel body. Here the scopes are added from outside (no source change):
`plgpu.barrier_wait`, `plgpu.wgmma`, `plgpu.wgmma_wait` and the 4-bit kernel's `_register_operand` (the decode) are
wrapped in scopes of their names, and `plgpu.kernel` passes the profiler's parameters while a kernel is traced.
Each kernel runs once at the MoE shape (M 32768, K 4096, N 1536, 64 groups, bf16 lhs and out); its trace (the first
`--events` scopes of each warpgroup, bounds-checked) is summarised per warpgroup role: cycles a step in each scope,
exclusive of the scopes inside it, and outside any scope ("other"), and the first steps of one CTA as a timeline.

    python exp/s42_profile_gmm.py --out $OUT
"""

import argparse
import collections
import functools
import json
import pathlib
import sys
import tempfile

import jax
import jax.numpy as jnp
from jax.experimental.pallas import mosaic_gpu as plgpu

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from s39_mxfp4 import kernel_call, moe_case

from ejkernel.kernels._common.code_bits import as_bytes
from ejkernel.kernels._common.device import num_sms
from ejkernel.kernels._pallas.gpu.grouped_matmul import _four_bit
from ejkernel.kernels._pallas.gpu.grouped_matmul._four_bit import MosaicGpuFourBitGroupedMatmulTiling
from ejkernel.modules import grouped_matmul
from ejkernel.ops.autotune import time_fns

SCOPED = ("barrier_wait", "wgmma", "wgmma_wait")
ROLES = {0: "compute 0", 1: "compute 1", 2: "memory"}


def scoped(name, fn):
    def wrapped(*args, **kwargs):
        with jax.named_scope(name):
            return fn(*args, **kwargs)

    return wrapped


def profiled_kernel(kernel, events: int, folder: str):
    """`plgpu.kernel` with the profiler's parameters added: every Mosaic GPU launch traced while it stands in."""
    params = plgpu.CompilerParams(profile_space=events, profile_dir=folder, profile_bounds_check=True)
    return lambda body, **kwargs: kernel(body, compiler_params=params, **kwargs)


def summary(trace: dict, wgs: int = 3) -> dict:
    """Per role: exclusive cycles a scope entry, entries, and the share of the traced span; one CTA's first events."""
    by_tid = collections.defaultdict(list)
    for e in trace["traceEvents"]:
        by_tid[e["tid"]].append(e)
    totals = {role: collections.Counter() for role in ROLES.values()}
    counts = {role: collections.Counter() for role in ROLES.values()}
    spans = collections.Counter()
    timeline = []
    evs0 = min(e["ts"] for e in by_tid[1])
    for tid, evs in sorted(by_tid.items()):
        role = ROLES[(tid - 1) % wgs]
        stack, last = [], None
        t0 = evs[0]["ts"]
        for e in evs:
            t = (e["ts"] - t0) * 1e3  # cycles
            name = stack[-1] if stack else "other"
            if last is not None:
                totals[role][name] += t - last
            last = t
            if e["ph"] == "B":
                stack.append(e["name"])
                counts[role][e["name"]] += 1
            else:
                stack.pop()
            if (tid - 1) // wgs == 0:  # CTA 0, every warpgroup, on one clock (its own start subtracted)
                timeline.append((role, e["name"], e["ph"], round((e["ts"] - evs0) * 1e3)))
        spans[role] += last or 0
    out = {}
    for role in ROLES.values():
        if not spans[role]:
            continue
        out[role] = {
            name: {"cycles": round(c), "share": round(c / spans[role], 3), "entries": counts[role][name]}
            for name, c in totals[role].most_common()
        }
    return {"roles": out, "timeline_cta0": timeline}


def run(label: str, call, args):
    folder = tempfile.mkdtemp()
    today = plgpu.kernel
    plgpu.kernel = profiled_kernel(today, args.events, folder)
    try:
        jax.block_until_ready(call())
        jax.effects_barrier()
    except Exception as err:  # (the others still run)
        print(f"== {label}: failed: {str(err).splitlines()[0][:400]}", flush=True)
        return None
    finally:
        plgpu.kernel = today
    files = sorted(pathlib.Path(folder).glob("*trace.json"))
    if not files:
        print(f"== {label}: no trace written", flush=True)
        return None
    s = summary(json.loads(files[-1].read_text()))
    print(f"== {label} ({len(files)} trace files)", flush=True)
    for role, names in s["roles"].items():
        print(f"  {role}: " + ", ".join(f"{n} {v['share']:.2f} ({v['entries']})" for n, v in names.items()), flush=True)
    return s


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="out")
    p.add_argument("--events", type=int, default=400)
    p.add_argument("--formats", default="mxfp4,affine")
    p.add_argument("--bf16", default="yes")
    p.add_argument("--repeats", type=int, default=0, help="also time each tiling unprofiled (0: not)")
    p.add_argument("--tilings", default="256x3", help="block_m x stages [x CTAs], comma-separated")
    args = p.parse_args()
    for name in SCOPED:
        setattr(plgpu, name, scoped(name, getattr(plgpu, name)))
    _four_bit._register_operand = scoped("decode", _four_bit._register_operand)
    results, timed = {}, {}
    for fmt in args.formats.split(","):
        lhs, w, sizes, q = moe_case("32768,4096,1536,64", fmt)
        for spec in args.tilings.split(","):
            bm, stages, ctas = [*map(int, spec.split("x")), num_sms()][:3]
            tiling = MosaicGpuFourBitGroupedMatmulTiling(bm, stages, ctas)
            fn = kernel_call(q, as_bytes(q.data), sizes, tiling)
            results[f"{fmt} {spec}"] = run(f"{fmt} {spec}", lambda fn=fn, lhs=lhs: fn(lhs), args)
            timed[f"{fmt} {spec}"] = functools.partial(kernel_call(q, as_bytes(q.data), sizes, tiling), lhs)
    if args.repeats:  # unprofiled (each kernel traced again with `plgpu.kernel` restored)
        times = time_fns(timed, repeats=args.repeats, warmup=2)
        results["ms"] = {key: 1e3 * t for key, t in times.items()}
        print("  ".join(f"{key} {1e3 * t:.3f} ms" for key, t in times.items()), flush=True)
    if args.bf16 != "yes":
        return dump(args.out, results)
    bf16 = jax.jit(lambda a: grouped_matmul(a, w, sizes, platform="pallas", preferred_element_type=jnp.bfloat16))
    results["bf16 mosaic"] = run("bf16 mosaic (pallas)", lambda: bf16(lhs), args)
    dump(args.out, results)


def dump(folder: str, results: dict):
    out = pathlib.Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gmm_profile_s42.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
