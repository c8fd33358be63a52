"""Causal depthwise convolution: achieved bandwidth beside a device copy of the same bytes.

Packed serving form (issue 44's shape): 16384 tokens of 64 sequences x 8192 channels, width 4, SiLU and bias,
each sequence reading and writing its slot of a conv-state pool; and the dense training form's forward and
forward+backward at the same size. Bandwidth = bytes of x read + out written (+ the slots read and written) /
time, beside a copy `x + 1` (bytes read + written) in the same run.
"""

import functools

import jax
import jax.numpy as jnp

from ejkernel.benchmarks._harness import parser, print_table, time_variants, write_results
from ejkernel.modules import causal_conv1d

OPS = ("causal_conv1d",)
"""The ops this benchmark times (`ejkernel bench <op>` runs it)."""

SHAPE = (16384, 8192, 4, 64)  # tokens, channels, width, sequences
QUICK_SHAPE = (256, 64, 4, 4)


def main(argv=None) -> None:
    args = parser(__doc__).parse_args(argv)
    tokens, channels, width, seqs = QUICK_SHAPE if args.quick else SHAPE
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 4))
    x = jax.random.normal(next(keys), (tokens, channels), jnp.bfloat16)
    weight = jax.random.normal(next(keys), (channels, width), jnp.bfloat16)
    bias = jax.random.normal(next(keys), (channels,), jnp.bfloat16)
    pool = jax.random.normal(next(keys), (seqs, channels, width - 1), jnp.bfloat16)
    cu = jnp.arange(seqs + 1, dtype=jnp.int32) * (tokens // seqs)
    packed = lambda x, pool: causal_conv1d(x, weight, bias, activation="silu", cu_seqlens=cu, conv_state=pool)
    dense = lambda x: causal_conv1d(x, weight, bias, activation="silu")
    train = jax.grad(lambda x: jnp.sum(dense(x).astype(jnp.float32)))
    x_dense = x.reshape(seqs, tokens // seqs, channels)
    builders = {
        "copy": lambda: functools.partial(jax.jit(lambda a: a + 1), x),
        "packed + pool": lambda: functools.partial(jax.jit(packed), x, pool),
        "dense fwd": lambda: functools.partial(jax.jit(dense), x_dense),
        "dense fwd+bwd": lambda: functools.partial(jax.jit(train), x_dense),
    }
    timings = time_variants(builders, repeats=args.repeats, where="causal_conv1d")
    copy_bw = 2 * x.nbytes / timings["copy"]
    moved = {"packed + pool": 2 * x.nbytes + 2 * pool.nbytes, "dense fwd": 2 * x.nbytes, "dense fwd+bwd": 4 * x.nbytes}
    rows = []
    for name, nbytes in moved.items():
        if name in timings:
            bandwidth = nbytes / timings[name]
            rows.append(dict(case=name, T=tokens, C=channels, W=width, ms=1e3 * timings[name],
                             TBps=bandwidth / 1e12, ratio_to_copy=bandwidth / copy_bw))  # fmt: skip
    print(f"device copy: {copy_bw / 1e12:.3g} TB/s (bf16; bytes: x read + out written, + the pool's slots)")
    print_table(rows, ["case", "T", "C", "W", "ms", "TBps", "ratio_to_copy"])

    def plot(ax, rows):
        ax.bar(range(len(rows)), [row["ratio_to_copy"] for row in rows])
        ax.axhline(1.0, color="gray", lw=0.8, ls="--")
        ax.set_xticks(range(len(rows)), [row["case"] for row in rows], fontsize=7)
        ax.set_ylabel("bandwidth / device-copy bandwidth")

    meta = {"dtype": "bfloat16", "copy_TBps": copy_bw / 1e12}
    print(f"wrote {write_results(args.out, 'causal_conv1d', rows, meta, plot)}")


if __name__ == "__main__":
    main()
