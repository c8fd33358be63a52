"""Session 41: which kernel a forward-only bf16 grouped matmul should take on an H200. `auto` sends forward-only GPU
calls to Triton (`GroupedMatmul.heuristic_cfg`, measured on an H100); in call 6's bench the Mosaic GPU forward was
faster at the MoE shape (0.674 against 0.714 ms). Here both, beside `auto`, at three MoE shapes (M, K, N, groups),
bf16 out. Prepared for the next device call: the session's device time ran out before it ran.

    python exp/s41_gmm_forward_route.py --out $OUT
"""

import argparse
import functools
import json
import pathlib

import jax
import jax.numpy as jnp

from ejkernel.benchmarks.grouped_matmul import random_group_sizes
from ejkernel.modules import grouped_matmul
from ejkernel.ops.autotune import time_fns

SHAPES = ((32768, 4096, 1536, 64), (16384, 7168, 2048, 32), (8192, 2048, 768, 8))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="out")
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args()
    results = {}
    for m, k, n, groups in SHAPES:
        keys = jax.random.split(jax.random.PRNGKey(0), 2)
        lhs = jax.random.normal(keys[0], (m, k), jnp.bfloat16)
        w = (jax.random.normal(keys[1], (groups, k, n), jnp.float32) * k**-0.5).astype(jnp.bfloat16)
        sizes = random_group_sizes(m, groups)
        calls = {
            p: functools.partial(
                jax.jit(functools.partial(grouped_matmul, platform=p, preferred_element_type=jnp.bfloat16)),
                lhs,
                w,
                sizes,
            )
            for p in ("auto", "triton", "pallas")
        }
        times = time_fns(calls, repeats=args.repeats, warmup=2)
        tag = f"{m}x{k}x{n}/{groups}"
        results[tag] = {p: 1e3 * t for p, t in times.items()}
        print(tag, "  ".join(f"{p} {1e3 * t:.3f} ms" for p, t in times.items()), flush=True)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gmm_forward_route.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
