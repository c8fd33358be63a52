"""Serving attention: decode and mixed prefill+decode bandwidth of each implementation beside a device copy.

Decode: `page_attention` and `unified_attention`, one query per sequence, batch 8-128, contexts 1k-32k,
Hq=32, Hkv=8, D=128, bf16, page 16, every sequence's pages a random permutation of the cache. Mixed:
`ragged_page_attention_v3` and `unified_attention` with decode sequences and prefill chunks in one call.
Cascade: 64 sequences sharing an 8192-token prompt with 512 tokens each of their own, `cascade_attention`
beside `page_attention` over each whole context (`speedup_vs_whole`). Prefill share: each mixed case's
prefill chunks' FLOP/s (the mixed call's time less its decode sequences' alone) over flash attention's.
Achieved bandwidth = (bytes of K/V read + queries + output) / time, beside the device copy of 2 GiB
(`_harness.copy_bandwidth`) and XLA's time measured in the same run. Each implementation is timed as the
registry gives it (its own default tiling), and `auto` through the public op, as users call it: under
`ejkernel autotune` that row's calls are the ones tuned and exported.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

import ejkernel.modules
from ejkernel.benchmarks._harness import (
    copy_bandwidth,
    grouped_bars,
    parser,
    print_table,
    time_variants,
    write_results,
)
from ejkernel.kernels._common.paged_attention.kv_cache import v3_cache_shape
from ejkernel.registry import kernel_registry

OPS = ("page_attention", "unified_attention", "ragged_page_attention_v3", "cascade_attention")
"""The ops this benchmark times (`ejkernel bench <op>` runs it)."""

HEADS, KV_HEADS, DIM, PAGE = 32, 8, 128, 16
DECODE = [(b, c) for b in (8, 32, 64, 128) for c in (1024, 4096, 8192, 32768)]
# (decode sequences, their context, prefill chunks, chunk length, prefill context)
MIXED = [(60, 4096, 4, 512, 2048), (24, 8192, 8, 1024, 4096)]
CASCADE = (64, 8192, 512)  # sequences, shared prefix, own tokens each
QUICK = dict(heads=4, kv_heads=2, dim=32, page=16, decode=[(2, 64)], mixed=[(2, 64, 1, 16, 32)], cascade=(2, 64, 16))


def _tables(rng, kv_lens, page: int):
    """Each sequence's pages, drawn from a random permutation of a cache that holds exactly them."""
    pages = [-(-n // page) for n in kv_lens]
    order = rng.permutation(sum(pages)).astype(np.int32)
    width = max(pages)
    tables = np.zeros((len(kv_lens), width), np.int32)
    starts = np.concatenate([[0], np.cumsum(pages)])
    for s, n in enumerate(pages):
        tables[s, :n] = order[starts[s] : starts[s] + n]
    return jnp.asarray(tables), sum(pages)


def make_problem(op, q_lens, kv_lens, *, heads, kv_heads, dim, page, seed=0):
    """`(args, bytes moved)` of one call of `op` over sequences with these query and key lengths."""
    rng = np.random.default_rng(seed)
    keys = iter(jax.random.split(jax.random.PRNGKey(seed), 4))
    # Drawn in float32, then rounded: JAX's bfloat16 sampler is biased (mean -0.012 over 1.3e7 draws), and the bias
    # survives an 8-bit cache's rounding coherently (a per-row scaled float8 decode read 8.6e-2 off, 3.9e-2 unbiased).
    normal = lambda shape: jax.random.normal(next(keys), shape, jnp.float32).astype(jnp.bfloat16)
    tables, num_pages = _tables(rng, kv_lens, page)
    tokens = sum(q_lens)
    lens = jnp.asarray(kv_lens, jnp.int32)
    loc = jnp.asarray(np.concatenate([[0], np.cumsum(q_lens)]), jnp.int32)
    q = normal((tokens, heads, dim))
    if op == "page_attention":
        args = (q, normal((num_pages, kv_heads, page, dim)), normal((num_pages, kv_heads, page, dim)), lens, tables)
    elif op == "unified_attention":
        args = (
            q,
            normal((num_pages, page, kv_heads, dim)),
            normal((num_pages, page, kv_heads, dim)),
            lens,
            tables,
            loc,
        )
    else:
        cache = normal(v3_cache_shape(num_pages, page, kv_heads, dim, jnp.bfloat16))
        new = [normal((tokens, kv_heads, dim)) for _ in range(2)]
        distribution = jnp.asarray([q_lens.count(1), len(q_lens), len(q_lens)], jnp.int32)
        args = (q, *new, cache, lens, tables.reshape(-1), loc, distribution)
    kv_bytes = 2 * sum(kv_lens) * kv_heads * dim * 2
    return args, kv_bytes + 2 * tokens * heads * dim * 2


def make_call(op, platform, args):
    """A zero-argument call of `op` on `args` through `platform` ("auto": the public op), or an implementation."""
    if callable(platform):
        fn = platform
    else:
        fn = getattr(ejkernel.modules, op) if platform == "auto" else kernel_registry.get(op, platform)
    if op != "ragged_page_attention_v3":
        return functools.partial(jax.jit(lambda *a: fn(*a)), *args)
    # As a serving loop runs it: the cache is donated (updated in place) and fed back to the next call.
    step = jax.jit(lambda cache, *rest: fn(*rest[:3], cache, *rest[3:]), donate_argnums=0)
    state = {"cache": jnp.copy(args[3])}

    def call():
        out, state["cache"] = step(state["cache"], *args[:3], *args[4:])
        return out

    return call


def _measure(op, label, args, nbytes, repeats, copy_bw, where):
    platforms = ["auto"] + [i.platform.value for i in kernel_registry.candidates(op)]
    timings = time_variants(
        {p: functools.partial(make_call, op, p, args) for p in platforms}, repeats=repeats, where=f"{op} {where}"
    )
    rows = []
    for platform, seconds in timings.items():
        bandwidth = nbytes / seconds
        rows.append(
            dict(
                op=op,
                case=label,
                platform=platform,
                ms=1e3 * seconds,
                TBps=bandwidth / 1e12,
                ratio_to_copy=bandwidth / copy_bw,
                speedup_vs_xla=timings["xla"] / seconds if "xla" in timings else None,
            )
        )
    return rows


def _prefill_share(n_decode, decode_ctx, n_prefill, chunk, prefill_ctx, *, heads, kv_heads, dim, page, repeats):
    """What a mixed call spends on its prefill chunks, against flash attention on the same chunks.

    Times `unified_attention` (auto) on the mixed batch and on its decode sequences alone; the difference is
    the prefill's time, and its FLOP/s (causal inside each chunk, the whole context before it) over the
    TFLOP/s of `flash_attention` (auto) with the chunks' queries over their whole contexts (bf16, no mask)
    is `prefill_vs_flash`, issue 44's measure.
    """
    q_lens = [1] * n_decode + [chunk] * n_prefill
    kv_lens = [decode_ctx] * n_decode + [prefill_ctx + chunk] * n_prefill
    mixed, _ = make_problem("unified_attention", q_lens, kv_lens, heads=heads, kv_heads=kv_heads, dim=dim, page=page)
    alone, _ = make_problem(
        "unified_attention", [1] * n_decode, [decode_ctx] * n_decode, heads=heads, kv_heads=kv_heads, dim=dim, page=page
    )
    keys = iter(jax.random.split(jax.random.PRNGKey(2), 3))
    normal = lambda shape: jax.random.normal(next(keys), shape, jnp.bfloat16)
    context = prefill_ctx + chunk
    flash_args = (normal((n_prefill, chunk, heads, dim)), *(normal((n_prefill, context, kv_heads, dim)) for _ in "kv"))
    calls = {
        "mixed": functools.partial(make_call, "unified_attention", "auto", mixed),
        "decode alone": functools.partial(make_call, "unified_attention", "auto", alone),
        "flash": lambda: functools.partial(jax.jit(ejkernel.modules.flash_attention), *flash_args),
    }
    t = time_variants(calls, repeats=repeats, where="prefill share")
    prefill_flops = 4 * n_prefill * chunk * (prefill_ctx + (chunk + 1) / 2) * heads * dim
    flash_rate = 4 * n_prefill * chunk * context * heads * dim / t["flash"]
    prefill_rate = prefill_flops / max(t["mixed"] - t["decode alone"], 1e-9)
    label = f"mixed {n_decode}x1@{decode_ctx} + {n_prefill}x{chunk}@{prefill_ctx}"
    row = dict(op="unified_attention", case=label, platform="auto", ms=1e3 * t["mixed"])
    row |= dict(decode_alone_ms=1e3 * t["decode alone"], prefill_TFLOPs=prefill_rate / 1e12)
    return [row | dict(flash_TFLOPs=flash_rate / 1e12, prefill_vs_flash=prefill_rate / flash_rate)]


def _cascade(batch, prefix, own, *, heads, kv_heads, dim, page, repeats, copy_bw):
    """Decode of `batch` sequences sharing a `prefix`-token prompt, `own` tokens each: `cascade_attention` beside
    `page_attention` over each whole context, whose tables share the prompt's pages (as a serving engine's do).
    Bytes: the prompt's keys and values once plus every sequence's own, and the queries in and out."""
    keys = iter(jax.random.split(jax.random.PRNGKey(1), 4))
    normal = lambda shape: jax.random.normal(next(keys), shape, jnp.bfloat16)
    shared, own_pages = prefix // page, -(-own // page)
    caches = [normal((shared + batch * own_pages, kv_heads, page, dim)) for _ in range(2)]
    own_tables = shared + jnp.arange(batch * own_pages, dtype=jnp.int32).reshape(batch, own_pages)
    whole_tables = jnp.concatenate(
        [jnp.broadcast_to(jnp.arange(shared, dtype=jnp.int32), (batch, shared)), own_tables], 1
    )
    prompt = [jnp.swapaxes(c[:shared], 1, 2).reshape(prefix, kv_heads, dim) for c in caches]  # the shared pages
    q = normal((batch, heads, dim))
    lens = jnp.full((batch,), own, jnp.int32)
    calls = {
        "cascade_attention": lambda: functools.partial(
            jax.jit(ejkernel.modules.cascade_attention), q, *prompt, *caches, lens, own_tables
        ),
        "page_attention whole": lambda: functools.partial(
            jax.jit(ejkernel.modules.page_attention), q, *caches, lens + prefix, whole_tables
        ),
    }
    timings = time_variants(calls, repeats=repeats, where="cascade")
    nbytes = 2 * (prefix + batch * own) * kv_heads * dim * 2 + 2 * batch * heads * dim * 2
    label = f"cascade {batch}x({prefix} shared + {own})"
    rows = []
    for name, seconds in timings.items():
        row = dict(op=name.split()[0], case=label, platform="auto", ms=1e3 * seconds, TBps=nbytes / seconds / 1e12)
        row["ratio_to_copy"] = nbytes / seconds / copy_bw
        if "page_attention whole" in timings:
            row["speedup_vs_whole"] = timings["page_attention whole"] / seconds
        rows.append(row)
    return rows


def main(argv=None) -> None:
    p = parser(__doc__)
    p.add_argument("--batches", help="decode batch sizes to run, comma-separated (default: all of the bench)")
    p.add_argument("--contexts", help="decode contexts to run, comma-separated (default: all of the bench)")
    args = p.parse_args(argv)
    sizes = dict(QUICK) if args.quick else dict(heads=HEADS, kv_heads=KV_HEADS, dim=DIM, page=PAGE)
    decode = sizes.pop("decode", DECODE)
    for index, chosen in enumerate((args.batches, args.contexts)):
        if chosen:
            decode = [case for case in decode if str(case[index]) in chosen.split(",")]
    mixed = sizes.pop("mixed", MIXED)
    cascade = sizes.pop("cascade", CASCADE)
    copy_bw = copy_bandwidth(quick=args.quick, repeats=args.repeats)

    rows = []
    for batch, context in decode:
        for op in ("page_attention", "unified_attention"):
            problem, nbytes = make_problem(op, [1] * batch, [context] * batch, **sizes)
            rows += _measure(op, f"decode B={batch} ctx={context}", problem, nbytes, args.repeats, copy_bw, "")
    for n_decode, decode_ctx, n_prefill, chunk, prefill_ctx in mixed:
        q_lens = [1] * n_decode + [chunk] * n_prefill
        kv_lens = [decode_ctx] * n_decode + [prefill_ctx + chunk] * n_prefill
        label = f"mixed {n_decode}x1@{decode_ctx} + {n_prefill}x{chunk}@{prefill_ctx}"
        for op in ("ragged_page_attention_v3", "unified_attention"):
            problem, nbytes = make_problem(op, q_lens, kv_lens, **sizes)
            rows += _measure(op, label, problem, nbytes, args.repeats, copy_bw, "")
    rows += _cascade(*cascade, **sizes, repeats=args.repeats, copy_bw=copy_bw)
    columns = ["op", "case", "platform", "ms", "TBps", "ratio_to_copy", "speedup_vs_xla", "speedup_vs_whole"]
    print_table(rows, columns)
    shares = [row for case in mixed for row in _prefill_share(*case, **sizes, repeats=args.repeats)]
    print_table(shares, ["case", "ms", "decode_alone_ms", "prefill_TFLOPs", "flash_TFLOPs", "prefill_vs_flash"])
    rows += shares

    def plot(ax, rows):
        decode_rows = [r for r in rows if r["case"].startswith("decode")]
        cases = list(dict.fromkeys(r["case"][7:] for r in decode_rows))
        by = {(r["case"][7:], r["op"], r["platform"]): r["ratio_to_copy"] for r in decode_rows}
        keys = dict.fromkeys((r["op"], r["platform"]) for r in decode_rows)
        series = {"/".join(key): [by.get((case, *key)) for case in cases] for key in keys}
        grouped_bars(ax, cases, series, "decode bandwidth / device-copy bandwidth", reference=1.0)

    meta = {"dtype": "bfloat16", "copy_TBps": copy_bw / 1e12, **sizes}
    print(f"wrote {write_results(args.out, 'serving_attention', rows, meta, plot)}")


if __name__ == "__main__":
    main()
