"""Thirtieth session: causal_conv1d's Triton forward designs and tiles against XLA and a device copy (issue 44: the
forward at >= 0.8 of a copy's bandwidth). 16384 tokens x 8192 channels, width 4, bf16: a dense batch of 64 rows
of 256 (SiLU and bias, then neither), packed as 64 sequences on a conv-state pool, and dense forward+backward.
One line per case and variant: ms, the bytes moved per second as a fraction of a copy `x + 1` timed in the same
run, and the error against XLA's result. Variants are `window <tokens>x<channels> w<warps> s<stages> r<step rows>`
(the sliding window; ` p`: prefetching the next step's rows) and `shifted` (the kernel before it). Run on the
GPU: `python3 exp/s30_conv_variants.py`; `--quick`: tiny shapes in Pallas interpret mode (a CPU smoke run)."""

import argparse
import functools

import jax
import jax.numpy as jnp
from _kit import rel

from ejkernel.benchmarks._harness import time_variants
from ejkernel.kernels._triton.causal_conv1d import causal_conv1d_triton
from ejkernel.modules import CausalConv1dConfig, CausalConv1dTritonTiling, causal_conv1d
from ejkernel.ops import FwdParams

WINDOWS = [  # tokens, channels, warps, stages, step rows, prefetch
    (64, 1024, 4, 1, 4, False),  # the default before it took 8 warps and 8 rows a step
    (64, 1024, 4, 1, 1, False),
    (64, 1024, 8, 1, 8, False),
    (64, 1024, 4, 3, 2, False),
    (256, 1024, 4, 2, 4, False),
    (64, 512, 2, 1, 8, False),
    (64, 1024, 4, 1, 4, True),
    (256, 1024, 4, 1, 2, True),
]
TRAIN_WINDOWS = WINDOWS[:1]
"""The backward (plain JAX) is the same in every variant: forward+backward at the first window only."""


def config(window):
    if window is None:
        return CausalConv1dConfig(triton_tiling=CausalConv1dTritonTiling(forward="shifted"))
    tokens, channels, warps, stages, rows, prefetch = window
    return CausalConv1dConfig(
        fwd_params=FwdParams(block_k=tokens, block_d=channels, num_warps=warps, num_stages=stages),
        triton_tiling=CausalConv1dTritonTiling(forward="window", step_rows=rows, prefetch=prefetch),
    )


def name(window):
    return "shifted" if window is None else "window {}x{} w{} s{} r{}{}".format(*window[:5], " p" * window[5])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args()
    tokens, channels, seqs = (64, 32, 4) if args.quick else (16384, 8192, 64)
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 5))
    x = jax.random.normal(next(keys), (tokens, channels), jnp.bfloat16)
    weight = jax.random.normal(next(keys), (channels, 4), jnp.bfloat16) * 0.5
    bias = jax.random.normal(next(keys), (channels,), jnp.bfloat16)
    pool = jax.random.normal(next(keys), (seqs, channels, 3), jnp.bfloat16)
    cu = jnp.arange(seqs + 1, dtype=jnp.int32) * (tokens // seqs)
    dense_x = x.reshape(seqs, tokens // seqs, channels)
    triton = functools.partial(causal_conv1d_triton, interpret=True if args.quick else None)
    xla = functools.partial(causal_conv1d, platform="xla")

    def cases(fn, cfg):
        options = {} if cfg is None else dict(cfg=cfg)
        loss = lambda x: jnp.sum(fn(x, weight, bias, activation="silu", **options).astype(jnp.float32))
        train = jax.grad(loss)
        return {
            "dense silu+bias": (lambda x: fn(x, weight, bias, activation="silu", **options), (dense_x,)),
            "packed + pool": (
                lambda x, pool: fn(x, weight, bias, activation="silu", cu_seqlens=cu, conv_state=pool, **options),
                (x, pool),
            ),
            "dense fwd+bwd": (train, (dense_x,)),
        }

    moved = {"packed + pool": 2 * x.nbytes + 2 * pool.nbytes, "dense fwd+bwd": 4 * x.nbytes}
    calls = {"copy": functools.partial(jax.jit(lambda a: a + 1), x)}
    variants = {"xla": (xla, None), name(None): (triton, config(None))}
    variants |= {name(w): (triton, config(w)) for w in WINDOWS}
    trained = {"xla", name(None), *map(name, TRAIN_WINDOWS)}
    for variant, (fn, cfg) in variants.items():
        for case, (call, inputs) in cases(fn, cfg).items():
            if case == "dense fwd+bwd" and variant not in trained:
                continue
            calls[f"{case} | {variant}"] = functools.partial(jax.jit(call), *inputs)
    timings = time_variants({k: (lambda c=c: c) for k, c in calls.items()}, repeats=args.repeats, where="conv")
    copy_bw = 2 * x.nbytes / timings["copy"]
    print(f"device copy: {copy_bw / 1e12:.3g} TB/s ({1e3 * timings['copy']:.3f} ms for x + 1)")
    expected = {}
    for key, seconds in timings.items():
        if key == "copy":
            continue
        case, variant = key.split(" | ")
        result = jax.tree_util.tree_leaves(calls[key]())
        expected.setdefault(case, calls[f"{case} | xla"]() if f"{case} | xla" in calls else result)
        error = max(rel(a, b) for a, b in zip(result, jax.tree_util.tree_leaves(expected[case]), strict=True))
        fraction = moved.get(case, 2 * x.nbytes) / seconds / copy_bw
        print(f"{case:16s} {variant:26s} {1e3 * seconds:8.3f} ms  {fraction:5.2f} of copy  rel err {error:.1e}")


if __name__ == "__main__":
    main()
