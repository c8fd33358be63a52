"""Session 56: the gated delta rule's undifferentiated forward with its outputs made inside the state pass. The landed
forward stores every chunk's entry state (`e`, `[B, NC, H, Dk, Dv]`: 537 MB in bf16 at 8 x 2048 tokens, H 32, D 128,
chunk 32) and its values U for the output kernel to read back; the variant makes each chunk's outputs
`scale ((q ⊙ e^g) h + (q kᵀ ⊙ D) U)` where h and U already sit in registers, so neither goes to memory. The
recurrence's own steps do not wait on the outputs' products. Each variant's outputs and final states against the
landed forward's (`_delta._delta_states` then `chunk_outputs` with the scores made in the output kernel), then times.
`exp/s56_delta_outputs.patch` (on branch `s56-ragged-inplace`) puts the fused pass into `_delta` for undifferentiated
calls, should it win.

    PYTHONPATH=src python exp/s56_fused_pass.py [--check]   # --check: interpret mode, small shapes, on a CPU
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from _kit import check_or_bench, log, rel
from jax import lax
from jax.experimental import pallas as pl

from ejkernel.kernels._common.vma import out_struct
from ejkernel.kernels._triton._helpers import dot
from ejkernel.kernels._triton.linear_attention import _delta
from ejkernel.kernels._triton.linear_attention._gla_common import (
    F32,
    TritonGlaTiling,
    call_pallas,
    pair_decays,
    tile_slice,
)
from ejkernel.kernels._triton.linear_attention._gla_forward import chunk_outputs, cumulative_gates
from ejkernel.kernels._triton.linear_attention._state_passes import TritonStatePassTiling
from ejkernel.ops.autotune import time_fns


def fused_kernel(q_ref, k_ref, w_ref, u_ref, g_ref, g_row_ref, init_ref, o_ref, final_ref, *, chunk, mm, bv, scale):
    """Per chunk from its entry state h: `U = u − w h`; the outputs `scale ((q ⊙ e^g) h + (q kᵀ ⊙ D) U)`; then
    `h ← e^{g_C} h + (k ⊙ e^{g_C − g})ᵀ U`. h and U enter the outputs' products rounded as the landed forward
    stores them (h in k's dtype, U in u's)."""
    b, head, vt = (pl.program_id(i) for i in range(3))
    cols = tile_slice(vt, bv)

    def step(c, h):
        first = pl.multiple_of(c * chunk, chunk)
        rows = pl.ds(first, chunk)
        g, g_last = _delta._chunk_gates(g_ref, b, head, first, chunk)
        keys = k_ref[b, rows, head, :]
        values = u_ref[b, rows, head, cols].astype(F32) - dot(w_ref[b, rows, head, :].astype(mm), h.astype(mm))
        stored = values.astype(u_ref.dtype).astype(mm)
        q = q_ref[b, rows, head, :]
        scores = dot(q.astype(mm), keys.astype(mm), trans_b=True) * pair_decays(g, g_row_ref[b, head, rows][None, :])
        decayed = (q.astype(F32) * jnp.exp(g)).astype(mm)
        entry = h.astype(k_ref.dtype).astype(mm)
        out = scale * (dot(decayed, entry) + dot(scores.astype(mm), stored))
        o_ref[b, rows, head, cols] = out.astype(o_ref.dtype)
        k = (keys.astype(F32) * jnp.exp(g_last[None, :] - g)).astype(mm)
        return jnp.exp(g_last) * h + dot(k, values.astype(u_ref.dtype).astype(mm), trans_a=True)

    final_ref[b, head, :, cols] = lax.fori_loop(0, q_ref.shape[1] // chunk, step, init_ref[b, head, :, cols])


def fused(t, passes, chunk, scale, q, k, w, u, g, init):
    batch, _, heads, _ = k.shape
    dv = u.shape[-1]
    bv = min(passes.block_v, dv)
    args = (q, k, w, u, g, jnp.swapaxes(g[..., 0], 1, 2), init)
    outs = [out_struct(u.shape, u.dtype, *args), out_struct(init.shape, F32, *args)]
    static = dict(chunk=chunk, mm=t.mm(k.dtype), bv=bv, scale=scale)
    tiling = dataclasses.replace(t, num_stages=passes.num_stages)
    grid = (batch, heads, dv // bv)
    return call_pallas(fused_kernel, tiling, passes.num_warps, grid, None, None, outs, "s56_fused", **static)(*args)


def landed(t, passes, chunk, scale, q, k, w, u, g, init):
    e, values, final = _delta._delta_states(t, passes, chunk, k, w, u, g, init)
    return chunk_outputs(t, chunk, scale, q, values, g, e, k=k), final


def inputs(batch, seq, heads, dim, chunk, dtype, interpret):
    """q, k normalised, the WY transform's u and w of real inputs (so the recurrence stays bounded)."""
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 6))
    x = lambda *shape: jax.random.normal(next(keys), shape, jnp.float32)
    q, k = (x(batch, seq, heads, dim) for _ in range(2))
    q, k = ((y / jnp.linalg.norm(y, axis=-1, keepdims=True)).astype(dtype) for y in (q, k))
    v = x(batch, seq, heads, dim).astype(dtype)
    beta, a = jax.nn.sigmoid(x(batch, seq, heads)), -0.05 * jax.nn.softplus(x(batch, seq, heads))
    t = TritonGlaTiling(interpret=interpret, precise=dtype == jnp.float32).fit(dim, dim)
    u, w = _delta._wy_triton(t, chunk, k, v, beta, a)
    return t, (q, k, w, u, cumulative_gates(t, chunk, a[..., None]), x(batch, heads, dim, dim))


def run(shape, dtype, chunks, variants, interpret: bool, repeats: int):
    for chunk in chunks:
        t, args = inputs(*shape, chunk, dtype, interpret)
        calls, outputs = {}, {}
        for name, (fn, (bv, warps, stages)) in variants.items():
            passes = TritonStatePassTiling(bv, warps, stages, interpret, precise=dtype == jnp.float32)
            try:
                call = functools.partial(fn, t, passes, chunk, shape[-1] ** -0.5)
                compiled = jax.jit(call).lower(*args).compile()
                outputs[name] = jax.block_until_ready(compiled(*args))
            except Exception as err:
                log(f"chunk {chunk} {name}: failed: {str(err).splitlines()[0][:160]}")
                continue
            calls[name] = functools.partial(compiled, *args)
        first = next(iter(outputs.values()))
        times = time_fns(calls, repeats=repeats, warmup=2) if repeats else {}
        for name, out in outputs.items():
            errs = " ".join(f"{rel(o.astype(F32), f.astype(F32)):.1e}" for o, f in zip(out, first, strict=True))
            ms = f"{1e3 * times[name]:8.4f} ms" if name in times else ""
            print(f"chunk {chunk} {name:40s} {ms}  (out, final) against the first: {errs}", flush=True)


def variants(tilings):
    landed_row = {"landed (states, then outputs)": (landed, (None, None, None))}
    return landed_row | {f"fused, {bv} columns {w} warps {s} stages": (fused, (bv, w, s)) for bv, w, s in tilings}


def check():
    with jax.default_device(jax.devices("cpu")[0]):
        for dtype in (jnp.float32, jnp.bfloat16):
            run((1, 64, 2, 32), dtype, (16, 32), variants([(16, 4, 2)]), interpret=True, repeats=0)


def bench(repeats):
    """The serving bench's prefill shape (256 rows x heads: 128 columns a program by default), then one long
    sequence (32 rows x heads: 32 columns), where the outputs' products lengthen the few programs' sequential steps
    and the landed output kernel runs wide."""
    tilings = [(128, 8, 3), (128, 8, 2), (128, 4, 2), (64, 4, 2), (64, 8, 3)]
    run((8, 2048, 32, 128), jnp.bfloat16, (32, 64), variants(tilings), interpret=False, repeats=repeats)
    run((1, 16384, 32, 128), jnp.bfloat16, (32,), variants([(32, 4, 2), (64, 4, 2)]), interpret=False, repeats=repeats)


if __name__ == "__main__":
    check_or_bench(__doc__, check, bench)
