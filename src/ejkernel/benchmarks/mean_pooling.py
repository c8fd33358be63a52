"""Mean pooling: achieved HBM bandwidth of each implementation beside a device copy of the same bytes.

Pooling reads every input byte once and writes almost nothing, so its bandwidth (bytes read / time)
is compared with the device copy of the same bytes (read + written / time, `_harness.copy_builder`) measured
in the same run.
"""

import functools

import jax
import jax.numpy as jnp

from ejkernel.benchmarks._harness import (
    copy_builder,
    grouped_bars,
    parser,
    print_table,
    time_variants,
    write_results,
)
from ejkernel.modules import mean_pooling
from ejkernel.registry import kernel_registry

OPS = ("mean_pooling",)
"""The ops this benchmark times (`ejkernel bench <op>` runs it)."""

SHAPES = [(64, 4096, 4096), (8, 8192, 2048), (256, 512, 1024)]
QUICK_SHAPES = [(4, 128, 64)]


def _call(fn, x):
    """A zero-argument call of `fn` jitted, on `x`."""
    return functools.partial(jax.jit(fn), x)


def main(argv=None) -> None:
    args = parser(__doc__).parse_args(argv)
    rows = []
    for batch, seq, dim in QUICK_SHAPES if args.quick else SHAPES:
        x = jax.random.normal(jax.random.PRNGKey(0), (batch, seq, dim), jnp.bfloat16)
        nbytes = x.size * x.dtype.itemsize
        platforms = ["auto"] + [i.platform.value for i in kernel_registry.candidates("mean_pooling")]
        builders = {"copy": copy_builder(nbytes)}
        for platform in platforms:
            builders[platform] = functools.partial(_call, functools.partial(mean_pooling, platform=platform), x)
        timings = time_variants(builders, repeats=args.repeats, where=f"B={batch} S={seq} D={dim}")
        copy_bw = 2 * nbytes / timings["copy"]
        for platform in platforms:
            seconds = timings[platform]
            bandwidth = (nbytes + batch * dim * x.dtype.itemsize) / seconds
            rows.append(
                dict(
                    B=batch,
                    S=seq,
                    D=dim,
                    platform=platform,
                    ms=1e3 * seconds,
                    TBps=bandwidth / 1e12,
                    copy_TBps=copy_bw / 1e12,
                    ratio_to_copy=bandwidth / copy_bw,
                )
            )
    print_table(rows, ["B", "S", "D", "platform", "ms", "TBps", "copy_TBps", "ratio_to_copy"])

    def plot(ax, rows):
        shape = lambda r: f"{r['B']}x{r['S']}x{r['D']}"
        shapes = list(dict.fromkeys(shape(r) for r in rows))
        by = {(shape(r), r["platform"]): r["ratio_to_copy"] for r in rows}
        platforms = dict.fromkeys(r["platform"] for r in rows)
        series = {p: [by.get((s, p)) for s in shapes] for p in platforms}
        grouped_bars(ax, shapes, series, "bandwidth / device-copy bandwidth", reference=1.0)

    path = write_results(args.out, "mean_pooling", rows, {"dtype": "bfloat16"}, plot)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
