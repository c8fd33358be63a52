"""Thirty-first session's open question for the Mosaic GPU prefill tiles: speculative-decoding batches.

A sequence of more queries than the Triton short pass takes (`16 // G`: 4 at Hq 32, Hkv 8) runs in a 128-query
Mosaic GPU tile, so a batch of 64 sequences of k draft tokens each (k = 8 to 32), which today's `auto` sends there
whenever it holds one 128-query chunk's worth of tokens, fills its tiles mostly with rows nobody reads. This times
such batches (alone, and beside one 512-token chunk) on the registered default ("pallas": the tiles where they
serve) and on the Triton core, with XLA's output as the check. One flushed line a variant:

    PYTHONPATH=src python3 exp/s31_spec_decode.py              # on an H100/H200, about a minute
"""

from __future__ import annotations

import functools

import jax
from _kit import first_lines, log, rel, start_watchdog

from ejkernel.benchmarks._harness import time_variants
from ejkernel.benchmarks.serving_attention import DIM, HEADS, KV_HEADS, PAGE, make_call, make_problem

OP = "unified_attention"
CASES = [(64, k, 4096, with_chunk) for k in (8, 16, 32) for with_chunk in (False, True)]
"""(sequences, draft tokens each, context, whether one 512-query chunk at 2048 joins them)."""


def platforms(args) -> dict:
    """Variant -> builder of its zero-argument call: the Triton core and the registered default."""
    return {platform: functools.partial(make_call, OP, platform, args) for platform in ("triton", "pallas")}


def spec_rows(case, variants=platforms, repeats: int = 20) -> None:
    """One line per variant of `variants(args)` at `case` (a `CASES` entry), its output checked against XLA's."""
    seqs, k, context, with_chunk = case
    q_lens = [k] * seqs + ([512] if with_chunk else [])
    kv_lens = [context] * seqs + ([2048 + 512] if with_chunk else [])
    label = f"{seqs}x{k}@{context}" + (" + 1x512@2048" if with_chunk else "")
    args, _ = make_problem(OP, q_lens, kv_lens, heads=HEADS, kv_heads=KV_HEADS, dim=DIM, page=PAGE)
    expected = make_call(OP, "xla", args)()
    calls = {}
    for name, build in variants(args).items():
        try:
            call = build()
            log(f"{label} {name}: rel to xla {rel(call(), expected):.2e}")
            calls[name] = lambda call=call: call
        except Exception as err:  # declined or failed: say why, time the others
            log(f"{label} {name}: {first_lines(err)}")
    for name, seconds in time_variants(calls, repeats=repeats, where=label).items():
        log(f"{label} {name}: {1e3 * seconds:.3f} ms")


def main() -> None:
    start_watchdog(120)
    log(f"device {jax.devices()[0].device_kind}, jax {jax.__version__}")
    for case in CASES:
        spec_rows(case)


if __name__ == "__main__":
    main()
