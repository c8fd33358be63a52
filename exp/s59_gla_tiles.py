"""Prepared in session 59: GLA's sequential state passes on other state tiles. At the bench's training shape (B 2,
S 16384, H 16, D 128) the 64 x 64 state tile gives 128 programs (B x H x 2 x 2) for 132 SMs, each walking 512 chunks
of 32; the pass is latency-bound (session 57: forward states 713 us, fla's at chunk 64 369). A narrower tile doubles
the programs; a wider one halves the entry-state stores' count. Forward and forward+backward (the backward's state
pass reads the same `state_k`, `state_v`, `state_warps`), each row timed together.

    PYTHONPATH=src python exp/s59_gla_tiles.py
"""

from __future__ import annotations

import functools

import jax

from ejkernel.benchmarks.linear_attention import SHAPE, _inputs, _training_step
from ejkernel.modules import GLAttentionConfig, GLAttentionTritonTiling, gla_attention
from ejkernel.ops.autotune import time_fns

TILES = {
    "64 x 64, 4 warps (default)": {},
    "64 x 32": dict(state_v=32),
    "32 x 64": dict(state_k=32),
    "32 x 32": dict(state_k=32, state_v=32),
    "64 x 128": dict(state_v=128),
    "128 x 64": dict(state_k=128),
    "64 x 64, 2 warps": dict(state_warps=2),
    "64 x 64, 8 warps": dict(state_warps=8),
}


def _gla(fields: dict):
    cfg = GLAttentionConfig(platform="triton", triton_tiling=GLAttentionTritonTiling(**fields))
    return lambda *a: gla_attention(*a, cfg=cfg)


def _compiled(call):
    """`call` after one run, or None where it does not compile or run (a tile past shared memory or registers), so one
    variant's failure leaves the row's others timed."""
    try:
        jax.block_until_ready(call())
        return call
    except jax.errors.JaxRuntimeError as err:
        print(f"  failed: {str(err).splitlines()[0][:120]}", flush=True)
        return None


def main() -> None:
    x = _inputs(*SHAPE)
    args = (x["q"], x["k"], x["v"], x["g"])
    for mode, build in (
        ("forward", lambda f: functools.partial(jax.jit(_gla(f)), *args)),
        ("forward+backward", lambda f: _training_step(_gla(f), args)),
    ):
        calls = {name: _compiled(build(f)) for name, f in TILES.items()}
        times = time_fns({name: c for name, c in calls.items() if c is not None}, repeats=10, warmup=2)
        print(f"GLA {mode}: " + ", ".join(f"{name} {1e3 * s:.3f} ms" for name, s in times.items()), flush=True)


if __name__ == "__main__":
    main()
