"""Session 58: the dense gated delta rule's Triton path at chunk 32 against 64 (EasyDeL's training config asks for 64)
over shapes from many programs to few, forward (return_state, as a prefill) and forward+backward: whether Triton should
run no chunk above 32 on the dense op too, as on the ragged one (session 57: 8 x 2048 H 32, prefill 0.865 against
1.23 ms; B 2 x 16384 H 16, training 6.28 against 6.77).

With `--segments`, each row packs four sequences (`seg_ids`): the path whose chunk parts stay in XLA around Triton's
state passes (not capped at 32), before Triton's default chunk for the delta rule could become 64.

    PYTHONPATH=src python exp/s58_chunks.py [--train] [--segments]
"""

from __future__ import annotations

import functools
import sys

import jax
import jax.numpy as jnp

from ejkernel.benchmarks.linear_attention import _inputs, _training_step
from ejkernel.modules import GatedDeltaRuleConfig, gated_delta_rule
from ejkernel.ops.autotune import time_fns

FORWARD = ((8, 2048, 32), (4, 4096, 32), (2, 16384, 16), (1, 16384, 16), (1, 4096, 16), (1, 4096, 8))
TRAIN = ((2, 16384, 16), (1, 16384, 16), (1, 4096, 16))


def main() -> None:
    train, segments = "--train" in sys.argv, "--segments" in sys.argv
    for batch, seq, heads in TRAIN if train else FORWARD:
        x = _inputs(batch, seq, heads, 128)
        args = (x["q"], x["k"], x["v"], x["beta"], x["decay"])
        seg = (jnp.broadcast_to(jnp.arange(seq, dtype=jnp.int32) * 4 // seq, (batch, seq)),) if segments else ()
        calls = {}
        for chunk in (32, 64):
            cfg = GatedDeltaRuleConfig(platform="triton", chunk_size=chunk)
            if train:
                calls[chunk] = _training_step(lambda *a, cfg=cfg, seg=seg: gated_delta_rule(*a, *seg, cfg=cfg), args)
            else:
                run = jax.jit(functools.partial(gated_delta_rule, return_state=True, cfg=cfg))
                calls[chunk] = functools.partial(run, *args, *seg)
        times = {c: 1e3 * s for c, s in time_fns(calls, repeats=10, warmup=2).items()}
        mode = ("fwd+bwd" if train else "forward") + (", 4 segments a row" if segments else "")
        print(f"{mode} B {batch} S {seq} H {heads}: chunk 32 {times[32]:.3f} ms, 64 {times[64]:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
