"""Quantized matmul for decoding: bandwidth over the packed weights, per mode and platform, beside a copy.

A decode step reads each layer's packed weights once for a few rows of x: M = 16 and 64 rows, K = N = 8192,
bf16 x, each call running `LAYERS` distinct weight matrices (more bytes than an H200's 50 MB L2, so every
call streams them from HBM; times are per matrix). Bandwidth = packed weight bytes (`w` only; `all_TBps`
adds scales and zeros) / time, beside the device copy of a bf16 [K, N] matrix's bytes (read + written /
time, `_harness.copy_builder`) and the bf16 matmul `x @ W` run the same way (`bf16_speedup` = its time / this
time). The target of a weight-only kernel is `ratio_to_copy` >= 0.8: about 2x the bf16 matmul with 8-bit
codes, 3.5x with 4-bit.
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
from ejkernel.modules import quantized_matmul
from ejkernel.quantization import prepack_quantized_weights
from ejkernel.registry import kernel_registry

OPS = ("quantized_matmul",)
"""The ops this benchmark times (`ejkernel bench <op>` runs it)."""

MODES = {"int4": ("affine", 4), "int8": ("affine", 8), "nf4": ("nf4", None), "mxfp4": ("mxfp4", None)}
MODES |= {"mxfp8": ("mxfp8", None), "nvfp4": ("nvfp4", None), "nvfp8": ("nvfp8", None)}
ROWS, SIZE, LAYERS = (16, 64), 8192, 4
QUICK_ROWS, QUICK_SIZE, QUICK_LAYERS = (1, 4), 256, 2
LAYOUTS = {"row": (False,), "col": (True,), "both": (False, True)}


def _layers(fn, x, layers):
    """A zero-argument call running `fn(x, *layer)` for every layer, jitted as one program."""
    return functools.partial(jax.jit(lambda x, layers: [fn(x, *layer) for layer in layers]), x, layers)


def _packed(mode, bits, transpose, size, layers, key):
    """`layers` distinct `(w, scales, zeros)` of random `[size, size]` kernels packed for the layout."""
    out = []
    for k in jax.random.split(key, layers):
        kernel = jax.random.normal(k, (size, size), jnp.bfloat16)
        packed = prepack_quantized_weights(kernel, bits=bits, mode=mode, transpose=transpose)
        out.append(packed if len(packed) == 3 else (*packed, None))
    return out


def main(argv=None) -> None:
    p = parser(__doc__)
    p.add_argument("--layout", choices=sorted(LAYOUTS), default="row", help="row: transpose=False (EasyDeL's)")
    p.add_argument("--modes", nargs="+", choices=sorted(MODES), default=list(MODES))
    args = p.parse_args(argv)
    rows_list, size, layers = (QUICK_ROWS, QUICK_SIZE, QUICK_LAYERS) if args.quick else (ROWS, SIZE, LAYERS)
    platforms = [i.platform.value for i in kernel_registry.candidates("quantized_matmul")]
    key = jax.random.PRNGKey(0)
    dense = [(jax.random.normal(k, (size, size), jnp.bfloat16),) for k in jax.random.split(key, layers)]
    matmul = lambda x, w: jnp.dot(x, w, preferred_element_type=jnp.float32)
    rows = []
    for transpose in LAYOUTS[args.layout]:
        keys = jax.random.split(jax.random.fold_in(key, transpose), len(args.modes))
        packed = {
            name: _packed(*MODES[name], transpose, size, layers, k) for name, k in zip(args.modes, keys, strict=True)
        }
        for m in rows_list:
            x = jax.random.normal(jax.random.fold_in(key, m), (m, size), jnp.bfloat16)
            builders = {
                ("copy", None): copy_builder(dense[0][0].nbytes),
                ("bf16 x@W", "xla"): functools.partial(_layers, matmul, x, dense),
            }
            for name, weights in packed.items():
                mode, bits = MODES[name]
                for platform in platforms:
                    options = dict(transpose=transpose, bits=bits, mode=mode, platform=platform)
                    op = functools.partial(quantized_matmul, use_best_config=True, **options)
                    builders[name, platform] = functools.partial(_layers, op, x, weights)
            timings = time_variants(builders, repeats=args.repeats, where=f"transpose={transpose} M={m}")
            copy_bw = 2 * dense[0][0].nbytes / timings["copy", None]
            bf16 = timings.get(("bf16 x@W", "xla"))
            for (name, platform), seconds in timings.items():
                if platform is None:
                    continue
                seconds /= layers
                arrays = packed[name][0] if name in packed else dense[0]
                bandwidth = arrays[0].nbytes / seconds
                rows.append(
                    dict(
                        mode=name,
                        transpose=transpose,
                        M=m,
                        K=size,
                        N=size,
                        platform=platform,
                        ms=1e3 * seconds,
                        TBps=bandwidth / 1e12,
                        all_TBps=sum(a.nbytes for a in arrays if a is not None) / seconds / 1e12,
                        copy_TBps=copy_bw / 1e12,
                        ratio_to_copy=bandwidth / copy_bw,
                        bf16_speedup=None if bf16 is None else bf16 / layers / seconds,
                    )
                )
    columns = ["mode", "transpose", "M", "platform", "ms", "TBps", "all_TBps", "copy_TBps", "ratio_to_copy"]
    print_table(rows, [*columns, "bf16_speedup"])

    def plot(ax, rows):
        group = lambda r: f"{r['mode']} M={r['M']}{' T' if r['transpose'] else ''}"
        groups = list(dict.fromkeys(group(r) for r in rows))
        by = {(group(r), r["platform"]): r["ratio_to_copy"] for r in rows}
        series = {p: [by.get((g, p)) for g in groups] for p in dict.fromkeys(r["platform"] for r in rows)}
        grouped_bars(ax, groups, series, "packed-weight bandwidth / device-copy bandwidth", reference=1.0)

    meta = {"dtype": "bfloat16", "layers": layers, "layout": args.layout}
    print(f"wrote {write_results(args.out, 'quantized_matmul', rows, meta, plot)}")


if __name__ == "__main__":
    main()
