"""Grouped matmul: TFLOP/s of each implementation beside a dense matmul of the same work and `jax.lax.ragged_dot`.

MoE shape of the issue: bf16, M tokens in G groups of random sizes, K -> N. FLOPs are 2·M·K·N forward
and 3× that for forward+backward (dlhs and drhs are products of the same size). The dense baseline
multiplies `[M, K] x [K, N]` once (same work, no grouping); `ragged_dot` is JAX's own grouped matmul.
Every variant is timed in the same run and reported with its ratio to the dense matmul.

`--part quantized` times the forward with quantized expert weights on the same shape instead, beside our bf16
grouped matmul: FP8 with DeepSeek's 128 x 128 block scales (v3 `rhs_scale`; weight-only, and FP8 x FP8 with
`fp8_lhs`), MXFP4 and int4 affine (groups of 128) `QuantizedArray`s packed along K (int4 also on the Triton kernel,
which `auto` served before the Mosaic GPU 4-bit forward took int4), and XLA's alternative
(dequantize the MXFP4 weights, then the XLA grouped matmul); each with its ratio to bf16 (> 1: faster). The FP8 x
FP8 rows are timed twice: `[G, K, N]` weights (the Triton kernel) and `[G, N, K]` weights with `transpose_rhs`
(laid out once, outside the timing: the Mosaic GPU FP8 forward on Hopper, which reads both operands K-major),
beside the bf16 Mosaic GPU forward (`platform="pallas"`).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ejkernel.benchmarks._harness import grouped_bars, parser, print_table, time_variants, write_results
from ejkernel.modules import grouped_matmul
from ejkernel.quantization import quantize_array
from ejkernel.registry import kernel_registry

OPS = ("grouped_matmul",)
"""The ops this benchmark times (`ejkernel bench <op>` runs it)."""

SHAPES = [(32768, 4096, 1536, 64)]  # M, K, N, groups
QUICK_SHAPES = [(256, 64, 32, 8)]


def random_group_sizes(m: int, groups: int, seed: int = 0) -> jax.Array:
    """`groups` random sizes summing to `m` (some may be empty)."""
    cuts = np.sort(np.random.default_rng(seed).integers(0, m + 1, groups - 1))
    return jnp.asarray(np.diff(np.concatenate([[0], cuts, [m]])), jnp.int32)


def _variants(sizes, platforms):
    """name -> `fn(lhs, rhs)`: ours per platform, the dense matmul of the same work, ragged_dot."""
    fns = {
        f"ejkernel-{p}": functools.partial(
            lambda lhs, rhs, p: grouped_matmul(lhs, rhs, sizes, preferred_element_type=lhs.dtype, platform=p), p=p
        )
        for p in platforms
    }
    fns["dense"] = lambda lhs, rhs: jnp.dot(lhs, rhs[0])
    fns["ragged_dot"] = lambda lhs, rhs: jax.lax.ragged_dot(lhs, rhs, sizes)
    return fns


def _builder(fn, backward: bool, *args):
    """A `time_variants` builder: the zero-argument jitted forward (or gradient) of `fn(*args)`."""
    if backward:
        step = jax.jit(jax.grad(lambda a, b: jnp.sum(fn(a, b).astype(jnp.float32)), argnums=(0, 1)))
    else:
        step = jax.jit(fn)
    return lambda: functools.partial(step, *args)


def fp8_block_scaled(w: jax.Array, block: int = 128) -> tuple[jax.Array, jax.Array]:
    """`w [G, K, N]` as DeepSeek-V3 stores it: float8_e4m3fn values and one scale per `block x block` tile
    (absmax / 448), broadcast along N into v3's `rhs_scale [G, K / block, 1, N]`."""
    groups, k, n = w.shape
    tiles = jnp.abs(w.astype(jnp.float32)).reshape(groups, k // block, block, n // block, block).max(axis=(2, 4))
    scale = jnp.maximum(tiles, 1e-12) / 448.0  # [G, K / block, N / block]
    rhs_scale = jnp.repeat(scale, block, axis=2)[:, :, None, :]
    values = w.astype(jnp.float32) / jnp.repeat(rhs_scale[:, :, 0], block, axis=1)
    return values.astype(jnp.float8_e4m3fn), rhs_scale


def _quantized_rows(m: int, k: int, n: int, groups: int, repeats: int) -> list[dict]:
    """Forward times with quantized weights beside our bf16 grouped matmul (`--part quantized`)."""
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    lhs = jax.random.normal(keys[0], (m, k), jnp.bfloat16)
    w = (jax.random.normal(keys[1], (groups, k, n), jnp.float32) * k**-0.5).astype(jnp.bfloat16)
    sizes = random_group_sizes(m, groups)
    block = min(128, k, n)
    fp8, rhs_scale = fp8_block_scaled(w, block)
    fp8_nk = jnp.swapaxes(fp8, 1, 2)  # the K-major layout FP8 wgmma reads, made once
    mxfp4 = quantize_array(w, mode="mxfp4", axis="row")  # [G, N, K] packed, groups of 32 along K
    int4 = quantize_array(w, group_size=block, bits=4, axis="row")
    out = dict(preferred_element_type=jnp.bfloat16)
    variants = {
        "bf16": (lambda a, b: grouped_matmul(a, b, sizes, **out), w),
        "fp8 block-scaled": (
            lambda a, b: grouped_matmul(a, b, sizes, rhs_scale=rhs_scale, use_v3=True, **out),
            fp8,
        ),
        "fp8 x fp8 (fp8_lhs)": (
            lambda a, b: grouped_matmul(a, b, sizes, rhs_scale=rhs_scale, use_v3=True, fp8_lhs=True, **out),
            fp8,
        ),
        "fp8 x fp8 [G, N, K] (fp8_lhs, auto)": (
            lambda a, b: grouped_matmul(
                a, b, sizes, rhs_scale=rhs_scale, use_v3=True, fp8_lhs=True, transpose_rhs=True, **out
            ),
            fp8_nk,
        ),
        "bf16 (mosaic gpu)": (lambda a, b: grouped_matmul(a, b, sizes, platform="pallas", **out), w),
        "mxfp4": (lambda a, b: grouped_matmul(a, b, sizes, **out), mxfp4),
        f"int4 affine g{block}": (lambda a, b: grouped_matmul(a, b, sizes, **out), int4),
        f"int4 affine g{block} (triton)": (lambda a, b: grouped_matmul(a, b, sizes, platform="triton", **out), int4),
        "xla dequantize+gmm (mxfp4)": (
            lambda a, b: grouped_matmul(
                a, b.dequantize().astype(jnp.bfloat16), sizes, transpose_rhs=True, platform="xla", **out
            ),
            mxfp4,
        ),
    }
    builders = {name: _builder(fn, False, lhs, rhs) for name, (fn, rhs) in variants.items()}
    timings = time_variants(builders, repeats=repeats, where=f"M={m} K={k} N={n} G={groups} quantized fwd")
    bytes_of = lambda tree: sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(tree))
    weight_bytes = {
        name: bytes_of(rhs) + (rhs_scale.nbytes if "fp8" in name else 0) for name, (_, rhs) in variants.items()
    }
    return [
        dict(
            M=m,
            K=k,
            N=n,
            G=groups,
            mode="fwd",
            variant=name,
            ms=1e3 * seconds,
            TFLOPs=2.0 * m * k * n / seconds / 1e12,
            weight_GB=weight_bytes[name] / 1e9,
            ratio_to_bf16=timings["bf16"] / seconds if "bf16" in timings else None,
        )
        for name, seconds in timings.items()
    ]


def _plot_quantized(ax, rows):
    grouped_bars(ax, [r["variant"] for r in rows], {"ratio to bf16": [r["ratio_to_bf16"] for r in rows]}, "×", 1.0)


def main(argv=None) -> None:
    p = parser(__doc__)
    p.add_argument("--part", choices=("dense", "quantized"), default="dense", help="which rows to time")
    args = p.parse_args(argv)
    if args.part == "quantized":
        rows = [r for shape in (QUICK_SHAPES if args.quick else SHAPES) for r in _quantized_rows(*shape, args.repeats)]
        print_table(rows, ["M", "K", "N", "G", "variant", "ms", "TFLOPs", "weight_GB", "ratio_to_bf16"])
        meta = {"dtype": "bfloat16 activations and output", "step": "forward"}
        print(f"wrote {write_results(args.out, 'grouped_matmul_quantized', rows, meta, _plot_quantized)}")
        return
    platforms = ["auto"] + [i.platform.value for i in kernel_registry.candidates("grouped_matmul")]
    rows = []
    for m, k, n, groups in QUICK_SHAPES if args.quick else SHAPES:
        keys = jax.random.split(jax.random.PRNGKey(0), 2)
        lhs = jax.random.normal(keys[0], (m, k), jnp.bfloat16)
        rhs = (jax.random.normal(keys[1], (groups, k, n), jnp.float32) * k**-0.5).astype(jnp.bfloat16)
        sizes = random_group_sizes(m, groups)
        flops = 2.0 * m * k * n
        for backward in (False, True):
            mode = "fwd+bwd" if backward else "fwd"
            builders = {name: _builder(f, backward, lhs, rhs) for name, f in _variants(sizes, platforms).items()}
            timings = time_variants(builders, repeats=args.repeats, where=f"M={m} K={k} N={n} G={groups} {mode}")
            work = flops * (3.0 if backward else 1.0)
            for name, seconds in timings.items():
                rows.append(
                    dict(
                        M=m,
                        K=k,
                        N=n,
                        G=groups,
                        mode=mode,
                        variant=name,
                        ms=1e3 * seconds,
                        TFLOPs=work / seconds / 1e12,
                        ratio_to_dense=timings["dense"] / seconds if "dense" in timings else None,
                    )
                )
    print_table(rows, ["M", "K", "N", "G", "mode", "variant", "ms", "TFLOPs", "ratio_to_dense"])

    def plot(ax, rows):
        modes = list(dict.fromkeys(r["mode"] for r in rows))
        by = {(r["mode"], r["variant"]): r["TFLOPs"] for r in rows}
        variants = dict.fromkeys(r["variant"] for r in rows)
        grouped_bars(ax, modes, {v: [by.get((m, v)) for m in modes] for v in variants}, "TFLOP/s (bf16)")

    path = write_results(args.out, "grouped_matmul", rows, {"dtype": "bfloat16"}, plot)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
