"""Thirty-second session: the bf16 grouped matmul against a dense matmul of the same work (issue 42: forward
>= 0.90, forward+backward >= 0.95 of dense), at `ejkernel bench grouped_matmul`'s shape (M 32768, K 4096, N 1536,
64 random groups, bf16 output), the Mosaic GPU kernels by schedule.

    PYTHONPATH=src python exp/s32_gmm.py                       # on an H100/H200, a few minutes with compilation
    PYTHONPATH=src python exp/s32_gmm.py --only "mosaic spans,mosaic tiles"
    PYTHONPATH=src python exp/s32_gmm.py --quick               # a tiny shape in Mosaic GPU interpret mode (CPU)

Variants: `dense` (`jnp.dot` of `[M, K] x [K, N]`, the same FLOPs), `auto` (Triton forward, Mosaic GPU trained),
`triton`, and the Mosaic GPU kernels: `mosaic tiles` (today's default: 128 x 256 x 64 row tiles, a K loop per
group a tile straddles, merged in shared memory), `mosaic spans` (`GroupedMatmulConfig(mosaic_spans=True)`: tiles
follow each group from its first row rounded down to 8 and store only their own rows), each also with ping-pong
forward tiles (`num_warps=4`, 128 x 128 per warpgroup, tiles alternating so that one's epilogue runs beside the
other's matmuls), `mosaic spans 256` (256-row spans, 128 x 128 per warpgroup) and `mosaic spans pingpong bwd`
(both gradients' products in ping-pong tiles: the weights' gradient runs short K loops, about 8 steps a group at this
shape, whose epilogues the ping-pong hides). Each variant is compiled and run
once alone, its output (forward) or gradients checked against the Triton kernels' (`rel` = ‖x − ref‖ / ‖ref‖);
then all that ran are timed together (interleaved). A variant whose barriers deadlock hangs the GPU: the watchdog
names it after `--stall` seconds without progress and exits (rerun with `--skip` it). One line per variant and
mode: ms, TFLOP/s (2·M·K·N forward, 3 times that forward+backward) and the fraction of dense.
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
from _kit import compile_and_time, interpret_context, log, rel, start_watchdog

from ejkernel.benchmarks.grouped_matmul import SHAPES, random_group_sizes
from ejkernel.kernels._pallas.gpu.grouped_matmul._interface import mosaic_grouped_matmul
from ejkernel.modules import GroupedMatmulConfig, grouped_matmul
from ejkernel.ops import BwdParams, FwdParams

PINGPONG = FwdParams(block_q=128, block_d=128, num_warps=4)
MOSAIC = {
    "mosaic tiles": GroupedMatmulConfig(),
    "mosaic spans": GroupedMatmulConfig(mosaic_spans=True),
    "mosaic tiles pingpong": GroupedMatmulConfig(fwd_params=PINGPONG),
    "mosaic spans pingpong": GroupedMatmulConfig(mosaic_spans=True, fwd_params=PINGPONG),
    "mosaic spans 256": GroupedMatmulConfig(mosaic_spans=True, fwd_params=FwdParams(block_q=256, block_d=128)),
    "mosaic spans pingpong bwd": GroupedMatmulConfig(
        mosaic_spans=True, bwd_params=BwdParams(block_q=128, block_d=128, num_warps=4)
    ),
}
REFERENCE = "triton"
QUICK_SHAPE = (300, 256, 384, 5)
MODES = ("fwd", "fwd+bwd")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a tiny shape in Mosaic GPU interpret mode (CPU)")
    p.add_argument("--shape", help="M,K,N,G instead of the bench's MoE shape")
    p.add_argument("--only", help="comma-separated Mosaic variant names (dense, auto and triton always run)")
    p.add_argument("--skip", help="comma-separated variant names to leave out (one that hung)")
    p.add_argument("--modes", default=",".join(MODES), help="fwd, fwd+bwd or both")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--stall", type=float, default=180.0, help="watchdog: seconds without progress before exiting")
    args = p.parse_args()
    start_watchdog(args.stall)
    shape = tuple(map(int, args.shape.split(","))) if args.shape else (QUICK_SHAPE if args.quick else SHAPES[0])
    mosaic = MOSAIC if not args.only else {n: MOSAIC[n] for n in args.only.split(",")}
    context = interpret_context(args.quick)  # (the Triton and dense rows need a GPU)
    log(f"device {jax.devices()[0].device_kind}, jax {jax.__version__}, shape {shape}, variants {list(mosaic)}")
    with context:
        for mode in args.modes.split(","):
            run(args, shape, mosaic, mode)
    log("done")


def variants(lhs, rhs, sizes, mosaic: dict, backward: bool, quick: bool) -> dict:
    """name -> zero-argument call (arrays bound as arguments, not closed over: XLA would fold them)."""
    out = dict(preferred_element_type=jnp.bfloat16)
    fns = {}
    if quick:  # the kernels without the device check (a CPU is no Hopper GPU); XLA stands in for Triton
        fns[REFERENCE] = lambda a, b: grouped_matmul(a, b, sizes, platform="xla", **out)
        for name, cfg in mosaic.items():
            fns[name] = lambda a, b, cfg=cfg: mosaic_grouped_matmul(a, b, sizes, cfg=cfg, **out)
    else:
        fns["dense"] = lambda a, b: jnp.dot(a, b[0])
        fns["auto"] = lambda a, b: grouped_matmul(a, b, sizes, **out)
        fns[REFERENCE] = lambda a, b: grouped_matmul(a, b, sizes, platform="triton", **out)
        for name, cfg in mosaic.items():
            fns[name] = lambda a, b, cfg=cfg: grouped_matmul(a, b, sizes, platform="pallas", cfg=cfg, **out)
    if backward:
        step = lambda fn: jax.jit(jax.grad(lambda a, b: jnp.sum(fn(a, b).astype(jnp.float32)), argnums=(0, 1)))
    else:
        step = jax.jit
    return {name: functools.partial(step(fn), lhs, rhs) for name, fn in fns.items()}


def run(args, shape, mosaic: dict, mode: str) -> None:
    m, k, n, groups = shape
    where = f"M={m} K={k} N={n} G={groups} {mode}"
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    lhs = jax.random.normal(keys[0], (m, k), jnp.bfloat16)
    rhs = (jax.random.normal(keys[1], (groups, k, n), jnp.float32) * k**-0.5).astype(jnp.bfloat16)
    sizes = random_group_sizes(m, groups)
    calls = variants(lhs, rhs, sizes, mosaic, mode == "fwd+bwd", args.quick)
    timings, outputs = compile_and_time(where, calls, skip=args.skip, quick=args.quick, repeats=args.repeats)
    work = 2.0 * m * k * n * (3.0 if mode == "fwd+bwd" else 1.0)
    dense, reference = timings.get("dense"), outputs.get(REFERENCE)
    for name, seconds in timings.items():
        fraction = f"  {dense / seconds:.3f} of dense" if dense else ""
        check = ""
        if reference is not None and name not in ("dense", REFERENCE):
            got, want = jax.tree.leaves(outputs[name]), jax.tree.leaves(reference)
            check = "  rel " + ", ".join(f"{rel(g, w):.1e}" for g, w in zip(got, want, strict=True))
        log(f"{where}: {name:22s} {1e3 * seconds:8.3f} ms {work / seconds / 1e12:7.1f} TFLOP/s{fraction}{check}")


if __name__ == "__main__":
    main()
