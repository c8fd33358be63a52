"""Multi-head latent attention: decode bandwidth of each implementation beside a device copy; prefill time.

Decode (one query token per sequence against its whole latent cache) is bound by reading the cache:
bandwidth = bytes of the latent rows and RoPE keys read / time, compared with a copy `c + 1` of the cache
(bytes read + written / time) measured in the same run. Shapes are DeepSeek-V2-Lite's attention: 16
heads, rank 512, d_nope 128, RoPE 64, Dv 128, bf16. A causal prefill row reports each implementation's
time and its ratio to XLA's.
"""

import functools

import jax
import jax.numpy as jnp

from ejkernel.benchmarks._harness import parser, print_table, time_variants, write_results
from ejkernel.modules import flash_mla
from ejkernel.registry import kernel_registry

OPS = ("flash_mla",)
"""The ops this benchmark times (`ejkernel bench <op>` runs it)."""

# (batch, query length, context, heads, rank, d_nope, d_rope, d_v)
DECODE = (64, 1, 8192, 16, 512, 128, 64, 128)
PREFILL = (1, 4096, 4096, 16, 512, 128, 64, 128)
QUICK_DECODE = (2, 1, 256, 4, 64, 32, 16, 32)
QUICK_PREFILL = (1, 64, 64, 4, 64, 32, 16, 32)


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


def main(argv=None) -> None:
    args = parser(__doc__).parse_args(argv)
    platforms = ["auto"] + [i.platform.value for i in kernel_registry.candidates("flash_mla")]
    rows = []

    shape = QUICK_DECODE if args.quick else DECODE
    tensors = mla_inputs(*shape)
    kv, rope_keys = tensors[1], tensors[4]
    cache_bytes = kv.size * kv.dtype.itemsize + rope_keys.size * rope_keys.dtype.itemsize
    builders = {"copy": _builder(lambda c: c + 1, kv)}
    builders.update({p: _builder(_ours(p, False), *tensors) for p in platforms})
    timings = time_variants(builders, repeats=args.repeats, where=f"decode {shape}")
    copy_bw = 2 * kv.size * kv.dtype.itemsize / timings["copy"]
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
    print("ratio: decode bandwidth / device-copy bandwidth; prefill speed / XLA's")
    print_table(rows, ["mode", "shape", "platform", "ms", "TBps", "copy_TBps", "ratio"])

    def plot(ax, rows):
        labels = [f"{r['mode']} {r['platform']}" for r in rows]
        ax.bar(labels, [r["ratio"] or 0 for r in rows])
        ax.axhline(1.0, color="gray", lw=0.5)
        ax.set_ylabel("decode: / copy bandwidth; prefill: / XLA speed")
        ax.tick_params(axis="x", rotation=30)

    path = write_results(args.out, "mla", rows, {"dtype": "bfloat16", "decode": DECODE, "prefill": PREFILL}, plot)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
