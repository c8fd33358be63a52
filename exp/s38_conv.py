"""Session 38: the Triton sliding-window forward of `causal_conv1d` swept beside the device copy, in one run (issue
44's shape: 16384 tokens x 8192 channels, W 4, bf16, bias, SiLU; dense `[64, 256, C]` and packed on a pool of 64
slots).

Variants: `bt x bc / warps / rows` is the window's run (`block_k`), channels (`block_d`), warps and rows a step;
`evict L/S` patches `eviction_policy="evict_first"` into the window kernel's loads (L) and/or stores (S) at trace
time; `T` takes SiLU through the hardware's approximate tanh (`_parts.silu`'s fast form), its absence the exact form
(what calls 1 and 2 ran; the kernel's default on a GPU is now the fast form, so every variant names its SiLU); `P`
(plain) runs the convolution alone (no bias, no SiLU). The session 37 default is 64 x 1024 / 8 / 8. `--round 2`
(call 2) times `ROUND_2` instead of `TILES` (call 1). Bandwidth = x read + out written (+ the pool's slots), beside
the copy of x's bytes (`_harness.copy_builder`).

    python3 exp/s38_conv.py --out $OUT
"""

import argparse
import functools
import json
import pathlib
import sys

import jax
import jax.numpy as jnp

from ejkernel.benchmarks._harness import copy_builder, time_variants
from ejkernel.kernels._triton.causal_conv1d import _window
from ejkernel.kernels._triton.causal_conv1d._parts import silu
from ejkernel.modules import CausalConv1dConfig, CausalConv1dTritonTiling, causal_conv1d
from ejkernel.ops import FwdParams

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _kit import evicting, patched

T, C, W, N = 16384, 8192, 4, 64
TILES = [  # block_t, block_c, warps, step_rows, evict
    (64, 1024, 8, 8, ""),
    (64, 1024, 4, 8, ""),
    (64, 1024, 4, 16, ""),
    (64, 1024, 8, 16, ""),
    (64, 2048, 8, 8, ""),
    (64, 2048, 8, 16, ""),
    (128, 1024, 4, 16, ""),
    (128, 1024, 8, 16, ""),
    (128, 2048, 8, 16, ""),
    (64, 512, 2, 8, ""),
    (64, 512, 2, 16, ""),
    (64, 512, 4, 16, ""),
    (64, 1024, 8, 8, "L"),
    (64, 1024, 8, 8, "S"),
    (64, 1024, 8, 8, "LS"),
    (64, 1024, 4, 16, "LS"),
    (64, 2048, 8, 16, "LS"),
]
ROUND_2 = [
    (64, 1024, 8, 8, ""),
    (64, 1024, 8, 8, "P"),
    (64, 1024, 8, 8, "T"),
    (64, 1024, 8, 8, "TLS"),
    (64, 512, 4, 16, ""),
    (64, 512, 4, 16, "T"),
    (64, 512, 4, 16, "TLS"),
    (64, 512, 4, 8, "T"),
    (64, 1024, 8, 16, "T"),
    (128, 1024, 8, 16, "TLS"),
    (64, 256, 2, 16, "T"),
    (64, 512, 4, 16, "P"),
]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="out")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--round", type=int, default=1)
    args = p.parse_args()
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 4))
    x = jax.random.normal(next(keys), (T, C), jnp.float32).astype(jnp.bfloat16)
    weight = jax.random.normal(next(keys), (C, W), jnp.float32).astype(jnp.bfloat16)
    bias = jax.random.normal(next(keys), (C,), jnp.float32).astype(jnp.bfloat16)
    pool = jax.random.normal(next(keys), (N, C, W - 1), jnp.float32).astype(jnp.bfloat16)
    cu = jnp.arange(N + 1, dtype=jnp.int32) * (T // N)
    dense_x = x.reshape(N, T // N, C)

    def build(case, tile):
        bt, bc, warps, rows, evict = tile
        cfg = CausalConv1dConfig(
            platform="triton",
            fwd_params=FwdParams(block_k=bt, block_d=bc, num_warps=warps),
            triton_tiling=CausalConv1dTritonTiling(step_rows=rows),
        )
        plain = "P" in evict
        options = dict(activation=None if plain else "silu", platform="triton", cfg=cfg)
        b = None if plain else bias
        if case == "dense":
            call = functools.partial(jax.jit(lambda x: causal_conv1d(x, weight, b, **options)), dense_x)
        else:
            packed = lambda x, pool: causal_conv1d(x, weight, b, cu_seqlens=cu, conv_state=pool, **options)
            call = functools.partial(jax.jit(packed), x, pool)
        exact_or_fast = lambda y, fast: silu(y, "T" in evict)  # (traced, and compiled, now: with the patches in place)
        with patched(_window, plgpu=evicting(evict), silu=exact_or_fast):
            jax.block_until_ready(call())
        return call

    builders = {"copy": copy_builder(x.nbytes)}
    for tile in TILES if args.round == 1 else ROUND_2:
        for case in ("dense", "packed"):
            name = f"{case} {tile[0]}x{tile[1]} / {tile[2]} / {tile[3]}" + (f" {tile[4]}" if tile[4] else "")
            builders[name] = functools.partial(build, case, tile)
    timings = time_variants(builders, repeats=args.repeats, where="conv sweep")
    copy_bw = 2 * x.nbytes / timings.pop("copy")
    print(f"device copy {copy_bw / 1e12:.3f} TB/s")
    rows = []
    for name, s in timings.items():
        moved = 2 * x.nbytes + (2 * pool.nbytes if name.startswith("packed") else 0)
        rows.append(dict(name=name, ms=1e3 * s, TBps=moved / s / 1e12, ratio_to_copy=moved / s / copy_bw))
        print(f"{name:40s} {1e3 * s:.4f} ms  {moved / s / 1e12:.3f} TB/s  {moved / s / copy_bw:.3f} of copy")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "conv_sweep.json").write_text(json.dumps(dict(copy_TBps=copy_bw / 1e12, rows=rows), indent=1))


if __name__ == "__main__":
    main()
