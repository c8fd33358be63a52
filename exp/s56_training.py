"""Session 56: the gated delta rule's forward+backward (issue 42: ≤ 1.2x our GLA) after its forward state pass took
its own default tiling (128 value columns, 8 warps, 3 stages at D 128), beside GLA, and with `fwd_params` setting
both state passes' tiling (the backward pass keeps 32 columns, 4 warps, 2 stages by default) to see whether the
backward's wants the same. The bench's training shape (B 2, S 16384, H 16, D 128, bf16), Triton.

    PYTHONPATH=src python exp/s56_training.py
"""

from __future__ import annotations

from ejkernel.benchmarks.linear_attention import SHAPE, _inputs, _training_step
from ejkernel.modules import GatedDeltaRuleConfig, gated_delta_rule, gla_attention
from ejkernel.ops import FwdParams
from ejkernel.ops.autotune import time_fns


def main() -> None:
    x = _inputs(*SHAPE)
    gdr_args = (x["q"], x["k"], x["v"], x["beta"], x["decay"])

    def gdr(params=None):
        cfg = GatedDeltaRuleConfig(platform="triton", fwd_params=params)
        return _training_step(lambda *a: gated_delta_rule(*a, cfg=cfg), gdr_args)

    calls = {
        "gla triton": _training_step(lambda *a: gla_attention(*a, platform="triton"), (x["q"], x["k"], x["v"], x["g"])),
        "gdr triton (defaults)": gdr(),
        "gdr triton, both passes 64 columns 4 warps 2 stages": gdr(FwdParams(block_d=64, num_warps=4, num_stages=2)),
        "gdr triton, both passes 128 columns 8 warps 3 stages": gdr(FwdParams(block_d=128, num_warps=8, num_stages=3)),
    }
    times = time_fns(calls, repeats=10)
    for name, seconds in times.items():
        print(f"{name:56s} {1e3 * seconds:8.3f} ms  x GLA {seconds / times['gla triton']:.3f}", flush=True)


if __name__ == "__main__":
    main()
