"""Causal depthwise convolution: achieved bandwidth beside a device copy of the same bytes.

Packed serving form (issue 44's shape): 16384 tokens of 64 sequences x 8192 channels, width 4, SiLU and bias,
each sequence reading and writing its slot of a conv-state pool; a decode step (256 sequences of one token on a
pool of 256 slots); and the dense training form's forward and
forward+backward at the same size, on every platform that serves the op here (`auto` and each implementation;
`--sweep` adds the Triton kernels at other tiles). Bandwidth = bytes of x read + out written (+ the slots read
and written) / time, beside the device copy of x's bytes (read + written, `_harness.copy_builder`) in the same run.
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
from ejkernel.modules import CausalConv1dConfig, causal_conv1d
from ejkernel.ops import FwdParams
from ejkernel.registry import kernel_registry

OPS = ("causal_conv1d",)
"""The ops this benchmark times (`ejkernel bench <op>` runs it)."""

SHAPE = (16384, 8192, 4, 64)  # tokens, channels, width, sequences
QUICK_SHAPE = (256, 64, 4, 4)
DECODE, QUICK_DECODE = 256, 4
"""Sequences of the decode step, a token each."""


TILINGS = ((16, 256), (32, 128), (32, 256), (64, 128), (16, 512), (64, 256))
"""Triton forward tiles (tokens, channels) that `--sweep` times beside the default (the backward is plain JAX)."""


def _config(platform: str, tile):
    if tile is None:
        return platform, None
    return platform, CausalConv1dConfig(fwd_params=FwdParams(block_k=tile[0], block_d=tile[1]))


def main(argv=None) -> None:
    p = parser(__doc__)
    p.add_argument("--sweep", action="store_true", help="also time the Triton kernels at each tile of TILINGS")
    args = p.parse_args(argv)
    tokens, channels, width, seqs = QUICK_SHAPE if args.quick else SHAPE
    decode = QUICK_DECODE if args.quick else DECODE
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 4))
    x = jax.random.normal(next(keys), (tokens, channels), jnp.bfloat16)
    weight = jax.random.normal(next(keys), (channels, width), jnp.bfloat16)
    bias = jax.random.normal(next(keys), (channels,), jnp.bfloat16)
    pool = jax.random.normal(next(keys), (seqs, channels, width - 1), jnp.bfloat16)
    cu = jnp.arange(seqs + 1, dtype=jnp.int32) * (tokens // seqs)
    x_dense = x.reshape(seqs, tokens // seqs, channels)
    x_step, step_pool = x[:decode], jnp.tile(pool, (decode // seqs + 1, 1, 1))[:decode]
    one_each = jnp.arange(decode + 1, dtype=jnp.int32)

    def cases(platform, cfg):
        options = dict(activation="silu", platform=platform, cfg=cfg)
        packed = lambda x, pool: causal_conv1d(x, weight, bias, cu_seqlens=cu, conv_state=pool, **options)
        step = lambda x, pool: causal_conv1d(
            x, weight, bias, cu_seqlens=one_each, conv_state=pool, state_indices=one_each[:-1], **options
        )
        dense = lambda x: causal_conv1d(x, weight, bias, **options)
        train = jax.grad(lambda x: jnp.sum(dense(x).astype(jnp.float32)))
        return {
            "packed + pool": lambda: functools.partial(jax.jit(packed), x, pool),
            "decode step": lambda: functools.partial(jax.jit(step), x_step, step_pool),
            "dense fwd": lambda: functools.partial(jax.jit(dense), x_dense),
            "dense fwd+bwd": lambda: functools.partial(jax.jit(train), x_dense),
        }

    platforms = ["auto"] + [i.platform.value for i in kernel_registry.candidates("causal_conv1d")]
    variants = {platform: _config(platform, None) for platform in platforms}
    if args.sweep and "triton" in platforms:
        variants |= {f"triton {t}x{c}": _config("triton", (t, c)) for t, c in TILINGS}
    builders = {"copy": copy_builder(x.nbytes)}
    for name, (platform, cfg) in variants.items():
        builders |= {f"{case} | {name}": build for case, build in cases(platform, cfg).items()}
    timings = time_variants(builders, repeats=args.repeats, where="causal_conv1d")
    copy_bw = 2 * x.nbytes / timings["copy"]
    moved = {"packed + pool": 2 * x.nbytes + 2 * pool.nbytes, "dense fwd": 2 * x.nbytes, "dense fwd+bwd": 4 * x.nbytes}
    moved["decode step"] = 2 * x_step.nbytes + 2 * step_pool.nbytes
    rows = []
    for key, seconds in timings.items():
        if key == "copy":
            continue
        case, platform = key.split(" | ")
        bandwidth = moved[case] / seconds
        count = decode if case == "decode step" else tokens
        rows.append(dict(case=case, platform=platform, T=count, C=channels, W=width, ms=1e3 * seconds,
                         TBps=bandwidth / 1e12, ratio_to_copy=bandwidth / copy_bw))  # fmt: skip
    print(f"device copy: {copy_bw / 1e12:.3g} TB/s (bf16; bytes: x read + out written, + the pool's slots)")
    print_table(rows, ["case", "platform", "T", "C", "W", "ms", "TBps", "ratio_to_copy"])

    def plot(ax, rows):
        groups = list(dict.fromkeys(row["case"] for row in rows))
        by = {(row["case"], row["platform"]): row["ratio_to_copy"] for row in rows}
        series = {p: [by.get((g, p)) for g in groups] for p in dict.fromkeys(row["platform"] for row in rows)}
        grouped_bars(ax, groups, series, "bandwidth / device-copy bandwidth", reference=1.0)

    meta = {"dtype": "bfloat16", "copy_TBps": copy_bw / 1e12}
    print(f"wrote {write_results(args.out, 'causal_conv1d', rows, meta, plot)}")


if __name__ == "__main__":
    main()
