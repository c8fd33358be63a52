"""Mean pooling: achieved HBM bandwidth of each implementation beside a device copy of the same bytes.

Pooling reads every input byte once and writes almost nothing, so its bandwidth (bytes read / time)
is compared with a copy `x + 1` (bytes read + written / time) measured in the same run.
"""

import jax
import jax.numpy as jnp

from ejkernel.benchmarks._harness import parser, print_table, time_fn, write_results
from ejkernel.modules import mean_pooling
from ejkernel.registry import kernel_registry

SHAPES = [(64, 4096, 4096), (8, 8192, 2048), (256, 512, 1024)]
QUICK_SHAPES = [(4, 128, 64)]


def main(argv=None) -> None:
    args = parser(__doc__).parse_args(argv)
    rows = []
    for batch, seq, dim in QUICK_SHAPES if args.quick else SHAPES:
        x = jax.random.normal(jax.random.PRNGKey(0), (batch, seq, dim), jnp.bfloat16)
        nbytes = x.size * x.dtype.itemsize
        copy = jax.jit(lambda a: a + 1)
        copy_s = time_fn(lambda c=copy, a=x: c(a), repeats=args.repeats)
        copy_bw = 2 * nbytes / copy_s
        platforms = ["auto"] + [i.platform.value for i in kernel_registry.candidates("mean_pooling")]
        for platform in platforms:
            fn = jax.jit(lambda a, p=platform: mean_pooling(a, platform=p))
            seconds = time_fn(lambda f=fn, a=x: f(a), repeats=args.repeats)
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
        labels = sorted({f"{r['B']}x{r['S']}x{r['D']}" for r in rows})
        for platform in dict.fromkeys(r["platform"] for r in rows):
            ys = [
                next(
                    r["ratio_to_copy"]
                    for r in rows
                    if r["platform"] == platform and f"{r['B']}x{r['S']}x{r['D']}" == label
                )
                for label in labels
            ]
            ax.plot(labels, ys, marker="o", label=platform)
        ax.axhline(1.0, color="gray", lw=0.5)
        ax.set_ylabel("bandwidth / device-copy bandwidth")
        ax.set_xlabel("B x S x D (bf16)")
        ax.legend()

    path = write_results(args.out, "mean_pooling", rows, {"dtype": "bfloat16"}, plot)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
