"""Session 58: why the ragged prefill's one pass takes 540 us where the dense one takes 476 on the same tokens (8 x
2048, H 32, D 128, chunk 32; call 1's timelines). Probe: the pass kernel with its loop over a request's chunks bounded
by a constant (64, this case's chunks a request) instead of the count it loads, so Triton sees a static trip count.

    PYTHONPATH=src python exp/s58_ragged_probe.py
"""

from __future__ import annotations

import inspect
import textwrap

import jax
import jax.numpy as jnp
from s57_capped import prefill_case

from ejkernel.benchmarks.linear_attention import PREFILL, _serving_loop
from ejkernel.kernels._triton.ragged_gated_delta_rule import _prefill
from ejkernel.modules import ragged_gated_delta_rule
from ejkernel.ops.autotune import time_fns


def _static_variant(chunks: int):
    source = textwrap.dedent(inspect.getsource(_prefill._pass_kernel)).replace("count_ref[n]", str(chunks))
    space = dict(vars(_prefill))
    exec(compile(source, "<static pass>", "exec"), space)
    return space["_pass_kernel"]


def main() -> None:
    tokens, pool = prefill_case()
    fn = lambda *a: ragged_gated_delta_rule(*a, platform="triton")
    landed = _prefill._pass_kernel
    calls, outs = {}, {}
    for name, kernel in (("loaded count", landed), ("static count", _static_variant(PREFILL[1] // 32))):
        _prefill._pass_kernel = kernel
        calls[name] = _serving_loop(lambda *a: fn(*a), tokens, pool)
        outs[name] = jax.block_until_ready(calls[name]())
    _prefill._pass_kernel = landed
    diff = float(jnp.max(jnp.abs(outs["loaded count"].astype(jnp.float32) - outs["static count"].astype(jnp.float32))))
    print(f"max |difference| {diff:.3g}")
    for name, seconds in time_fns(calls, repeats=20, warmup=2).items():
        print(f"ragged prefill, {name:14s} {1e3 * seconds:8.3f} ms", flush=True)


if __name__ == "__main__":
    main()
