"""Session 58 (prepared): GLA on Triton at chunks 16, 32 and 64, forward and forward+backward, at the bench's training
shape (B 2, S 16384, H 16, D 128, bf16, per-channel gates). Triton's default (32) rests on an H100 measurement from
before the kernels' later rewrites (6.0 ms at 32, 10.1 at 64, 6.7 at 16); fla's `chunk_gla` runs 64 (256 state
steps a row, half our entry states in memory) and its forward is 1.49 ms against our 1.67.

    PYTHONPATH=src python exp/s58_gla_chunks.py
"""

from __future__ import annotations

import functools

import jax

from ejkernel.benchmarks.linear_attention import SHAPE, _inputs, _training_step
from ejkernel.modules import GLAttentionConfig, gla_attention
from ejkernel.ops.autotune import time_fns

CHUNKS = (16, 32, 64)


def main() -> None:
    x = _inputs(*SHAPE)
    args = (x["q"], x["k"], x["v"], x["g"])
    gla = lambda chunk: lambda *a: gla_attention(*a, cfg=GLAttentionConfig(platform="triton", chunk_size=chunk))
    for mode, build in (
        ("forward", lambda c: functools.partial(jax.jit(gla(c)), *args)),
        ("forward+backward", lambda c: _training_step(gla(c), args)),
    ):
        times = time_fns({c: build(c) for c in CHUNKS}, repeats=10, warmup=2)
        print(f"GLA {mode}: " + ", ".join(f"chunk {c} {1e3 * s:.3f} ms" for c, s in times.items()), flush=True)


if __name__ == "__main__":
    main()
