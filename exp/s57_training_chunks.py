"""Session 57: the gated delta rule's forward+backward at chunks 32 (Triton's own) and 64 (upstream's and EasyDeL's),
now that a chunk of 64 runs its WY transform in two kernels (`_delta.split_wy`; the backward's pullback reads the
inverse the first one stores), beside GLA. The bench's training shape (B 2, S 16384, H 16, D 128, bf16), Triton.

    PYTHONPATH=src python exp/s57_training_chunks.py
"""

from __future__ import annotations

from ejkernel.benchmarks.linear_attention import SHAPE, _inputs, _training_step
from ejkernel.modules import GatedDeltaRuleConfig, gated_delta_rule, gla_attention
from ejkernel.ops.autotune import time_fns


def main() -> None:
    x = _inputs(*SHAPE)
    gdr_args = (x["q"], x["k"], x["v"], x["beta"], x["decay"])

    def gdr(chunk):
        cfg = GatedDeltaRuleConfig(platform="triton", chunk_size=chunk)
        return _training_step(lambda *a: gated_delta_rule(*a, cfg=cfg), gdr_args)

    calls = {
        "gla triton": _training_step(lambda *a: gla_attention(*a, platform="triton"), (x["q"], x["k"], x["v"], x["g"])),
        "gdr triton, chunk 32": gdr(32),
        "gdr triton, chunk 64": gdr(64),
    }
    for name, seconds in time_fns(calls, repeats=10, warmup=2).items():
        print(f"{name:28s} {1e3 * seconds:8.3f} ms", flush=True)


if __name__ == "__main__":
    main()
