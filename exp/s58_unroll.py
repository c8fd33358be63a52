"""Session 58 (prepared; branch `s58-state-unroll`): the sequential state passes taking 1, 2 or 4 chunks a loop step
(`TritonGlaTiling.state_unroll`; Pallas-Triton's loops take no `unroll`, so `chunk_loop` writes the steps out). GLA's
passes run 512 chunks of 32 a row at the training shape (forward states 713 us, backward state grads 1.08 ms of
5.63 ms in session 57), each step a small product, so a longer body may let the pipeliner issue more loads ahead.

GLA forward and forward+backward at the bench's training shape (B 2, S 16384, H 16, D 128, bf16, per-channel gates),
the gated delta rule's forward+backward there and its prefill (8 x 2048, H 32), and Mamba-2 (`state_space_v2`, the
bench's B 2, S 16384, H 32, P 64, N 128, chunk 256; on GLA's kernels of a gate per head; issue 42's forward target
is 0.6x mamba's), each at unroll 1, 2, 4, timed together per row.

    PYTHONPATH=src python exp/s58_unroll.py

Run in session 59 at `c3796d7`; the delta rule's passes no longer read `state_unroll` (its rows lost), so its rows
now time one tiling three times.
"""

from __future__ import annotations

import dataclasses
import functools

import jax

from ejkernel.benchmarks.linear_attention import PREFILL, SHAPE, _inputs, _training_step
from ejkernel.benchmarks.state_space import V2_SHAPE, _jitted, v2_inputs
from ejkernel.kernels._triton.linear_attention import _interface
from ejkernel.kernels._triton.linear_attention._gla import TritonGlaTiling
from ejkernel.kernels._triton.state_space_v2 import _interface as ssd_interface
from ejkernel.modules import (
    GLAttentionConfig,
    GLAttentionTritonTiling,
    StateSpaceV2Config,
    gated_delta_rule,
    gla_attention,
    state_space_v2,
)
from ejkernel.ops.autotune import time_fns

UNROLLS = (1, 2, 4)


def _gdr_variant(unroll: int, build):
    """`build()`'s call compiled with Triton's delta-rule tiling at `unroll` (the engine reads `TritonGlaTiling`
    when it is built, at trace time)."""
    landed = _interface.TritonGlaTiling
    _interface.TritonGlaTiling = functools.partial(TritonGlaTiling, state_unroll=unroll)
    try:
        call = build()
        jax.block_until_ready(call())
        return call
    finally:
        _interface.TritonGlaTiling = landed


def _ssd_variant(unroll: int, backward: bool):
    """Mamba-2's forward (or its gradients) compiled with its kernels' tiling (`GLA_TILING`, read at trace time) at
    `unroll`."""
    landed = ssd_interface.GLA_TILING
    ssd_interface.GLA_TILING = dataclasses.replace(landed, state_unroll=unroll)
    try:
        cfg = StateSpaceV2Config(platform="triton", chunk_size=V2_SHAPE["chunk"])
        fn = functools.partial(state_space_v2, n_groups=V2_SHAPE["groups"], cfg=cfg)
        call = _jitted(fn, v2_inputs(**V2_SHAPE), backward)
        jax.block_until_ready(call())
        return call
    finally:
        ssd_interface.GLA_TILING = landed


def _compiled(build, *args):
    """`build(*args)`, or None where it does not compile or run (say, shared memory exceeded), so one variant's failure
    leaves the row's others timed."""
    try:
        return build(*args)
    except jax.errors.JaxRuntimeError as err:
        print(f"  {args}: {str(err).splitlines()[0][:120]}", flush=True)
        return None


def _report(title: str, calls: dict) -> None:
    times = time_fns({u: c for u, c in calls.items() if c is not None}, repeats=10, warmup=2)
    print(title + ": " + ", ".join(f"unroll {u} {1e3 * s:.3f} ms" for u, s in times.items()), flush=True)


def main() -> None:
    x = _inputs(*SHAPE)
    gla_args = (x["q"], x["k"], x["v"], x["g"])

    def gla(unroll):
        cfg = GLAttentionConfig(platform="triton", triton_tiling=GLAttentionTritonTiling(state_unroll=unroll))
        return lambda *a: gla_attention(*a, cfg=cfg)

    _report("GLA forward", {u: functools.partial(jax.jit(gla(u)), *gla_args) for u in UNROLLS})
    _report("GLA forward+backward", {u: _training_step(gla(u), gla_args) for u in UNROLLS})
    gdr_args = (x["q"], x["k"], x["v"], x["beta"], x["decay"])
    gdr = lambda *a: gated_delta_rule(*a, platform="triton")
    _report(
        "GDR forward+backward",
        {u: _compiled(_gdr_variant, u, lambda: _training_step(lambda *a: gdr(*a), gdr_args)) for u in UNROLLS},
    )
    p = _inputs(*PREFILL)
    prefill_args = (p["q"], p["k"], p["v"], p["beta"], p["decay"])
    prefill = lambda: functools.partial(jax.jit(lambda *a: gated_delta_rule(*a, platform="triton")), *prefill_args)
    _report("GDR prefill 8 x 2048 H 32", {u: _compiled(_gdr_variant, u, prefill) for u in UNROLLS})
    for backward, mode in ((False, "forward"), (True, "forward+backward")):
        _report(f"Mamba-2 {mode}", {u: _compiled(_ssd_variant, u, backward) for u in UNROLLS})


if __name__ == "__main__":
    main()
