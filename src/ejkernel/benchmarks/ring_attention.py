"""Ring attention on every visible device against flash attention on one device.

bf16, causal; forward and forward+backward. FLOPs count 0.5·4·B·H·S²·D for the causal forward and
3.5× that for forward+backward; the ring's TFLOP/s is the whole computation over the wall time of the
n devices working together. Two one-device baselines: flash attention at the same total length S
(ring / flash is the speed-up over one device, ideal n) and at the per-device length S / n (scaling
efficiency = ring / (n · that), ideal 1). `--quick` uses tiny shapes (a CPU smoke run; on one CPU
device the ring has n = 1).
"""

import functools

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ejkernel.benchmarks._harness import grouped_bars, parser, print_table, time_variants, write_results
from ejkernel.modules import flash_attention, ring_attention
from ejkernel.registry import kernel_registry

OPS = ("ring_attention",)
"""The ops this benchmark times (`ejkernel bench <op>` runs it)."""

SHAPE = (1, 65536, 16, 128)  # B, S, H, D
QUICK_SHAPE = (1, 256, 2, 32)


def _step(fn, inputs, backward: bool):
    """A zero-argument call of the jitted forward (or gradient) on `inputs`."""
    if not backward:
        step = jax.jit(fn)
    else:
        step = jax.jit(jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32)), argnums=(0, 1, 2)))
    return functools.partial(step, *inputs)


def main(argv=None) -> None:
    p = parser(__doc__)
    p.add_argument("--seq", type=int, help=f"total sequence length (default {SHAPE[1]})")
    p.add_argument("--heads", type=int, help=f"query heads (default {SHAPE[2]})")
    p.add_argument("--kv-heads", type=int, help="key/value heads (default: as many as query heads)")
    p.add_argument("--platform", help="one ring_attention platform (default: auto and every one that runs here)")
    p.add_argument("--flash-platform", default="auto", help="one-device flash_attention platform")
    p.add_argument("--no-causal", action="store_true", help="full (non-causal) attention instead")
    p.add_argument("--devices", type=int, help="how many of the visible devices form the ring (default: all)")
    args = p.parse_args(argv)
    batch, seq, heads, dim = QUICK_SHAPE if args.quick else SHAPE
    seq, heads = args.seq or seq, args.heads or heads
    kv_heads = args.kv_heads or heads
    causal = not args.no_causal
    devices = jax.devices()[: args.devices]
    n = len(devices)
    mesh = jax.make_mesh((n,), ("sp",), axis_types=(jax.sharding.AxisType.Auto,), devices=devices)
    keys = jax.random.split(jax.random.PRNGKey(seq + heads), 3)
    shapes = [(batch, seq, heads, dim), (batch, seq, kv_heads, dim), (batch, seq, kv_heads, dim)]
    qkv = [jax.random.normal(key, shape, jnp.bfloat16) for key, shape in zip(keys, shapes, strict=True)]
    spec = P(None, "sp")
    sharded = [jax.device_put(x, NamedSharding(mesh, spec)) for x in qkv]
    single = [jax.device_put(x, devices[0]) for x in qkv]

    def ring(platform):
        def fn(q, k, v):
            return ring_attention(
                q, k, v, causal=causal, platform=platform, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec
            )

        return fn

    platforms = (
        [args.platform]
        if args.platform
        else ["auto"] + [i.platform.value for i in kernel_registry.candidates("ring_attention")]
    )
    # name -> (function, inputs, fraction of the whole sequence's FLOPs it computes)
    variants = {f"ring-{p} x{n}": (ring(p), sharded, 1.0) for p in dict.fromkeys(platforms)}

    def flash(q, k, v):
        return flash_attention(q, k, v, causal=causal, platform=args.flash_platform)

    variants["flash x1"] = (flash, single, 1.0)
    if n > 1:
        variants["flash x1 S/n"] = (flash, [x[:, : seq // n] for x in single], 1.0 / n**2)

    flops = 4 * batch * heads * seq * seq * dim * (0.5 if causal else 1.0)
    rows = []
    for backward in (False, True):
        row = dict(B=batch, S=seq, H=heads, Hkv=kv_heads, D=dim, causal=causal, devices=n)
        row["mode"] = "fwd+bwd" if backward else "fwd"
        work = flops * (3.5 if backward else 1.0)
        builders = {name: functools.partial(_step, fn, inputs, backward) for name, (fn, inputs, _) in variants.items()}
        timings = time_variants(builders, repeats=args.repeats, where=row["mode"])
        for name, (_, _, share) in variants.items():
            row[name] = work * share / timings[name] / 1e12 if name in timings else None
        for name in variants:
            if name.startswith("ring") and row.get(name):
                ring_name = name.split()[0]
                if row.get("flash x1"):
                    row[f"{ring_name} / flash"] = row[name] / row["flash x1"]
                if row.get("flash x1 S/n"):
                    row[f"{ring_name} efficiency"] = row[name] / (n * row["flash x1 S/n"])
        rows.append(row)
    ratios = [c for c in dict.fromkeys(k for r in rows for k in r) if c.endswith((" / flash", " efficiency"))]
    print(
        f"TFLOP/s (bf16) on {n} x {devices[0].device_kind}; flash x1: flash_attention(platform={args.flash_platform!r})"
    )
    print_table(rows, ["B", "S", "H", "Hkv", "D", "causal", "mode", *variants, *ratios])

    def plot(ax, rows):
        labels = [f"S={row['S']} {row['mode']}" for row in rows]
        grouped_bars(ax, labels, {name: [row.get(name) for row in rows] for name in variants}, "TFLOP/s (bf16)")

    meta = {"dtype": "bfloat16", "devices": n, "ring_platforms": platforms, "flash_platform": args.flash_platform}
    path = write_results(args.out, "ring_attention", rows, meta, plot)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
