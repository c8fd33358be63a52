"""Session 58 (prepared): where the dense gated delta rule's undifferentiated forward should make its outputs in the
state pass. `_delta.one_pass_outputs` allows it only from 256 (batch row, head) programs at 128 value columns: at 256
rows it won (8 x 2048, H 32: 0.855 ms against 1.23 at chunk 64), at 32 rows it lost (one 16384-token sequence: 2.18
against 1.15), and between them nothing was timed, though 4 x 4096 H 32 (the same tokens as 8 x 2048 at 128 rows)
takes 1.23 ms on the two kernels.

Forward (return_state) on Triton, per shape: the landed path at chunk 32 and at 64 (two kernels), and the one pass
forced at chunk 32 on the pass's default tile for its rows and on 128 columns, 8 warps, 3 stages.

    PYTHONPATH=src python exp/s58_one_pass_rows.py
"""

from __future__ import annotations

import functools

import jax

from ejkernel.benchmarks.linear_attention import _inputs
from ejkernel.kernels._triton.linear_attention import _delta
from ejkernel.modules import GatedDeltaRuleConfig, gated_delta_rule
from ejkernel.ops import FwdParams
from ejkernel.ops.autotune import time_fns

SHAPES = ((4, 4096, 32), (8, 4096, 16), (2, 8192, 32), (4, 8192, 16), (2, 16384, 16))  # 128, 128, 64, 64, 32 rows
WIDE = FwdParams(block_d=128, num_warps=8, num_stages=3)


def _compiled(args, cfg, one_pass: bool | None):
    """The forward compiled under `cfg`, with `one_pass_outputs` forced where `one_pass` is set (read at trace
    time)."""
    landed = _delta.one_pass_outputs
    if one_pass is not None:
        _delta.one_pass_outputs = lambda *_: one_pass
    try:
        call = functools.partial(jax.jit(functools.partial(gated_delta_rule, return_state=True, cfg=cfg)), *args)
        jax.block_until_ready(call())
        return call
    finally:
        _delta.one_pass_outputs = landed


def main() -> None:
    for batch, seq, heads in SHAPES:
        x = _inputs(batch, seq, heads, 128)
        args = (x["q"], x["k"], x["v"], x["beta"], x["decay"])
        config = lambda chunk, **more: GatedDeltaRuleConfig(platform="triton", chunk_size=chunk, **more)
        calls = {
            "landed 32": _compiled(args, config(32), None),
            "landed 64": _compiled(args, config(64), None),
            "one pass": _compiled(args, config(32), True),
            "one pass, 128 columns": _compiled(args, config(32, fwd_params=WIDE), True),
        }
        times = time_fns(calls, repeats=10, warmup=2)
        shown = ", ".join(f"{name} {1e3 * s:.3f}" for name, s in times.items())
        print(f"B {batch} S {seq} H {heads} ({batch * heads} rows), ms: {shown}", flush=True)


if __name__ == "__main__":
    main()
