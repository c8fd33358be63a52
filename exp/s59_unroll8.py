"""Session 59: GLA's state passes at four and eight chunks a loop step (`state_unroll`; four won every row against
one and two in session 59's first sweep, `exp/s58_unroll.py`): GLA forward and forward+backward at the bench's
training shape (B 2, S 16384, H 16, D 128, bf16, per-channel gates), Mamba-2 (`state_space_v2`, B 2, S 16384, H 32,
P 64, N 128, chunk 256, on GLA's kernels of a gate per head) forward and forward+backward.

    PYTHONPATH=src python exp/s59_unroll8.py
"""

from __future__ import annotations

import dataclasses
import functools

import jax

from ejkernel.benchmarks.linear_attention import SHAPE, _inputs, _training_step
from ejkernel.benchmarks.state_space import V2_SHAPE, _jitted, v2_inputs
from ejkernel.kernels._triton.state_space_v2 import _interface as ssd_interface
from ejkernel.modules import (
    GLAttentionConfig,
    GLAttentionTritonTiling,
    StateSpaceV2Config,
    gla_attention,
    state_space_v2,
)
from ejkernel.ops.autotune import time_fns

UNROLLS = (4, 8)


def _ssd(unroll: int, backward: bool):
    """Mamba-2 compiled with its kernels' tiling (`GLA_TILING`, read at trace time) at `unroll`."""
    landed = ssd_interface.GLA_TILING
    ssd_interface.GLA_TILING = dataclasses.replace(landed, state_unroll=unroll)
    try:
        cfg = StateSpaceV2Config(platform="triton", chunk_size=V2_SHAPE["chunk"])
        call = _jitted(
            functools.partial(state_space_v2, n_groups=V2_SHAPE["groups"], cfg=cfg), v2_inputs(**V2_SHAPE), backward
        )
        jax.block_until_ready(call())
        return call
    finally:
        ssd_interface.GLA_TILING = landed


def main() -> None:
    x = _inputs(*SHAPE)
    args = (x["q"], x["k"], x["v"], x["g"])
    gla = lambda u: (
        lambda *a: gla_attention(
            *a, cfg=GLAttentionConfig(platform="triton", triton_tiling=GLAttentionTritonTiling(state_unroll=u))
        )
    )
    rows = {
        "GLA forward": {u: functools.partial(jax.jit(gla(u)), *args) for u in UNROLLS},
        "GLA forward+backward": {u: _training_step(gla(u), args) for u in UNROLLS},
        "Mamba-2 forward": {u: _ssd(u, False) for u in UNROLLS},
        "Mamba-2 forward+backward": {u: _ssd(u, True) for u in UNROLLS},
    }
    for title, calls in rows.items():
        times = time_fns(calls, repeats=10, warmup=2)
        print(title + ": " + ", ".join(f"unroll {u} {1e3 * s:.3f} ms" for u, s in times.items()), flush=True)


if __name__ == "__main__":
    main()
