"""Session 38: `ragged_page_attention_v3` decode on an e4m3 cache with per-token-head scales, the Triton core's
tiling swept now that its scale loads go before the first dot (issue 45's shape: batch 64, context 8192, Hq 32,
Hkv 8, D 128, page 16), beside the bf16 cache's default and int8's, in one run; each run as a serving loop runs it
(`exp/s29_kvscales.serving_loop`). Variants `bk<keys a step> st<stages> w<warps> s<splits>`.

    python3 exp/s38_kv8.py
"""

import functools
import pathlib
import sys

import jax.numpy as jnp

from ejkernel.benchmarks._harness import time_variants
from ejkernel.modules import RaggedPageAttentionV3Config
from ejkernel.ops import FwdParams

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from s29_kvscales import args, quantized, serving_loop

TILINGS = [(128, 3, 4, 2), (128, 4, 4, 2), (256, 3, 4, 2), (256, 3, 8, 2), (128, 3, 4, 4), (64, 4, 4, 4),
           (128, 2, 4, 2), (256, 2, 8, 1), (128, 3, 8, 2)]  # fmt: skip


def main():
    e4m3, int8 = quantized(args[3], jnp.float8_e4m3fn), quantized(args[3], jnp.int8)
    builders = {
        "bf16 cache": functools.partial(serving_loop, args[3], None, platform="triton"),
        "int8 default": functools.partial(serving_loop, *int8, platform="triton"),
        "e4m3 default": functools.partial(serving_loop, *e4m3, platform="triton"),
    }
    for bk, stages, warps, splits in TILINGS:
        cfg = RaggedPageAttentionV3Config(
            fwd_params=FwdParams(block_k=bk, num_stages=stages, num_warps=warps), num_splits=splits
        )
        name = f"e4m3 bk{bk} st{stages} w{warps} s{splits}"
        builders[name] = functools.partial(serving_loop, *e4m3, platform="triton", cfg=cfg)
    timings = time_variants(builders, repeats=20, where="v3 8-bit decode")
    for name, seconds in timings.items():
        print(f"{name:28s} {1e3 * seconds:.4f} ms  {timings['bf16 cache'] / seconds:.2f}x bf16")


if __name__ == "__main__":
    main()
