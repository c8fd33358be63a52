"""Ragged gated delta rule prefill beside `gated_delta_rule` on the same tokens (issue 44: at most 1.2x).

    PYTHONPATH=src python exp/s30_gdr_prefill.py              # on a GPU, about 3 minutes with compilation
    PYTHONPATH=src python exp/s30_gdr_prefill.py --cpu-smoke  # tiny shapes, Pallas interpret mode, on a CPU

The bench's case: 8 requests of 2048 tokens, H 32, Dk = Dv = 128, bf16 tokens, a float32 pool of 8 slots
(request r on slot r). The ragged op runs as a serving loop does (under `jit`, the pool donated and fed back);
`gated_delta_rule` (Triton, forward only) takes the same tokens as a dense [8, 2048] batch from the same states
and returns its final states, as `ejkernel bench linear_attention --part serving` times it.

1. check: the ragged op's outputs and new pool against the dense call's outputs and final states
   (`rel` = ‖x − ref‖ / ‖ref‖, `max` = max |x − ref| / max |ref|).
2. time: the ragged op and the dense call, each at chunk 64 (the ragged op's default) and 32, with their ratio
   to the dense call at chunk 32 (`gated_delta_rule`'s Triton default, the bench's baseline).
3. parts: the prologue alone, the ragged pack kernel (`pack_chunks`: the chunk layout, q and k normalised, the
   gates summed) against the dense path's L2 norm of q and k (XLA).

On an H200 (s30): dense C32 2.207 ms; ragged C64 2.014 ms (x0.91). The routes the ragged prefill replaced, each
timed alone at C64 and since removed: no decode `lax.cond` 2.004 ms, XLA's gathers into the chunk layout 2.354,
XLA's gathers of the outputs 2.107, XLA's transposes around the WY transform 2.306, u rounded to bf16 by XLA
before the state pass 1.934 (4% faster; u kept in float32 as the WY transform leaves it, slightly closer to the
reference), all of them together 2.571.
"""

from __future__ import annotations

import argparse
import functools
import sys

import jax
import jax.numpy as jnp
from _kit import elapsed, errors, log, start_watchdog

from ejkernel.kernels._common.linear_attention.inputs import l2_normalize
from ejkernel.kernels._common.linear_attention.ragged import requests
from ejkernel.kernels._triton.linear_attention import gated_delta_rule_triton
from ejkernel.kernels._triton.linear_attention._gla_common import TritonGlaTiling
from ejkernel.kernels._triton.ragged_gated_delta_rule import ragged_gated_delta_rule_triton
from ejkernel.kernels._triton.ragged_gated_delta_rule._prefill import chunk_table, pack_chunks
from ejkernel.modules import GatedDeltaRuleConfig, RaggedGatedDeltaRuleConfig
from ejkernel.ops.autotune import time_fns


def make_inputs(requests_, length, heads, dim):
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 8))
    x = lambda *shape: jax.random.normal(next(keys), shape, jnp.float32)
    q, k, v = (x(requests_, length, heads, dim).astype(jnp.bfloat16) for _ in range(3))
    beta = jax.nn.sigmoid(x(requests_, length, heads))
    decay = -0.05 * jax.nn.softplus(x(requests_, length, heads))
    pool = x(requests_, heads, dim, dim)
    return (q, k, v, beta, decay), pool


def ragged_loop(chunk, interpret, flat, bounds, slots, pool):
    """A zero-argument call of the ragged op under `jit`, the pool donated and fed back; returns (out, pool)."""
    fn = functools.partial(
        ragged_gated_delta_rule_triton,
        cfg=RaggedGatedDeltaRuleConfig(chunk_size=chunk),
        interpret=interpret,
    )
    step = jax.jit(lambda pool, *rest: fn(*rest[:5], pool, *rest[5:]), donate_argnums=0)
    state = {"pool": jnp.copy(pool)}

    def call():
        out, state["pool"] = step(state["pool"], *flat, bounds, slots)
        return out, state["pool"]

    return call


def dense_call(chunk, interpret, dense, pool):
    fn = functools.partial(
        gated_delta_rule_triton, return_state=True, cfg=GatedDeltaRuleConfig(chunk_size=chunk), interpret=interpret
    )
    return functools.partial(jax.jit(lambda *a: fn(*a[:5], None, a[5])), *dense, pool)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu-smoke", action="store_true", help="tiny shapes in Pallas interpret mode")
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args()
    start_watchdog(300)
    smoke = args.cpu_smoke
    num, length, heads, dim = (2, 48, 2, 32) if smoke else (8, 2048, 32, 128)
    chunks = (16,) if smoke else (64, 32)
    dense, pool = make_inputs(num, length, heads, dim)
    flat = tuple(x.reshape(num * length, *x.shape[2:]) for x in dense)
    bounds = jnp.arange(0, num * length + 1, length, dtype=jnp.int32)
    slots = jnp.arange(num, dtype=jnp.int32)
    log(f"prefill {num}x{length} H={heads} D={dim} bf16, float32 pool of {num} slots; chunks {chunks}")

    calls = {}
    for chunk in chunks:
        calls[f"dense C{chunk}"] = dense_call(chunk, smoke, dense, pool)
        calls[f"ragged C{chunk}"] = ragged_loop(chunk, smoke, flat, bounds, slots, pool)
    baseline = f"dense C{32 if not smoke else chunks[0]}"

    log("== check: ragged against dense (first call: the pool as made)")
    ref_out, ref_state = jax.block_until_ready(calls[baseline]())
    ref_out = ref_out.reshape(flat[2].shape).astype(jnp.float32)
    for name, call in list(calls.items()):
        try:
            out, state = jax.block_until_ready(call())
        except Exception as err:
            log(f"{name}: FAILED {type(err).__name__}: {str(err)[:300]}")
            del calls[name]
            continue
        out = out.reshape(ref_out.shape).astype(jnp.float32)
        o, s = errors(out, ref_out), errors(state, ref_state)
        log(
            f"{name:26s} out rel {o[0]:.2e} max {o[1]:.2e}  state rel {s[0]:.2e} max {s[1]:.2e}  finite {o[2] and s[2]}"
        )

    log("== time (median ms; ratio to the dense call at chunk 32, the bench's baseline)")
    timings = time_fns(calls, repeats=3 if smoke else args.repeats, warmup=1 if smoke else 3)
    for name, seconds in timings.items():
        ratio = seconds / timings[baseline] if baseline in timings else float("nan")
        print(f"RESULT {name:26s} {1e3 * seconds:8.3f} ms  x{ratio:.3f} of {baseline}", flush=True)

    log("== parts: the prologue alone (q, k, v, beta, decay into what the chunk kernels read)")
    for chunk in chunks:
        req = requests(bounds, slots, flat[0].shape[0], num)
        table = chunk_table(req, flat[0].shape[0], chunk)
        tiling = TritonGlaTiling(interpret=smoke, precise=False)
        pack = jax.jit(functools.partial(pack_chunks, tiling, chunk, True))
        parts = {
            f"pack kernel C{chunk}": functools.partial(pack, flat, table),
            "dense l2norm q, k": functools.partial(
                jax.jit(lambda q, k: tuple(l2_normalize(x).astype(jnp.bfloat16) for x in (q, k))), *dense[:2]
            ),
        }
        for name, seconds in time_fns(parts, repeats=3 if smoke else args.repeats, warmup=1).items():
            print(f"PART {name:26s} {1e3 * seconds:8.3f} ms", flush=True)
    log(f"done in {elapsed():.0f}s")


if __name__ == "__main__":
    sys.exit(main())
