"""Session 56: the ragged gated delta rule's prefill with its outputs made inside the state pass (as
`s56_fused_pass.py` does for the dense forward), on branch `s56-ragged-inplace` (its kernels read q, k and v where
they sit). The landed prefill's state pass writes every chunk's entry state and U for its output kernel to read back
(0.52 + 0.38 ms of 1.37 at 8 x 2048 tokens, H 32, D 128 on an H200); the variant stores each chunk's outputs at its
tokens from the state pass itself. Both through `ragged_gated_delta_rule_triton` (the variant patched in as
`_interface.packed_delta`, compiled ahead inside the patch), outputs and new pool against the landed call's, then
timed on the serving bench's prefill (8 requests x 2048 tokens), a mixed batch and one long sequence.
`exp/s56_ragged_pass.patch` puts the fused pass into `_prefill` in place of the state pass and output kernel
(interpret tests and CUDA lowering pass with it), should it win.

    PYTHONPATH=src python exp/s56_fused_ragged.py [--check]   # --check: interpret mode, small shapes, on a CPU
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from _kit import check_or_bench, log, patched, rel
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from ejkernel.kernels._common.vma import out_struct
from ejkernel.kernels._triton._helpers import dot
from ejkernel.kernels._triton.linear_attention._delta import forward_pass_defaults
from ejkernel.kernels._triton.linear_attention._gla_common import F32, call_pallas, iota, pair_decays, tile_slice
from ejkernel.kernels._triton.ragged_gated_delta_rule import _interface, _prefill
from ejkernel.kernels._triton.ragged_gated_delta_rule._interface import ragged_gated_delta_rule_triton
from ejkernel.modules import RaggedGatedDeltaRuleConfig
from ejkernel.ops.autotune import time_fns


def fused_kernel(*refs, **s):
    """`_prefill._states_kernel` that also stores each chunk's outputs `(q ⊙ e^g) h + (q kᵀ ⊙ D) U` (q scaled) at its
    tokens, from h and U as the landed output kernel reads them back (h in the state dtype, U in w's)."""
    first_ref, count_ref, slot_ref, start_ref, rows_ref, lo_ref, hi_ref, q_ref, k_ref, w_ref, u_ref = refs[:11]
    g_ref, g_row_ref, pool_ref, o_ref, final_ref = refs[11:]
    chunk, mm, bv, l2norm = s["chunk"], s["mm"], s["block_v"], s["l2norm"]
    n, head, tile = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    cols = tile_slice(tile, bv)
    first = first_ref[n]
    one = pl.ds(0, 1)

    def step(i, h):
        c = first + i
        at = pl.multiple_of(c * chunk, chunk)
        rows = pl.ds(at, chunk)
        g, g_last = g_ref[0, rows, head, one], g_ref[0, at + chunk - 1, head, one]
        values = u_ref[c, 0, head, :, cols].astype(F32) - dot(w_ref[c, 0, head, :, :].astype(mm), h.astype(mm))
        start, keep = start_ref[c], _prefill._live(lo_ref, hi_ref, c, 0, chunk)
        keys = _prefill._normalised_rows(k_ref, start, keep, head, l2norm, w_ref.dtype)
        q = _prefill._normalised_rows(q_ref, start, keep, head, l2norm, w_ref.dtype, s["scale"])
        scores = dot(q.astype(mm), keys.astype(mm), trans_b=True) * pair_decays(g, g_row_ref[0, head, rows][None, :])
        decayed = (q.astype(F32) * jnp.exp(g)).astype(mm)
        entry = h.astype(s["state_dtype"]).astype(mm)
        out = dot(decayed, entry) + dot(scores.astype(mm), values.astype(w_ref.dtype).astype(mm))
        stored = jnp.broadcast_to(iota((chunk, 1), 0) < rows_ref[c], out.shape)
        plgpu.store(o_ref.at[pl.ds(start, chunk), head, cols], out.astype(o_ref.dtype), mask=stored)
        k = (keys.astype(F32) * jnp.exp(g_last[None, :] - g)).astype(mm)
        return jnp.exp(g_last) * h + dot(k, values.astype(mm), trans_a=True)

    init = pool_ref[slot_ref[n], head, :, cols].astype(F32)
    final_ref[n, head, :, cols] = lax.fori_loop(0, count_ref[n], step, init)


def fused_packed_delta(t, chunk: int, l2norm: bool, inputs, req, pool):
    """`_prefill.packed_delta` with `fused_kernel` in place of its state pass and output kernel."""
    query, key, value, beta, decay = inputs
    table = _prefill.chunk_table(req, query.shape[0], chunk)
    beta, g = _prefill.chunk_scalars(table, chunk, beta, decay)
    u, w = _prefill._wy(t, chunk, l2norm, table, key, value, beta, g)
    slots = jnp.clip(req.slots, 0, pool.shape[0] - 1)
    heads, dk, dv = key.shape[1], key.shape[-1], value.shape[-1]
    bv, warps, stages = forward_pass_defaults(dk, dv, table.first.shape[0] * heads)
    bv = BLOCK_V or min(bv, dv)
    g_row = jnp.swapaxes(g, 1, 2)
    args = (table.first, table.count, slots, table.start, table.rows, table.lo, table.hi, query, key, w, u)
    args += (g[..., None], g_row, pool)
    outs = [
        out_struct((*query.shape[:-1], dv), query.dtype, *args),
        out_struct((slots.shape[0], heads, dk, dv), F32, *args),
    ]
    static = dict(chunk=chunk, mm=t.mm(w.dtype), block_v=bv, l2norm=l2norm, scale=dk**-0.5)
    static["state_dtype"] = t.state_dtype(w.dtype)
    grid = (slots.shape[0], heads, dv // bv)
    tiling = dataclasses.replace(t, num_stages=stages)
    out, final = call_pallas(fused_kernel, tiling, warps, grid, None, None, outs, "s56_fused_ragged", **static)(*args)
    return out, final


BLOCK_V = None  # the value columns a program of the fused kernel takes; None: `forward_pass_defaults`'


def compiled(cfg, args, fused: bool, block_v=None, interpret: bool = False):
    """The op's Triton implementation compiled ahead (the variant patched in while it traces)."""
    global BLOCK_V
    call = jax.jit(functools.partial(ragged_gated_delta_rule_triton, cfg=cfg, interpret=interpret))
    if not fused:
        return call.lower(*args).compile()
    BLOCK_V = block_v
    with patched(_interface, packed_delta=fused_packed_delta):
        return call.lower(*args).compile()


def run(cases: dict, cfg, repeats: int, widths=(None,), interpret: bool = False):
    for case, args in cases.items():
        calls = {"landed": compiled(cfg, args, False, interpret=interpret)}
        calls |= {f"fused, {w or 'default'} columns": compiled(cfg, args, True, w, interpret) for w in widths}
        outputs = {name: jax.block_until_ready(call(*args)) for name, call in calls.items()}
        first = outputs["landed"]
        times = time_fns({n: functools.partial(c, *args) for n, c in calls.items()}, repeats=repeats) if repeats else {}
        for name, out in outputs.items():
            errs = " ".join(f"{rel(o.astype(F32), f.astype(F32)):.1e}" for o, f in zip(out, first, strict=True))
            ms = f"{1e3 * times[name]:8.4f} ms" if name in times else ""
            print(f"{case:28s} {name:24s} {ms}  (out, pool) against the landed call's: {errs}", flush=True)


def requests(lengths, heads, dim, dtype, slots):
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 8))
    x = lambda *shape: jax.random.normal(next(keys), shape, jnp.float32)
    tokens = sum(lengths)
    q, k, v = (x(tokens, heads, dim).astype(dtype) for _ in range(3))
    beta, decay = jax.nn.sigmoid(x(tokens, heads)), -0.05 * jax.nn.softplus(x(tokens, heads))
    bounds = jnp.asarray([0, *jnp.cumsum(jnp.asarray(lengths)).tolist()], jnp.int32)
    pool = x(slots, heads, dim, dim)
    return q, k, v, beta, decay, pool, bounds, jnp.arange(len(lengths), dtype=jnp.int32) % slots


def check():
    with jax.default_device(jax.devices("cpu")[0]):
        cfg = RaggedGatedDeltaRuleConfig(chunk_size=16, platform="triton")
        log("interpret mode: the fused variant against the landed call")
        for dtype in (jnp.float32, jnp.bfloat16):
            cases = {f"mixed 13, 1, 0, 21, 1, 6 {dtype.__name__}": requests([13, 1, 0, 21, 1, 6], 2, 32, dtype, 8)}
            run(cases, cfg, repeats=0, widths=(None, 16), interpret=True)


def bench(repeats):
    cfg = RaggedGatedDeltaRuleConfig(platform="triton", chunk_size=None)  # (the config's own default is 64)
    cases = {
        "prefill 8 x 2048": requests([2048] * 8, 32, 128, jnp.bfloat16, 8),
        "mixed 60 x 1 + 4 x 512": requests([1] * 60 + [512] * 4, 32, 128, jnp.bfloat16, 64),
        "prefill 1 x 16384": requests([16384], 32, 128, jnp.bfloat16, 1),
    }
    run(cases, cfg, repeats, widths=(None, 64))


if __name__ == "__main__":
    check_or_bench(__doc__, check, bench)
