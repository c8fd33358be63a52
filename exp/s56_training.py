"""Session 56: the gated delta rule's forward+backward (issue 42: ≤ 1.2x our GLA) after its forward state pass took
its own default tiling (128 value columns, 8 warps, 3 stages at D 128), beside GLA, and with `fwd_params` setting
both state passes' tiling (the backward pass keeps 32 columns, 4 warps, 2 stages by default) to see whether the
backward's wants the same (call 4: 64 columns, 4 warps, 2 stages 7.30 ms; 128, 8, 3: 8.22; defaults 6.89); call 5:
the defaults beside the tiling before (32 columns, 4 warps, 2 stages for both passes). The bench's training shape
(B 2, S 16384, H 16, D 128, bf16), Triton.

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
        "gdr triton, both passes 32 columns 4 warps 2 stages (before)": gdr(
            FwdParams(block_d=32, num_warps=4, num_stages=2)
        ),
    }
    times = time_fns(calls, repeats=20)
    for name, seconds in times.items():
        print(f"{name:56s} {1e3 * seconds:8.3f} ms  x GLA {seconds / times['gla triton']:.3f}", flush=True)


if __name__ == "__main__":
    main()
