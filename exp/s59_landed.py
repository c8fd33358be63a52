"""Session 59: what landed this session, timed together on one GPU: GLA (state passes at four chunks a loop step) at
chunk 32 and 64, forward and forward+backward, at the bench's training shape (B 2, S 16384, H 16, D 128, bf16,
per-channel gates); the gated delta rule (default chunk 64, run as 32 when differentiated or in one pass) forward+
backward there and its forward at 256, 128 and 64 (batch row, head) programs (the one pass now from 64); Mamba-2
(`state_space_v2`, B 2, S 16384, H 32, P 64, N 128, chunk 256), forward and forward+backward.

    PYTHONPATH=src python exp/s59_landed.py
"""

from __future__ import annotations

import functools

import jax

from ejkernel.benchmarks.linear_attention import SHAPE, _inputs, _training_step
from ejkernel.benchmarks.state_space import V2_SHAPE, _jitted, v2_inputs
from ejkernel.modules import GLAttentionConfig, StateSpaceV2Config, gated_delta_rule, gla_attention, state_space_v2
from ejkernel.ops.autotune import time_fns

PREFILLS = ((8, 2048, 32), (4, 4096, 32), (2, 8192, 32))  # 256, 128, 64 rows


def main() -> None:
    x = _inputs(*SHAPE)
    gla_args = (x["q"], x["k"], x["v"], x["g"])
    gla = lambda chunk: lambda *a: gla_attention(*a, cfg=GLAttentionConfig(platform="triton", chunk_size=chunk))
    gdr = lambda *a: gated_delta_rule(*a, platform="triton")
    gdr_args = lambda y: (y["q"], y["k"], y["v"], y["beta"], y["decay"])
    calls = {
        "GLA forward, chunk 32": functools.partial(jax.jit(gla(32)), *gla_args),
        "GLA forward, chunk 64": functools.partial(jax.jit(gla(64)), *gla_args),
        "GLA forward+backward, chunk 32": _training_step(gla(32), gla_args),
        "GDR forward+backward": _training_step(gdr, gdr_args(x)),
    }
    for batch, seq, heads in PREFILLS:
        calls[f"GDR forward {batch} x {seq} H {heads}"] = functools.partial(
            jax.jit(gdr), *gdr_args(_inputs(batch, seq, heads, 128))
        )
    ssd = functools.partial(
        state_space_v2,
        n_groups=V2_SHAPE["groups"],
        cfg=StateSpaceV2Config(platform="triton", chunk_size=V2_SHAPE["chunk"]),
    )
    for backward, mode in ((False, "forward"), (True, "forward+backward")):
        calls[f"Mamba-2 {mode}"] = _jitted(ssd, v2_inputs(**V2_SHAPE), backward)
    for name, seconds in time_fns(calls, repeats=10, warmup=2).items():
        print(f"{name:36s} {1e3 * seconds:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
