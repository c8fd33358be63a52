"""Block-sparse attention: time at 10% and 25% block density beside our dense flash attention, bf16.

Random block patterns (a `mask_builder` of positions alone, so the block table is a constant) of
128 x 128 blocks, not causal. `blocksparse_attention` as users call it (`auto`: under `ejkernel autotune`
the calls tuned and exported) and on each platform that serves it is timed forward and
forward+backward beside `flash_attention` (`platform="auto"`) on the same tensors in the same run; the
figure of merit is `time / (density × dense time)`: 1.0 means the cost follows the density exactly.
Native sparse attention is timed forward+backward too, with its blocks chosen by the compressed branch.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ejkernel.benchmarks._harness import parser, print_table, time_variants, write_results
from ejkernel.modules import blocksparse_attention, flash_attention
from ejkernel.registry import kernel_registry

OPS = ("blocksparse_attention",)
"""The ops this benchmark times (`ejkernel bench <op>` runs it)."""

SHAPE = (1, 16384, 16, 128)  # B, S, H, D
QUICK_SHAPE = (1, 512, 2, 64)
DENSITIES = (0.10, 0.25)
BLOCK = 128


def random_blocks(seq: int, density: float, seed: int = 0):
    """(mask builder, measured density) of a random pattern of BLOCK x BLOCK tiles."""
    n = seq // BLOCK
    tiles = np.random.default_rng(seed).random((n, n)) < density
    builder = lambda i, j: tiles[np.asarray(i) // BLOCK, np.asarray(j) // BLOCK]
    return builder, float(tiles.mean())


def _step(fn, backward: bool):
    """The jitted forward of `fn(q, k, v)`, or its gradient in all three."""
    if backward:
        return jax.jit(jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32)), argnums=(0, 1, 2)))
    return jax.jit(fn)


def main(argv=None) -> None:
    args = parser(__doc__).parse_args(argv)
    batch, seq, heads, dim = QUICK_SHAPE if args.quick else SHAPE
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    q, k, v = (jax.random.normal(key, (batch, heads, seq, dim), jnp.bfloat16) for key in keys)
    platforms = ["auto"] + [i.platform.value for i in kernel_registry.candidates("blocksparse_attention")]
    to_bshd = lambda x: jnp.swapaxes(x, 1, 2)
    variants = {"dense flash_attention (auto)": lambda q, k, v: flash_attention(to_bshd(q), to_bshd(k), to_bshd(v))}
    densities = {}
    for target in DENSITIES:
        builder, density = random_blocks(seq, target)
        for platform in platforms:
            name = f"blocksparse {platform} {target:.0%}"
            densities[name] = density
            variants[name] = functools.partial(
                blocksparse_attention, mask_builder=builder, causal=False, platform=platform
            )
    rows = []
    for backward in (False, True):
        mode = "fwd+bwd" if backward else "fwd"
        builders = {
            name: (lambda fn=fn, backward=backward: functools.partial(_step(fn, backward), q, k, v))
            for name, fn in variants.items()
        }
        timings = time_variants(builders, repeats=args.repeats, where=mode)
        dense = timings.get("dense flash_attention (auto)")
        for name in variants:
            if name not in timings:
                continue
            row = dict(variant=name, mode=mode, ms=1e3 * timings[name], density=densities.get(name))
            if dense and name in densities:
                row["time/(density*dense)"] = timings[name] / (densities[name] * dense)
            rows.append(row)
    columns = ["variant", "mode", "ms", "density", "time/(density*dense)"]
    print_table(rows, columns)

    def plot(ax, rows):
        sparse = [r for r in rows if r.get("time/(density*dense)") is not None]
        labels = [f"{r['variant']} {r['mode']}" for r in sparse]
        ax.bar(range(len(sparse)), [r["time/(density*dense)"] for r in sparse])
        ax.axhline(1.3, color="red", lw=0.8, label="target 1.3")
        ax.set_xticks(range(len(sparse)), labels, rotation=45, ha="right", fontsize=7)
        ax.set_ylabel("time / (density × dense time)")
        ax.legend(fontsize=7)

    meta = {"dtype": "bfloat16", "shape": dict(B=batch, S=seq, H=heads, D=dim), "block": BLOCK}
    path = write_results(args.out, "sparse_attention", rows, meta, plot)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
