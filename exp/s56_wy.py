"""Session 56: the gated delta rule's WY transform at chunk 64. At chunk 64 the forward state pass and output kernel
are faster than at 32 (0.275 / 0.243 ms against 0.392 / 0.321 on an H200, 8 x 2048 tokens, H 32, D 128), but the
one-kernel WY transform (`_delta._wy_kernel`, 2 warps) takes 0.52 ms against 0.32: at chunk 64 one program holds 16
blocks of the system, 10 of the inverse and the chunk's keys, values and scaled keys at once.

Variants, each `(u, w)` against the landed kernel's:
- the landed kernel at 2, 4 and 8 warps;
- two kernels (fla splits its transform the same way): `inverse_kernel` builds `(I + L)^-1` of the chunk's keys alone
  (the landed construction) and stores it `[C, C]` in k's dtype (the products round it so anyway), then `apply_kernel`
  forms `u = X (beta v)` and `w = X (beta e^g k)` as two `[C, C] x [C, D]` products.

    PYTHONPATH=src python exp/s56_wy.py [--check]   # --check: interpret mode, small shapes, on a CPU
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
from _kit import check_or_bench, log, rel
from jax.experimental import pallas as pl

from ejkernel.kernels._common.vma import out_struct
from ejkernel.kernels._triton._helpers import dot
from ejkernel.kernels._triton.linear_attention import _delta
from ejkernel.kernels._triton.linear_attention._gla_common import (
    F32,
    SUB,
    TritonGlaTiling,
    call_pallas,
    iota,
    masked_exp,
)
from ejkernel.ops.autotune import time_fns


def inverse_kernel(k_ref, beta_ref, a_ref, inverse_ref, *, blocks: int):
    """`(I + L)^-1` of one chunk and head (`_delta._wy_kernel`'s construction), stored `[C, C]`."""
    rows = [pl.ds(i * SUB, SUB) for i in range(blocks)]
    gates, total = [], jnp.zeros((), F32)
    for i in range(blocks):
        logs = a_ref[rows[i]]
        gates.append(jnp.cumsum(logs) + total)
        total = total + jnp.sum(logs)
    keys = [k_ref[rows[i], :] for i in range(blocks)]
    strict = iota((SUB, SUB), 0) > iota((SUB, SUB), 1)
    system = {}
    for i in range(blocks):
        beta = beta_ref[rows[i]]
        for j in range(i + 1):
            decay = masked_exp(gates[i][:, None] - gates[j][None, :], strict if i == j else True)
            system[i, j] = beta[:, None] * dot(keys[i], keys[j], trans_b=True) * decay
    inverse = {(i, i): _delta._unit_lower_inverse(system[i, i]) for i in range(blocks)}
    for j in range(blocks):
        for i in range(j + 1, blocks):
            inverse[i, j] = -dot(inverse[i, i], sum(dot(system[i, m], inverse[m, j]) for m in range(j, i)))
    for i, j in itertools.product(range(blocks), repeat=2):
        block = inverse[i, j] if j <= i else jnp.zeros((SUB, SUB), F32)
        inverse_ref[rows[i], rows[j]] = block.astype(inverse_ref.dtype)


def apply_kernel(inverse_ref, k_ref, v_ref, beta_ref, a_ref, u_ref, w_ref):
    """`u = X (beta v)`, `w = X (beta e^g k)` of one chunk and head from its inverse X."""
    beta, g = beta_ref[...], jnp.cumsum(a_ref[...])
    inverse = inverse_ref[...]
    values = (beta[:, None] * v_ref[...].astype(F32)).astype(v_ref.dtype)
    keys = ((beta * jnp.exp(g))[:, None] * k_ref[...].astype(F32)).astype(k_ref.dtype)
    u_ref[...] = dot(inverse.astype(v_ref.dtype), values).astype(u_ref.dtype)
    w_ref[...] = dot(inverse.astype(k_ref.dtype), keys).astype(w_ref.dtype)


def landed(t, chunk, warps, k, v, beta, a):
    rows, gate = _delta._chunk_specs(chunk)
    specs = [rows(k.shape[-1]), rows(v.shape[-1]), gate, gate], [rows(v.shape[-1]), rows(k.shape[-1])]
    outs = [out_struct(v.shape, v.dtype, k), out_struct(k.shape, k.dtype, k)]
    grid = (k.shape[1] // chunk, k.shape[0], k.shape[2])
    static = dict(blocks=chunk // SUB)
    return call_pallas(_delta._wy_kernel, t, warps, grid, *specs, outs, "s56_wy", **static)(k, v, beta, a)


def two_kernels(t, chunk, warps, k, v, beta, a):
    inverse_warps, apply_warps = warps
    rows, gate = _delta._chunk_specs(chunk)
    grid = (k.shape[1] // chunk, k.shape[0], k.shape[2])
    inverse_shape = (*k.shape[:-1], chunk)
    specs = [rows(k.shape[-1]), gate, gate], rows(chunk)
    outs = out_struct(inverse_shape, k.dtype, k)
    inverse = call_pallas(inverse_kernel, t, inverse_warps, grid, *specs, outs, "s56_wy_inverse", blocks=chunk // SUB)(
        k, beta, a
    )
    specs = [rows(chunk), rows(k.shape[-1]), rows(v.shape[-1]), gate, gate], [rows(v.shape[-1]), rows(k.shape[-1])]
    outs = [out_struct(v.shape, v.dtype, k), out_struct(k.shape, k.dtype, k)]
    return call_pallas(apply_kernel, t, apply_warps, grid, *specs, outs, "s56_wy_apply")(inverse, k, v, beta, a)


def inputs(batch, seq, heads, dim, dtype):
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 4))
    x = lambda *shape: jax.random.normal(next(keys), shape, jnp.float32)
    k = x(batch, seq, heads, dim)
    k = (k / jnp.linalg.norm(k, axis=-1, keepdims=True)).astype(dtype)
    return (
        k,
        x(batch, seq, heads, dim).astype(dtype),
        jax.nn.sigmoid(x(batch, seq, heads)),
        -0.05 * jax.nn.softplus(x(batch, seq, heads)),
    )


def run(shape, dtype, chunks, variants, interpret: bool, repeats: int):
    for chunk in chunks:
        args = inputs(*shape, dtype)
        t = TritonGlaTiling(interpret=interpret, precise=dtype == jnp.float32).fit(shape[-1], shape[-1])
        calls, outputs = {}, {}
        for name, (fn, warps) in variants.items():
            try:
                compiled = jax.jit(functools.partial(fn, t, chunk, warps)).lower(*args).compile()
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
            print(f"chunk {chunk} {name:32s} {ms}  (u, w) against the first: {errs}", flush=True)


VARIANTS = {
    "landed, 2 warps": (landed, 2),
    "landed, 4 warps": (landed, 4),
    "landed, 8 warps": (landed, 8),
    "two kernels, 2 + 4 warps": (two_kernels, (2, 4)),
    "two kernels, 4 + 4 warps": (two_kernels, (4, 4)),
    "two kernels, 2 + 8 warps": (two_kernels, (2, 8)),
}


def check():
    with jax.default_device(jax.devices("cpu")[0]):
        small = {name: VARIANTS[name] for name in ("landed, 2 warps", "two kernels, 2 + 4 warps")}
        for dtype in (jnp.float32, jnp.bfloat16):
            run((1, 128, 2, 32), dtype, (32, 64), small, interpret=True, repeats=0)


def bench(repeats):
    run((8, 2048, 32, 128), jnp.bfloat16, (64, 32), VARIANTS, interpret=False, repeats=repeats)


if __name__ == "__main__":
    check_or_bench(__doc__, check, bench)
