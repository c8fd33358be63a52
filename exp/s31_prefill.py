"""Thirty-first session: the prefill chunks of mixed serving batches in Mosaic GPU flash attention tiles (issue 44: the
chunks at >= 0.6 of flash attention's TFLOP/s on the same tokens), at `ejkernel bench serving_attention`'s two MIXED
cases (Hq 32, Hkv 8, D 128, bf16, page 16, pages a random permutation).

    PYTHONPATH=src python exp/s31_prefill.py                      # on an H100/H200, a few minutes with compilation
    PYTHONPATH=src python exp/s31_prefill.py --ops unified_attention --only "pallas s2"

Per case and op, timed together (interleaved, the bench's `time_variants`): the mixed batch on the Triton core
(`triton`, today's path), on the Mosaic GPU prefill tiles beside the Triton short-sequence pass (`pallas s2`, the
registered default; `pallas s3`: a key/value ring of 3 stages; `pallas s2 exact`: only the chunks' tiles launched,
not the static bound's, to see what the CTAs that compute nothing cost; `pallas s2 paired`: two tiles a CTA),
its decode sequences alone on the Triton core, and flash attention (auto) on the chunks' queries over their whole
contexts (as the bench's `prefill_vs_flash`). A variant's prefill time is its mixed time less the decode
sequences' alone; its `prefill_vs_flash` is that time's FLOP/s (causal in each chunk, the whole context before it)
over flash attention's. Each mixed variant's output is checked against XLA's first (`rel` = ‖x − xla‖ / ‖xla‖).
One flushed line per variant; the watchdog names a variant whose kernel hangs.
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
from _kit import first_lines, log, rel, start_watchdog

import ejkernel.modules
from ejkernel.benchmarks._harness import time_variants
from ejkernel.benchmarks.serving_attention import DIM, HEADS, KV_HEADS, MIXED, PAGE, make_call, make_problem
from ejkernel.kernels._common.paged_attention.implementations import implementation
from ejkernel.kernels._pallas.gpu.paged_attention import paged_attention_mosaic_gpu_core

SIZES = dict(heads=HEADS, kv_heads=KV_HEADS, dim=DIM, page=PAGE)


def mixed_variants(op: str, args, n_prefill: int) -> dict:
    """Variant -> builder of its zero-argument call on the mixed batch (`make_call`'s)."""

    def mosaic(**options):
        core = functools.partial(paged_attention_mosaic_gpu_core, **options)
        return functools.partial(make_call, op, implementation(op, core, f"{op}_mosaic_gpu"), args)

    return {
        "triton": functools.partial(make_call, op, "triton", args),
        "pallas s2": functools.partial(make_call, op, "pallas", args),  # the registered default
        "pallas s3": mosaic(stages=3),
        # only the chunks' tiles launched: what the CTAs of the static bound that compute nothing cost
        "pallas s2 exact": mosaic(long_seqs=n_prefill),
        "pallas s2 paired": mosaic(tiles_per_cta=2),  # two tiles a CTA: half as many CTAs of nothing
    }


def case_rows(op: str, case, only, repeats: int, variants=mixed_variants):
    """One line per variant of `variants(op, args, n_prefill)` (name -> builder of a zero-argument call) at MIXED
    `case`, beside the decode sequences alone and flash attention on the chunks."""
    n_decode, decode_ctx, n_prefill, chunk, prefill_ctx = case
    label = f"{op} mixed {n_decode}x1@{decode_ctx} + {n_prefill}x{chunk}@{prefill_ctx}"
    q_lens = [1] * n_decode + [chunk] * n_prefill
    kv_lens = [decode_ctx] * n_decode + [prefill_ctx + chunk] * n_prefill
    mixed, _ = make_problem(op, q_lens, kv_lens, **SIZES)
    alone, _ = make_problem(op, [1] * n_decode, [decode_ctx] * n_decode, **SIZES)
    variants = {k: v for k, v in variants(op, mixed, n_prefill).items() if not only or k in only}

    out = lambda call: call()[0] if op == "ragged_page_attention_v3" else call()
    expected = out(make_call(op, "xla", mixed))
    built = {}
    for name, build in variants.items():
        log(f"{label} {name}: compiling")
        try:
            call = build()
            log(f"{label} {name}: rel to xla {rel(out(call), expected):.2e}")
            built[name] = lambda call=call: call  # (built once: time_variants runs it as is)
        except Exception as err:  # a variant that cannot run: say why, time the others
            log(f"{label} {name}: {first_lines(err)}")
    keys = iter(jax.random.split(jax.random.PRNGKey(2), 3))
    normal = lambda shape: jax.random.normal(next(keys), shape, jnp.bfloat16)
    context = prefill_ctx + chunk
    flash_args = (normal((n_prefill, chunk, HEADS, DIM)), *(normal((n_prefill, context, KV_HEADS, DIM)) for _ in "kv"))
    calls = dict(built)
    calls["decode alone"] = functools.partial(make_call, op, "triton", alone)
    calls["flash"] = lambda: functools.partial(jax.jit(ejkernel.modules.flash_attention), *flash_args)
    t = time_variants(calls, repeats=repeats, where=label)
    prefill_flops = 4 * n_prefill * chunk * (prefill_ctx + (chunk + 1) / 2) * HEADS * DIM
    flash_rate = 4 * n_prefill * chunk * context * HEADS * DIM / t["flash"]
    log(f"{label} decode alone {1e3 * t['decode alone']:.3f} ms, flash {flash_rate / 1e12:.0f} TFLOP/s")
    for name in (n for n in built if n in t):
        rate = prefill_flops / max(t[name] - t["decode alone"], 1e-9)
        log(
            f"{label} {name}: {1e3 * t[name]:.3f} ms, prefill {rate / 1e12:.0f} TFLOP/s, "
            f"prefill_vs_flash {rate / flash_rate:.2f}"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", default="unified_attention,ragged_page_attention_v3")
    p.add_argument("--only", default="", help="variants to run, comma-separated (default: all)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--stall", type=float, default=150, help="seconds without progress before the watchdog exits")
    args = p.parse_args()
    start_watchdog(args.stall)
    log(jax.devices()[0].device_kind)
    only = [v.strip() for v in args.only.split(",") if v.strip()]
    for case in MIXED:
        for op in args.ops.split(","):
            case_rows(op, case, only, args.repeats)


if __name__ == "__main__":
    main()
