"""GPU experiment: the Mosaic GPU grouped matmul against the XLA path (errors), then timed beside dense and Triton.

Run on an H100/H200 from the repository root:

    PYTHONPATH=$PWD/src python3 exp/gmm_gpu.py [--skip-check] [--skip-bwd] [--repeats 10]

(a) relative errors of the Mosaic forward, dlhs and drhs against the XLA path at medium shapes with
random group sizes (some empty, some rows past the last group), both rhs layouts, a tiny M and all
groups empty; (b) forward and forward+backward times at M=32768, K=4096, N=1536, G=64 bf16 for a dense
`jnp.dot` of the same work, the Triton path and the Mosaic kernels at several tilings, as TFLOP/s and the
ratio to dense, in a table at the end. Each case runs in its own try/except (the first lines of an
exception are printed) so that one failure hides nothing else.
"""

from __future__ import annotations

import argparse
import functools
import os
import time
import zlib

import jax
import jax.numpy as jnp
import numpy as np
from _kit import first_lines, log, rel, start_watchdog

from ejkernel.benchmarks.grouped_matmul import random_group_sizes
from ejkernel.kernels._common.grouped_matmul import check_args
from ejkernel.kernels._pallas.gpu.grouped_matmul._interface import grouped_matmul_mosaic_gpu, plan
from ejkernel.kernels._pallas.gpu.grouped_matmul._kernel import fit_smem
from ejkernel.kernels._xla.grouped_matmul._interface import grouped_matmul_xla
from ejkernel.modules import GroupedMatmulConfig, grouped_matmul
from ejkernel.ops import BwdParams, FwdParams
from ejkernel.ops.autotune import time_fns


def group_sizes(m: int, groups: int, seed: int, empty: int = 0, tail: int = 0) -> jax.Array:
    """Random sizes summing to m - tail, with `empty` groups forced empty (first, last, middle ...)."""
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.integers(0, m - tail + 1, groups - 1))
    sizes = np.diff(np.concatenate([[0], cuts, [m - tail]]))
    for i in [0, groups - 1, groups // 2, 1, groups - 2][:empty]:  # hand an empty group's rows to a neighbour
        j = i + 1 if i + 1 < groups else i - 1
        sizes[j] += sizes[i]
        sizes[i] = 0
    return jnp.asarray(sizes, jnp.int32)


def tilings_of(lhs, rhs, sizes, transpose, cfg, out_dtype):
    """The tilings the kernels will run (after the shared-memory fit), for the log."""
    dims = check_args(lhs, rhs, sizes, transpose_rhs=transpose)
    p = plan(dims, transpose, cfg)
    fitted = (
        fit_smem(p.fwd, lhs.dtype, out_dtype),
        fit_smem(p.dlhs, lhs.dtype, lhs.dtype),
        fit_smem(p.drhs, lhs.dtype, rhs.dtype),
    )
    return " | ".join(
        f"{name} m{t.block_m} n{t.block_n} k{t.block_k} s{t.stages}{' pingpong' if t.pingpong else ''}"
        for name, t in zip(("fwd", "dlhs", "drhs"), fitted, strict=True)
    )


# ---- (a) errors against the XLA path ----

CHECKS = [
    # name, M, K, N, G, empty groups, rows past the last group, transpose_rhs, out dtype, cfg
    ("medium", 6000, 1024, 768, 16, 3, 37, False, jnp.bfloat16, None),
    ("medium-transposed-f32out", 6003, 1024, 768, 16, 3, 37, True, jnp.float32, None),
    (
        "medium-256-row-tiles-pingpong-bwd",
        6000,
        1024,
        768,
        16,
        2,
        0,
        False,
        jnp.bfloat16,
        GroupedMatmulConfig(
            fwd_params=FwdParams(block_q=256, block_d=128, num_stages=4),
            bwd_params=BwdParams(block_q=128, block_d=128, num_warps=4),
        ),
    ),
    ("tiny-M", 40, 128, 64, 7, 2, 4, False, jnp.bfloat16, None),
    ("all-empty", 2048, 256, 256, 4, 4, 0, True, jnp.bfloat16, None),
]


def check(name, m, k, n, groups, empty, tail, transpose, out_dtype, cfg):
    keys = jax.random.split(jax.random.PRNGKey(zlib.crc32(name.encode())), 3)
    lhs = jax.random.normal(keys[0], (m, k), jnp.float32).astype(jnp.bfloat16)
    shape = (groups, n, k) if transpose else (groups, k, n)
    rhs = (jax.random.normal(keys[1], shape, jnp.float32) * k**-0.5).astype(jnp.bfloat16)
    if empty >= groups:
        sizes = jnp.zeros((groups,), jnp.int32)
    else:
        sizes = group_sizes(m, groups, seed=len(name), empty=empty, tail=tail)
    dout = jax.random.normal(keys[2], (m, n), jnp.float32).astype(out_dtype)
    options = dict(preferred_element_type=out_dtype, transpose_rhs=transpose)
    tiles = tilings_of(lhs, rhs, sizes, transpose, cfg, out_dtype)
    log(
        f"check {name}: M={m} K={k} N={n} G={groups} sizes[:8]={np.asarray(sizes)[:8].tolist()} "
        f"transpose={transpose} out={jnp.dtype(out_dtype).name}; tiles {tiles}"
    )

    mosaic = functools.partial(grouped_matmul_mosaic_gpu, cfg=cfg)

    def forward(fn, lhs, rhs):
        return fn(lhs, rhs, sizes, **options)

    def backward(fn, lhs, rhs, dout):
        return jax.vjp(lambda a, b: fn(a, b, sizes, **options), lhs, rhs)[1](dout)

    # the forward alone first: a failure of the backward kernels still leaves its verdict
    ref = jax.jit(functools.partial(forward, grouped_matmul_xla))(lhs, rhs)
    out = jax.block_until_ready(jax.jit(functools.partial(forward, mosaic))(lhs, rhs))
    owned = int(np.asarray(sizes).sum())
    past = float(jnp.max(jnp.abs(out[owned:].astype(jnp.float32)))) if owned < m else 0.0
    errs = [rel(out, ref)]
    log(f"  forward: rel err {errs[0]:.2e}; max |out| on the {m - owned} rows past the groups: {past}")
    ref_grads = jax.jit(functools.partial(backward, grouped_matmul_xla))(lhs, rhs, dout)
    grads = jax.block_until_ready(jax.jit(functools.partial(backward, mosaic))(lhs, rhs, dout))
    errs += [rel(g, r) for g, r in zip(grads, ref_grads, strict=True)]
    empty_groups = np.flatnonzero(np.asarray(sizes) == 0)
    empty_drhs = float(jnp.max(jnp.abs(grads[1][empty_groups].astype(jnp.float32)))) if empty_groups.size else 0.0
    ok = all(e <= tol for e, tol in zip(errs, (2e-2, 4e-2, 4e-2), strict=True)) and past == 0.0 and empty_drhs == 0.0
    log(
        f"  {'PASS' if ok else 'FAIL'} rel err vs xla: fwd {errs[0]:.2e}  dlhs {errs[1]:.2e}  drhs {errs[2]:.2e}  "
        f"max |out| past the groups {past}, max |drhs| of the {empty_groups.size} empty groups {empty_drhs}"
    )
    return ok


# ---- (b) timings ----

M, K, N, G = (int(x) for x in os.environ.get("GMM_SHAPE", "32768,4096,1536,64").split(","))
PINGPONG = FwdParams(block_q=128, block_d=128, block_k=64, num_warps=4)  # one warpgroup per tile, alternating
MOSAIC_FWD = {
    "mosaic 128x256x64": None,  # the default (stages cut to fit: 3)
    "mosaic 128x128x64 s6": FwdParams(block_q=128, block_d=128, block_k=64, num_stages=6),
    "mosaic 256x128x64 s3": FwdParams(block_q=256, block_d=128, block_k=64, num_stages=3),
    "mosaic 128x128x64 s4": FwdParams(block_q=128, block_d=128, block_k=64, num_stages=4),
    "mosaic pingpong 128x128x64": PINGPONG,
    "mosaic pingpong 64x256x64": FwdParams(block_q=64, block_d=256, block_k=64, num_warps=4),
}
MOSAIC_BWD = {  # (fwd params, bwd params): bwd tiles dlhs (rows, cols, contraction) and drhs (K tile, N tile, rows)
    "mosaic default": (None, None),
    "mosaic bwd drhs rows 128": (None, BwdParams(block_k=128, num_stages=3)),
    "mosaic bwd 128x128 s6": (None, BwdParams(block_q=128, block_d=128, block_k=64, num_stages=6)),
    "mosaic pingpong 128x128": (PINGPONG, BwdParams(block_q=128, block_d=128, num_warps=4)),
    "mosaic fwd pingpong + bwd default": (PINGPONG, None),
    "mosaic bwd pingpong 64x256": (None, BwdParams(block_q=64, block_d=256, num_warps=4)),
}


def timings(repeats: int, backward: bool, only: str = ""):
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    lhs = jax.random.normal(keys[0], (M, K), jnp.bfloat16)
    rhs = (jax.random.normal(keys[1], (G, K, N), jnp.float32) * K**-0.5).astype(jnp.bfloat16)
    sizes = random_group_sizes(M, G)  # the grouped_matmul benchmark's
    bf16 = dict(preferred_element_type=jnp.bfloat16)
    fns = {
        "dense": lambda a, b: jnp.dot(a, b[0]),
        "triton": lambda a, b: grouped_matmul(a, b, sizes, platform="triton", **bf16),
    }
    cfgs = {}
    if backward:
        for name, (fwd, bwd) in MOSAIC_BWD.items():
            cfgs[name] = GroupedMatmulConfig(fwd_params=fwd, bwd_params=bwd)
    else:
        fns["mosaic via platform=pallas"] = lambda a, b: grouped_matmul(a, b, sizes, platform="pallas", **bf16)
        for name, fwd in MOSAIC_FWD.items():
            cfgs[name] = GroupedMatmulConfig(fwd_params=fwd)
    for name, cfg in cfgs.items():
        fns[name] = functools.partial(
            lambda a, b, cfg: grouped_matmul_mosaic_gpu(a, b, sizes, cfg=cfg, **bf16), cfg=cfg
        )
    fns = {name: fn for name, fn in fns.items() if name in ("dense", "triton") or only in name}
    mode = "fwd+bwd" if backward else "fwd"
    ready = {}
    for name, fn in fns.items():
        if backward:
            step = jax.jit(jax.grad(lambda a, b, fn=fn: jnp.sum(fn(a, b).astype(jnp.float32)), argnums=(0, 1)))
        else:
            step = jax.jit(fn)
        call = functools.partial(step, lhs, rhs)
        try:
            t = time.perf_counter()
            jax.block_until_ready(call())
            tiles = f" (tiles {tilings_of(lhs, rhs, sizes, False, cfgs[name], jnp.bfloat16)})" if name in cfgs else ""
            log(f"{mode} {name}: compiled and ran once in {time.perf_counter() - t:.1f}s{tiles}")
            ready[name] = call
        except Exception as err:
            log(f"{mode} {name}: FAILED\n    {first_lines(err)}")
    if "mosaic via platform=pallas" in ready:  # which kernels platform="pallas" ran
        text = jax.jit(fns["mosaic via platform=pallas"]).lower(lhs, rhs).as_text()
        log(f"platform='pallas' lowers to {text.count('mosaic_gpu')} mosaic_gpu call(s)")
    log(f"{mode}: timing {len(ready)} variants, {repeats} interleaved rounds")
    seconds = time_fns(ready, repeats=repeats, warmup=2)
    flops = 2.0 * M * K * N * (3.0 if backward else 1.0)
    return [(mode, name, s, flops / s / 1e12, seconds.get("dense", float("nan")) / s) for name, s in seconds.items()]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-check", action="store_true")
    parser.add_argument("--skip-bwd", action="store_true")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--variants", default="", help="time only the variants whose name contains this")
    args = parser.parse_args()
    start_watchdog(float(os.environ.get("GMM_STALL_S", "150")))
    device = jax.devices()[0]
    log(f"device {device.device_kind} ({getattr(device, 'compute_capability', '?')}), jax {jax.__version__}")
    results = []
    if not args.skip_check:
        for case in CHECKS:
            try:
                results.append((case[0], check(*case)))
            except Exception as err:
                log(f"check {case[0]}: FAILED\n    {first_lines(err)}")
                results.append((case[0], False))
    rows = []
    for backward in (False,) if args.skip_bwd else (False, True):
        try:
            rows += timings(args.repeats, backward, args.variants)
        except Exception as err:
            log(f"timings {'fwd+bwd' if backward else 'fwd'}: FAILED\n    {first_lines(err)}")
    print()
    if results:
        print("checks: " + ", ".join(f"{name} {'PASS' if ok else 'FAIL'}" for name, ok in results))
    print(f"M={M} K={K} N={N} G={G} bf16 on {device.device_kind}; targets: fwd >= 0.65, fwd+bwd >= 0.60 x dense")
    print(f"{'mode':8s} {'variant':34s} {'ms':>8s} {'TFLOP/s':>8s} {'x dense':>8s}")
    for mode, name, s, tflops, ratio in rows:
        print(f"{mode:8s} {name:34s} {1e3 * s:8.3f} {tflops:8.1f} {ratio:8.3f}")
    log("done")


if __name__ == "__main__":
    main()
