"""Session 56: the gated delta rule's forward state pass (`_delta._delta_states`, 0.53-0.64 ms on an H200 at 8 x 2048
tokens, H 32, D 128, against 0.23 ms for fla's `chunk_gated_delta_rule_fwd_kernel_h`) alone, over its tiling (value
columns a program, warps, stages) at chunks 32 and 64, the landed kernel beside a variant that scales each chunk's
values `U ⊙ e^{g_C − g}` (a `[C, bv]` tile) instead of its keys (`[C, Dk]`), as fla's kernel does, so the keys go
to the product as loaded. Median ms of interleaved timings; the variant's outputs against the landed kernel's.

    PYTHONPATH=src python exp/s56_state_pass.py [--check]   # --check: interpret mode, small shapes, on a CPU
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
from _kit import check_or_bench, log, rel
from jax import lax
from jax.experimental import pallas as pl

from ejkernel.kernels._common.vma import out_struct
from ejkernel.kernels._triton._helpers import dot
from ejkernel.kernels._triton.linear_attention import _delta
from ejkernel.kernels._triton.linear_attention._gla_common import F32, TritonGlaTiling, call_pallas, tile_slice
from ejkernel.kernels._triton.linear_attention._gla_forward import cumulative_gates
from ejkernel.kernels._triton.linear_attention._state_passes import TritonStatePassTiling
from ejkernel.ops.autotune import time_fns


def values_scaled_kernel(k_ref, w_ref, u_ref, g_ref, init_ref, e_ref, values_ref, final_ref, *, chunk, mm, bv):
    """`_delta._delta_states_kernel` with `(k ⊙ e^{g_C − g})ᵀ U` formed as `kᵀ (U ⊙ e^{g_C − g})`."""
    b, head, vt = (pl.program_id(i) for i in range(3))
    cols = tile_slice(vt, bv)

    def step(c, h):
        e_ref[b, c, head, :, cols] = h.astype(e_ref.dtype)
        first = pl.multiple_of(c * chunk, chunk)
        rows = pl.ds(first, chunk)
        g, g_last = _delta._chunk_gates(g_ref, b, head, first, chunk)
        values = u_ref[b, rows, head, cols].astype(F32) - dot(w_ref[b, rows, head, :].astype(mm), h.astype(mm))
        values_ref[b, rows, head, cols] = values.astype(values_ref.dtype)
        decayed = (values * jnp.exp(g_last[None, :] - g)).astype(mm)
        return jnp.exp(g_last) * h + dot(k_ref[b, rows, head, :].astype(mm), decayed, trans_a=True)

    final_ref[b, head, :, cols] = lax.fori_loop(0, e_ref.shape[1], step, init_ref[b, head, :, cols])


def inputs(batch, seq, heads, dim, chunk, interpret):
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 6))
    x = lambda *shape: jax.random.normal(next(keys), shape, jnp.float32)
    k = x(batch, seq, heads, dim)
    k = (k / jnp.linalg.norm(k, axis=-1, keepdims=True)).astype(jnp.bfloat16)
    w, u = (0.3 * x(batch, seq, heads, dim)).astype(jnp.bfloat16), x(batch, seq, heads, dim).astype(jnp.bfloat16)
    a = -0.05 * jax.nn.softplus(x(batch, seq, heads))
    t = TritonGlaTiling(interpret=interpret, precise=False).fit(dim, dim)
    g = cumulative_gates(t, chunk, a[..., None])
    return t, (k, w, u, g, x(batch, heads, dim, dim))


def states(kernel, t, passes, chunk, k, w, u, g, init):
    """`_delta._delta_states` with `kernel` in place of its own."""
    batch, seq, heads, dk = k.shape
    dv = u.shape[-1]
    bv = min(passes.block_v, dv)
    outs = [
        out_struct((batch, seq // chunk, heads, dk, dv), t.state_dtype(k.dtype), k),
        out_struct(u.shape, u.dtype, k),
        out_struct(init.shape, F32, k),
    ]
    grid = (batch, heads, dv // bv)
    static = dict(chunk=chunk, mm=t.mm(k.dtype), bv=bv)
    return call_pallas(kernel, t, passes.num_warps, grid, None, None, outs, "s56_states", **static)(k, w, u, g, init)


def run(shape, chunks, tilings, interpret: bool, repeats: int):
    for chunk in chunks:
        t, args = inputs(*shape, chunk, interpret)
        calls, outputs = {}, {}
        for (kernel_name, kernel), (bv, warps, stages) in itertools.product(KERNELS.items(), tilings):
            passes = TritonStatePassTiling(bv, warps, stages, interpret, precise=False)
            tiling = dataclasses.replace(t, num_stages=stages)
            name = f"chunk {chunk} {kernel_name:14s} bv {bv:3d} warps {warps} stages {stages}"
            try:
                fn = functools.partial(states, kernel, tiling, passes, chunk)
                compiled = jax.jit(fn).lower(*args).compile()
                outputs[name] = jax.block_until_ready(compiled(*args))
            except Exception as err:
                log(f"{name}: failed: {str(err).splitlines()[0][:160]}")
                continue
            calls[name] = functools.partial(compiled, *args)
        first = next(iter(outputs.values()))
        times = time_fns(calls, repeats=repeats, warmup=2) if repeats else {}
        for name, out in outputs.items():
            errs = " ".join(f"{rel(o.astype(F32), f.astype(F32)):.1e}" for o, f in zip(out, first, strict=True))
            ms = f"{1e3 * times[name]:8.4f} ms" if name in times else ""
            print(f"{name}  {ms}  rel. to the first (e, U, final): {errs}", flush=True)


KERNELS = {"landed": _delta._delta_states_kernel, "values scaled": values_scaled_kernel}


def check():
    with jax.default_device(jax.devices("cpu")[0]):
        run((1, 64, 2, 32), (32,), [(16, 4, 2)], interpret=True, repeats=0)


def bench(repeats):
    tilings = [*itertools.product((32, 64), (4, 8), (2, 3)), (16, 4, 2), (16, 2, 2), (128, 8, 2), (128, 8, 3)]
    run((8, 2048, 32, 128), (64, 32), tilings, interpret=False, repeats=repeats)


if __name__ == "__main__":
    check_or_bench(__doc__, check, bench)
