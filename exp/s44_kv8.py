"""Session 44: `ragged_page_attention_v3` decode on int8 and e4m3 caches with per-token-head scales against the bf16
cache (issue 45's shape: batch 64, context 8192, Hq 32, Hkv 8, D 128, page 16), each as a serving loop runs it
(`exp/s29_kvscales.serving_loop`), with the relative error against the bf16 result. `--old-widen` times the Triton
core as it was (int8 codes widened by the hardware's conversion, `astype`) in place of `_kernel.widen`'s float16
bits: run once each way, each in its own process. `--tilings` adds int8 under other tilings (`TILINGS`).

    python3 exp/s44_kv8.py [--old-widen] [--tilings] [--stages] [--narrow]
"""

import functools
import pathlib
import sys

import jax
import jax.numpy as jnp

from ejkernel.benchmarks._harness import time_variants
from ejkernel.kernels._triton.paged_attention import _kernel
from ejkernel.modules import RaggedPageAttentionV3Config
from ejkernel.ops import FwdParams

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from s29_kvscales import args, quantized, serving_loop, step

# `--tilings`: int8 variants `bk<keys a step> st<stages> w<warps> s<splits>` (the 8-bit default is 128, 3, 4, 2)
TILINGS = [("int8", 256, 3, 4, 2), ("int8", 128, 4, 4, 2), ("int8", 128, 3, 8, 2), ("int8", 128, 3, 4, 4),
           ("int8", 64, 4, 4, 4), ("int8", 256, 2, 4, 1)]  # fmt: skip
# `--stages`: each cache at 128 keys a step, 4 warps, 2 splits, with 1, 2 and 3 stages: where the loads of a step are
# issued ahead (software-pipelined), fewer stages cost time; where they are not, the stages change nothing.
STAGES = [(cache, 128, stages, 4, 2) for cache in ("bf16 cache", "int8", "e4m3") for stages in (1, 2, 3)]
# `--narrow`: the 8-bit caches at 64 keys a step (half the registers their converted tiles hold) and at 2 stages
NARROW = [
    (cache, bk, stages, 4, 2) for cache in ("int8", "e4m3") for bk, stages in ((64, 2), (64, 3), (64, 4), (128, 2))
]


def main():
    if "--old-widen" in sys.argv:
        _kernel.widen = lambda codes, dtype: codes.astype(dtype)
    variants = {"bf16 cache": (args[3], None)}
    variants |= {name: quantized(args[3], d) for name, d in (("int8", jnp.int8), ("e4m3", jnp.float8_e4m3fn))}
    run = jax.jit(functools.partial(step, platform="triton"))
    outputs = {name: run(cache, scales, *args[:3], *args[4:])[0] for name, (cache, scales) in variants.items()}
    builders = {name: functools.partial(serving_loop, *v, platform="triton") for name, v in variants.items()}
    tilings = [
        t
        for flag, ts in (("--tilings", TILINGS), ("--stages", STAGES), ("--narrow", NARROW))
        for t in ts
        if flag in sys.argv
    ]
    for cache, bk, stages, warps, splits in tilings:
        cfg = RaggedPageAttentionV3Config(
            fwd_params=FwdParams(block_k=bk, num_stages=stages, num_warps=warps), num_splits=splits
        )
        builders[f"{cache} bk{bk} st{stages} w{warps} s{splits}"] = functools.partial(
            serving_loop, *variants[cache], platform="triton", cfg=cfg
        )
    timings = time_variants(builders, repeats=20, where="v3 8-bit decode")
    base = outputs["bf16 cache"].astype(jnp.float32)
    label = "old widen" if "--old-widen" in sys.argv else "widen"
    for name, seconds in timings.items():
        ratio = timings["bf16 cache"] / seconds
        line = f"{label:9s} {name:22s} {1e3 * seconds:.4f} ms  {ratio:.2f}x bf16"
        if name in outputs:
            error = jnp.linalg.norm(outputs[name].astype(jnp.float32) - base) / jnp.linalg.norm(base)
            line += f"  error {float(error):.2e}"
        print(line)


if __name__ == "__main__":
    main()
