"""Grouped matmul: TFLOP/s of each implementation beside a dense matmul of the same work and `jax.lax.ragged_dot`.

MoE shape of the issue: bf16, M tokens in G groups of random sizes, K -> N. FLOPs are 2·M·K·N forward
and 3× that for forward+backward (dlhs and drhs are products of the same size). The dense baseline
multiplies `[M, K] x [K, N]` once (same work, no grouping); `ragged_dot` is JAX's own grouped matmul.
Every variant is timed in the same run and reported with its ratio to the dense matmul.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ejkernel.benchmarks._harness import grouped_bars, parser, print_table, time_variants, write_results
from ejkernel.modules import grouped_matmul
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


def main(argv=None) -> None:
    args = parser(__doc__).parse_args(argv)
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
