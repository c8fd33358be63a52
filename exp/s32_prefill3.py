"""Thirty-second session, prefill tiles round three (issue 44: the chunks of both MIXED cases at >= 0.6 of flash
attention's TFLOP/s; draft batches no slower than the Triton core): the glue passes gone (`in_place`) and sequences
routed by their queries on the device (`long_queries`).

    PYTHONPATH=src python exp/s32_prefill3.py                 # on an H100/H200, a few minutes with compilation
    PYTHONPATH=src python exp/s32_prefill3.py --hlo           # and the small MIXED case's compiled programs first

Variants (the Mosaic GPU core as the op's implementation, with these options): `tiles` (today's registered
default), `in place` (the tiles read their queries from the batch's rows and write theirs into the Triton short
pass's output: no packed copy of the queries, no gather of the tile rows, no select), `routed` (only sequences of at
least `LONG_QUERIES` queries in the tiles, the others on the Triton core: its short pass, or the whole core where a
sequence lies between, chosen on the device), `routed in place` (both), beside `triton` (the Triton core). The MIXED
cases as `exp/s31_prefill.py` times them (ms, prefill TFLOP/s, prefill_vs_flash), then the draft batches of
`exp/s31_spec_decode.py` (64 sequences of k = 8, 16, 32 drafts at 4096, alone and beside a 512-query chunk; `tiles`
declines those of fewer than 32 queries a sequence on average). One flushed line each; each variant's output is
checked against XLA's first. `--hlo`: per op and variant, the top-level instructions of the compiled small MIXED
program that write at least 1 MB (the custom calls always): what runs beside the two kernels.
"""

from __future__ import annotations

import argparse
import functools
import math
import re

import jax
from _kit import log, start_watchdog
from s31_prefill import SIZES, case_rows
from s31_spec_decode import CASES, OP, spec_rows

from ejkernel.benchmarks.serving_attention import MIXED, make_call, make_problem
from ejkernel.kernels._common.paged_attention.implementations import implementation
from ejkernel.kernels._pallas.gpu.paged_attention import paged_attention_mosaic_gpu_core
from ejkernel.kernels._pallas.gpu.paged_attention._interface import LONG_QUERIES

OPTIONS = {
    "tiles": {"in_place": False},
    "in place": {"in_place": True},
    "routed": {"long_queries": LONG_QUERIES},
    "routed in place": {"in_place": True, "long_queries": LONG_QUERIES},
}


def core(op: str, **options):
    """`op`'s implementation on the Mosaic GPU core with these options."""
    return implementation(op, functools.partial(paged_attention_mosaic_gpu_core, **options), f"{op}_mosaic_gpu")


def variants(op: str, args, n_prefill: int = 0) -> dict:
    """Variant -> builder of its zero-argument call: the Triton core and the Mosaic GPU core per `OPTIONS`."""
    found = {"triton": functools.partial(make_call, op, "triton", args)}
    for name, options in OPTIONS.items():
        found[name] = functools.partial(make_call, op, core(op, **options), args)
    return found


HLO_LINE = re.compile(r"^\s*(?:ROOT )?(\S+) = (.+?) ([\w-]+)\(")
HLO_ARRAY = re.compile(r"\b(pred|bf16|[suf]\d+)\[([\d,]*)\]")


def megabytes(shape: str) -> float:
    """The bytes of an HLO result shape (an array or a tuple of them), in MB."""
    total = 0
    for dtype, dims in HLO_ARRAY.findall(shape):
        bits = 8 if dtype == "pred" else int(re.sub(r"\D", "", dtype))
        total += bits // 8 * math.prod(int(d) for d in dims.split(",") if d)
    return total / 1e6


def print_program(label: str, text: str) -> None:
    """The ENTRY instructions of compiled HLO `text` that write at least 1 MB, and every custom call, in order."""
    entry = text[text.index("\nENTRY ") :]
    for line in entry[: entry.index("\n}\n")].splitlines()[1:]:
        m = HLO_LINE.match(line)
        if not m or m.group(3) in ("parameter", "constant", "get-tuple-element", "tuple", "bitcast"):
            continue
        size = megabytes(m.group(2))
        if m.group(3) == "custom-call" or size >= 1.0:
            what = re.search(r'custom_call_target="([^"]+)"|kind=(\w+)', line)
            log(f"{label}: {m.group(3)} {size:.1f} MB {m.group(1)[:40]} {what.group(0) if what else ''}")


def hlo(op: str) -> None:
    n_decode, decode_ctx, n_prefill, chunk, prefill_ctx = MIXED[0]
    q_lens = [1] * n_decode + [chunk] * n_prefill
    kv_lens = [decode_ctx] * n_decode + [prefill_ctx + chunk] * n_prefill
    args, _ = make_problem(op, q_lens, kv_lens, **SIZES)
    for name, options in OPTIONS.items():
        fn = core(op, **options)
        print_program(f"hlo {op} {name}", jax.jit(lambda *a, fn=fn: fn(*a)).lower(*args).compile().as_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", default="ragged_page_attention_v3,unified_attention")
    p.add_argument("--only", default="", help="variants to run, comma-separated (default: all)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--stall", type=float, default=150, help="seconds without progress before the watchdog exits")
    p.add_argument("--hlo", action="store_true", help="print the small MIXED case's compiled programs first")
    p.add_argument("--no-spec", action="store_true", help="leave the draft batches out")
    args = p.parse_args()
    start_watchdog(args.stall)
    log(jax.devices()[0].device_kind)
    ops = args.ops.split(",")
    only = [v.strip() for v in args.only.split(",") if v.strip()]
    if args.hlo:
        for op in ops:
            hlo(op)
    for case in MIXED:
        for op in ops:
            case_rows(op, case, only, args.repeats, variants)
    if not args.no_spec:
        pick = lambda found: {k: v for k, v in found.items() if not only or k in only}
        for case in CASES:
            spec_rows(case, lambda a: pick(variants(OP, a)), args.repeats)


if __name__ == "__main__":
    main()
