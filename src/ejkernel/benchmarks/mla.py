"""Multi-head latent attention: decode bandwidth of each implementation beside a device copy; prefill time.

`flash_mla`: decode (one query token per sequence against its whole latent cache) is bound by reading the
cache: bandwidth = bytes of the latent rows and RoPE keys read / time, compared with the device copy
(`_harness.copy_builder`) of the cache's bytes (read + written / time) measured in the same run. Shapes are
DeepSeek-V2-Lite's attention: 16 heads, rank 512, d_nope 128, RoPE 64, Dv 128, bf16. A causal prefill row
reports each implementation's time and its ratio to XLA's.

`multi_latent_ragged_page_attention` (`--cases paged`): one serving step over a paged latent cache (latent 512 +
RoPE 64 in rows of 640, page 64, bf16, every sequence's pages a random permutation of the cache), run as a serving
loop runs it (the cache donated and fed back). Decode, 64 sequences x 8192 context with 128 query heads
(DeepSeek-V3's) and with the 16 of a tensor-parallel shard (128 over 8 GPUs): bandwidth = bytes of the latent and
RoPE parts of the rows read (`(L + R) * 2` per position; the rows' zero padding is not counted) / time, beside a 2
GiB device copy of the same run (`ratio`). Mixed decode + prefill chunks in one call: time and speed-up over XLA
(`ratio`). Both report TFLOP/s (`2 * Hq * (2L + R)` per (query, visible position) pair): at 128 heads a decode step
does ~240 flops per byte of cache read, about an H200's ratio of bf16 tensor throughput to memory bandwidth, so it
is bound by the tensor cores as much as by memory; at 16 heads, by memory.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

import ejkernel.modules
from ejkernel.benchmarks._harness import (
    copy_bandwidth,
    copy_builder,
    parser,
    print_table,
    time_variants,
    write_results,
)
from ejkernel.kernels._common.paged_attention.kv_cache import kv_packing
from ejkernel.modules import flash_mla
from ejkernel.registry import kernel_registry

OPS = ("flash_mla", "multi_latent_ragged_page_attention", "multi_latent_ragged_page_attention_v2")
"""The ops this benchmark times (`ejkernel bench <op>` runs it)."""

# (batch, query length, context, heads, rank, d_nope, d_rope, d_v)
DECODE = (64, 1, 8192, 16, 512, 128, 64, 128)
PREFILL = (1, 4096, 4096, 16, 512, 128, 64, 128)
QUICK_DECODE = (2, 1, 256, 4, 64, 32, 16, 32)
QUICK_PREFILL = (1, 64, 64, 4, 64, 32, 16, 32)

PAGED_OP = "multi_latent_ragged_page_attention"
# (query lengths, context lengths) of the paged cases; widths (heads, latent, rope, page)
PAGED_DECODE = ((1,) * 64, (8192,) * 64)
PAGED_MIXED = ((1,) * 56 + (512,) * 4, (8192,) * 56 + (2560,) * 4)
PAGED_WIDTHS = (128, 512, 64, 64)
SHARD_HEADS, QUICK_SHARD_HEADS = 16, 2
"""Query heads of the second decode row: a tensor-parallel shard of DeepSeek-V3's 128 (8 GPUs)."""
QUICK_PAGED = (((1,) * 2, (96,) * 2), ((1, 16), (96, 40)), (4, 64, 16, 16))


def mla_inputs(batch, q_len, kv_len, heads, rank, nope, rope, dv, dtype=jnp.bfloat16):
    """(query [nope | rope], key_value, w_kc, w_vc, b_k) with one key/value head."""
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 5))
    normal = lambda shape, scale=1.0: (jax.random.normal(next(keys), shape, jnp.float32) * scale).astype(dtype)
    return (
        normal((batch, q_len, heads, nope + rope)),
        normal((batch, kv_len, rank)),
        normal((rank, 1, nope), rank**-0.5),
        normal((rank, 1, dv), rank**-0.5),
        normal((batch, kv_len, rope)),
    )


def _builder(fn, *args):
    step = jax.jit(fn)
    return lambda: functools.partial(step, *args)


def _ours(platform, causal):
    return lambda q, kv, wk, wv, bk: flash_mla(q, kv, wk, wv, None, bk, causal=causal, platform=platform)


def paged_inputs(q_lens, kv_lens, heads, latent, rope, page, dtype=jnp.bfloat16):
    """`(args, bytes read, flops)` of one `multi_latent_ragged_page_attention` call: each sequence's pages a slice
    of a random permutation of a cache that holds exactly them; the bytes are the latent and RoPE parts of the
    context rows, the flops those of the scores and the weighted sum over the positions each query sees."""
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 5))
    normal = lambda shape: jax.random.normal(next(keys), shape, jnp.float32).astype(dtype)
    pages = [-(-n // page) for n in kv_lens]
    width = max(pages)
    order = np.random.default_rng(0).permutation(sum(pages)).astype(np.int32)
    tables = np.zeros((len(kv_lens), width), np.int32)
    starts = np.concatenate([[0], np.cumsum(pages)])
    for s, n in enumerate(pages):
        tables[s, :n] = order[starts[s] : starts[s] + n]
    tokens = sum(q_lens)
    packing = kv_packing(dtype)
    row_width = -(-latent // 128) * 128 + -(-rope // 128) * 128
    args = (
        normal((tokens, heads, latent)),
        normal((tokens, heads, rope)),
        normal((tokens, latent)),
        normal((tokens, rope)),
        normal((sum(pages), page // packing, packing, row_width)),
        jnp.asarray(kv_lens, jnp.int32),
        jnp.asarray(tables.reshape(-1)),
        jnp.asarray(np.concatenate([[0], np.cumsum(q_lens)]), jnp.int32),
        jnp.asarray([q_lens.count(1), len(q_lens), len(q_lens)], jnp.int32),
    )
    seen = sum(q * (k - q) + q * (q + 1) // 2 for q, k in zip(q_lens, kv_lens, strict=True))  # (query, key) pairs
    return args, sum(kv_lens) * (latent + rope) * jnp.dtype(dtype).itemsize, seen * heads * 2 * (2 * latent + rope)


def _paged_call(platform, args, cfg=None):
    """A serving step: the cache donated and fed back to the next call (`cfg`: through the public op with it)."""
    fn = functools.partial(ejkernel.modules.multi_latent_ragged_page_attention, cfg=cfg)
    if platform != "auto" and cfg is None:
        fn = kernel_registry.get(PAGED_OP, platform)
    step = jax.jit(lambda cache, *rest: fn(*rest[:4], cache, *rest[4:]), donate_argnums=0)
    state = {"cache": jnp.copy(args[4])}

    def call():
        out, state["cache"] = step(state["cache"], *args[:4], *args[5:])
        return out

    return call


def _paged_rows(args) -> list[dict]:
    quick = args.quick
    decode, mixed, widths = QUICK_PAGED if quick else (PAGED_DECODE, PAGED_MIXED, PAGED_WIDTHS)
    shard = (QUICK_SHARD_HEADS if quick else SHARD_HEADS, *widths[1:])
    platforms = ["auto"] + [i.platform.value for i in kernel_registry.candidates(PAGED_OP)]
    copy_bw = copy_bandwidth(quick=quick, repeats=args.repeats)
    rows = []
    cases = (("paged decode", decode, widths), ("paged decode", decode, shard), ("paged mixed", mixed, widths))
    for mode, (q_lens, kv_lens), case_widths in cases:
        problem, nbytes, flops = paged_inputs(q_lens, kv_lens, *case_widths)
        timings = time_variants(
            {p: functools.partial(_paged_call, p, problem) for p in platforms}, repeats=args.repeats, where=mode
        )
        shape = f"{len(q_lens)}seq {sum(q_lens)}tok {max(kv_lens)}ctx H{case_widths[0]}"
        for platform, seconds in timings.items():
            row = dict(mode=mode, shape=shape, platform=platform, ms=1e3 * seconds, TFLOPs=flops / seconds / 1e12)
            if mode == "paged decode":
                row.update(TBps=nbytes / seconds / 1e12, copy_TBps=copy_bw / 1e12, ratio=nbytes / seconds / copy_bw)
            else:
                row["ratio"] = timings["xla"] / seconds if "xla" in timings else None
            rows.append(row)
    return rows


def _flash_mla_rows(args) -> list[dict]:
    platforms = ["auto"] + [i.platform.value for i in kernel_registry.candidates("flash_mla")]
    rows = []
    shape = QUICK_DECODE if args.quick else DECODE
    tensors = mla_inputs(*shape)
    kv, rope_keys = tensors[1], tensors[4]
    cache_bytes = kv.size * kv.dtype.itemsize + rope_keys.size * rope_keys.dtype.itemsize
    builders = {"copy": copy_builder(kv.nbytes)}
    builders.update({p: _builder(_ours(p, False), *tensors) for p in platforms})
    timings = time_variants(builders, repeats=args.repeats, where=f"decode {shape}")
    copy_bw = 2 * kv.nbytes / timings["copy"]
    for platform in platforms:
        if platform in timings:
            bandwidth = cache_bytes / timings[platform]
            rows.append(
                dict(
                    mode="decode",
                    shape="x".join(map(str, shape[:3])),
                    platform=platform,
                    ms=1e3 * timings[platform],
                    TBps=bandwidth / 1e12,
                    copy_TBps=copy_bw / 1e12,
                    ratio=bandwidth / copy_bw,
                )
            )

    shape = QUICK_PREFILL if args.quick else PREFILL
    tensors = mla_inputs(*shape)
    timings = time_variants(
        {p: _builder(_ours(p, True), *tensors) for p in platforms}, repeats=args.repeats, where=f"prefill {shape}"
    )
    for platform, seconds in timings.items():
        rows.append(
            dict(
                mode="prefill",
                shape="x".join(map(str, shape[:3])),
                platform=platform,
                ms=1e3 * seconds,
                ratio=timings["xla"] / seconds if "xla" in timings else None,
            )
        )
    return rows


def main(argv=None) -> None:
    p = parser(__doc__)
    p.add_argument("--cases", default="flash_mla,paged", help="comma-separated: flash_mla, paged (default: both)")
    args = p.parse_args(argv)
    cases = args.cases.split(",")
    rows = (_flash_mla_rows(args) if "flash_mla" in cases else []) + (_paged_rows(args) if "paged" in cases else [])
    print("ratio: decode bandwidth / device-copy bandwidth; prefill and mixed speed / XLA's")
    print_table(rows, ["mode", "shape", "platform", "ms", "TBps", "copy_TBps", "TFLOPs", "ratio"])

    def plot(ax, rows):
        labels = [f"{r['mode']} {r['shape'].rsplit(' ', 1)[-1]} {r['platform']}" for r in rows]
        ax.bar(labels, [r["ratio"] or 0 for r in rows])
        ax.axhline(1.0, color="gray", lw=0.5)
        ax.set_ylabel("decode: / copy bandwidth; prefill, mixed: / XLA speed")
        ax.tick_params(axis="x", rotation=30)

    meta = dict(dtype="bfloat16", decode=DECODE, prefill=PREFILL, paged_widths=PAGED_WIDTHS, shard_heads=SHARD_HEADS)
    path = write_results(args.out, "mla", rows, meta, plot)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
