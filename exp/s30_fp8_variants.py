"""Thirtieth session: the Mosaic GPU float8 (e4m3) flash attention forward by schedule and tiling (issue 42: the fp8
forward at >= 1.6x cuDNN bf16), beside our bf16 forward and cuDNN's bf16 forward, at `ejkernel bench flash_attention
--part fp8`'s shapes (head dim 128, H 16, causal and not).

    PYTHONPATH=src python exp/s30_fp8_variants.py             # on an H100/H200, about 5 minutes with compilation
    PYTHONPATH=src python exp/s30_fp8_variants.py --only "pp bk128 s2,ov bk128 s2" --shape 1,16384,16,128
    PYTHONPATH=src python exp/s30_fp8_variants.py --quick     # a tiny shape in Mosaic GPU interpret mode, on a CPU

Variants (`float8_attention`'s keywords; since session 49 P is always P·V's register operand, the fastest in session
48's calls): `pp` the ping-pong schedule (the default until session 31; now causal only), `ov` the
overlapped one (tile t's Q·Kᵀ issued beside tile t-1's P·V; `turns`: the warpgroups take turns at issuing, `free`: they
do not, neither: turns where causal), `bk` the key tile, `s` the shared-memory stages of the K/Vᵀ ring, `e` the columns
of each score tile whose exp2 runs on the FMA units (`exp2_fma_cols`; interpreted on a CPU these compute wrong
exponentials, see `_parts.exp2_fma`). Each variant is compiled and run once alone, its output checked against the
default's (`rel` = ‖x − ref‖ / ‖ref‖: 0 at the same key tile, about 1e-2 at another, whose row maxima round P
differently) and against cuDNN's bf16 output on the unrounded inputs (e4m3's rounding of the inputs: about 5%, the same
for every variant); then all that ran are timed together (interleaved). A variant whose barriers deadlock hangs the GPU:
the watchdog names it after `--stall` seconds without progress and exits (rerun with `--skip` it). One line per variant:
TFLOP/s (4·B·H·S²·D, halved when causal) and the ratio to cuDNN bf16."""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
from _kit import compile_and_time, interpret_context, log, rel, start_watchdog

from ejkernel.benchmarks.flash_attention import SHAPES
from ejkernel.kernels._pallas.gpu.flash_attention._interface import float8_attention
from ejkernel.modules import flash_attention
from ejkernel.ops import FwdParams


def variant(schedule: str, block_k: int, stages: int, fma_cols: int = 0) -> dict:
    """`float8_attention` keywords of `pp`, `ov`, `ov-turns` or `ov-free` at a key tile, ring depth and number
    of exp2 columns on the FMA units."""
    options = {"fwd_params": FwdParams(block_k=block_k, num_stages=stages), "exp2_fma_cols": fma_cols}
    options["overlap"] = schedule != "pp"
    if schedule in ("ov-turns", "ov-free"):
        options["overlap_schedule"] = schedule == "ov-turns"
    return options


VARIANTS = {
    f"{schedule} bk{block_k} s{stages}" + (f" e{fma_cols}" if fma_cols else ""): variant(
        schedule, block_k, stages, fma_cols
    )
    for schedule, block_k, stages, fma_cols in [
        ("pp", 128, 2, 0),
        ("pp", 128, 3, 0),
        ("pp", 128, 4, 0),
        ("pp", 64, 2, 0),
        ("pp", 64, 4, 0),
        ("pp", 128, 2, 32),
        ("ov", 128, 2, 0),
        ("ov-turns", 128, 2, 0),
        ("ov-free", 128, 2, 0),
        ("ov", 128, 3, 0),
        ("ov", 128, 4, 0),
        ("ov", 64, 4, 0),
        ("ov", 128, 2, 32),
        ("ov", 128, 2, 64),
        ("ov-free", 128, 2, 16),
        ("ov-free", 128, 2, 32),
        ("pp", 128, 2, 16),
    ]
}
DEFAULT = "ov bk128 s2"
QUICK_SHAPES = [(1, 256, 2, 128)]


def fp8_call(options: dict, causal: bool):
    scale = 128**-0.5
    return jax.jit(lambda q, k, v, d: float8_attention(q, k, v, d, softmax_scale=scale, causal=causal, **options))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a tiny shape in Mosaic GPU interpret mode (CPU)")
    p.add_argument("--shape", action="append", help="B,S,H,D instead of the bench's head-dim-128 shapes")
    p.add_argument("--only", help="comma-separated variant names (the default is always run, as the reference)")
    p.add_argument("--skip", help="comma-separated variant names to leave out (one that hung)")
    p.add_argument("--causal", choices=("both", "yes", "no"), default="both")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--stall", type=float, default=180.0, help="watchdog: seconds without progress before exiting")
    args = p.parse_args()
    start_watchdog(args.stall)
    names = list(VARIANTS)
    if args.only:
        names = [DEFAULT] + [n for n in args.only.split(",") if n != DEFAULT]
    if args.skip:
        names = [n for n in names if n not in args.skip.split(",")]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; variants: {list(VARIANTS)}")
    shapes = [tuple(map(int, s.split(","))) for s in args.shape] if args.shape else None
    shapes = shapes or (QUICK_SHAPES if args.quick else [s for s in SHAPES if s[3] == 128])
    causals = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]
    context = interpret_context(args.quick)
    log(f"device {jax.devices()[0].device_kind}, jax {jax.__version__}, variants {names}")
    with context:
        for batch, seq, heads, dim in shapes:
            for causal in causals:
                run_case(args, names, batch, seq, heads, dim, causal)
    log("done")


def run_case(args, names, batch: int, seq: int, heads: int, dim: int, causal: bool) -> None:
    where = f"B={batch} S={seq} H={heads} D={dim} causal={causal}"
    keys = jax.random.split(jax.random.PRNGKey(seq + heads + int(causal)), 3)
    q, k, v = (jax.random.normal(key, (batch, seq, heads, dim), jnp.bfloat16) for key in keys)
    # codes of 4x the inputs, descaled by 1/4 (as the bench): the float8 calls attend what the bf16 calls do
    q8, k8, v8 = ((4 * x).astype(jnp.float8_e4m3fn) for x in (q, k, v))
    descales = tuple(jnp.full((heads,), 0.25, jnp.float32) for _ in range(3))
    calls = {name: functools.partial(fp8_call(VARIANTS[name], causal), q8, k8, v8, descales) for name in names}
    calls["ours-bf16"] = functools.partial(jax.jit(lambda q, k, v: flash_attention(q, k, v, causal=causal)), q, k, v)
    if not args.quick:
        cudnn = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="cudnn"))
        calls["cudnn-bf16"] = functools.partial(cudnn, q, k, v)
    timings, outputs = compile_and_time(where, calls, skip=None, quick=args.quick, repeats=args.repeats)
    reference = outputs.get(DEFAULT)
    truth = outputs.get("cudnn-bf16", outputs["ours-bf16"])
    flops = 4 * batch * heads * seq * seq * dim * (0.5 if causal else 1.0)
    base = timings.get("cudnn-bf16")
    for name, seconds in timings.items():
        tflops = flops / seconds / 1e12
        ratio = f"  x{base / seconds:.2f} cuDNN" if base else ""
        checks = ""
        if name in VARIANTS:
            checks = f"  rel {rel(outputs[name], reference):.1e} to {DEFAULT}" if reference is not None else ""
            checks += f", {rel(outputs[name], truth):.1e} to bf16"
        log(f"{where}: {name:16s} {1e3 * seconds:8.3f} ms {tflops:7.1f} TFLOP/s{ratio}{checks}")


if __name__ == "__main__":
    main()
