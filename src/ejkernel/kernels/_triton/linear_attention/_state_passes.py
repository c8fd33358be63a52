"""Pallas-Triton kernels of the linear-attention family: the chunk-to-chunk state passes and one-token steps.

Arrays are in the chunk layout of `ejkernel.kernels._common.linear_attention.layout` (`[NC, B, H, ...]`).
Every kernel runs one program per (batch row, head, block of `block_v` value columns): the columns of
a `[Dk, Dv]` state evolve independently, so a program holds its `[Dk, block_v]` slice of the state in
registers (float32) and walks the chunks in order (forward) or in reverse (backward).
"""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from ejkernel.kernels._common.differentiation import differentiated_as
from ejkernel.kernels._common.vma import out_struct


@dataclasses.dataclass(frozen=True)
class TritonStatePassTiling:
    """Value columns per program, warps, stages (each None: the kernel's own default, `resolved`), interpret
    mode, and `precise`: float32 matmuls in full precision (for float32 inputs) rather than on TF32 tensor cores
    (enough for bfloat16/float16 inputs)."""

    block_v: int | None
    num_warps: int | None
    num_stages: int | None
    interpret: bool
    precise: bool = True

    def resolved(self, dv: int, block_v: int = 32, num_warps: int = 4, num_stages: int = 2) -> TritonStatePassTiling:
        """The tiling with a kernel's defaults in place of the fields left None, and at most `dv` value columns a
        program."""
        chosen = lambda field, default: default if field is None else field
        return dataclasses.replace(
            self,
            block_v=min(chosen(self.block_v, block_v), dv),
            num_warps=chosen(self.num_warps, num_warps),
            num_stages=chosen(self.num_stages, num_stages),
        )

    def params(self):
        return plgpu.CompilerParams(num_warps=self.num_warps, num_stages=self.num_stages)


def matmul(a, b, *, precise: bool, trans_a: bool = False, trans_b: bool = False):
    """2-D matmul `op(a) @ op(b)` of float32 tiles, accumulated in float32, exact or on TF32 tensor cores."""
    dims = (((0 if trans_a else 1,), (1 if trans_b else 0,)), ((), ()))
    precision = lax.Precision.HIGHEST if precise else lax.Precision.DEFAULT
    return lax.dot_general(a, b, dims, precision=precision, preferred_element_type=jnp.float32)


def _grid(batch: int, heads: int, dv: int, tiling: TritonStatePassTiling):
    return (batch, heads, dv // tiling.block_v)


def _program():
    b, h, block = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    return b, h, block


def _exit_states_kernel(starts_ref, init_ref, decay_ref, k_ref, u_ref, *rest, num_chunks: int, block_v: int, precise):
    """h ← init[start] where a sequence starts; `U = u − w h`; `h ← decay ⊙ h + kᵀ U`; store h per chunk."""
    w_ref, h_out_ref = rest if len(rest) == 2 else (None, rest[0])
    dot = functools.partial(matmul, precise=precise)
    b, head, block = _program()
    cols = pl.ds(pl.multiple_of(block * block_v, block_v), block_v)
    dk = k_ref.shape[-1]

    def chunk(c, h):
        start = starts_ref[c, b]
        fresh = plgpu.load(
            init_ref.at[jnp.maximum(start, 0), head, :, cols],
            mask=jnp.full((dk, block_v), start >= 0),
            other=0.0,
        )
        h = jnp.where(start >= 0, fresh, h)
        values = u_ref[c, b, head, :, cols]
        if w_ref is not None:
            values = values - dot(w_ref[c, b, head], h)
        h = decay_ref[c, b, head][:, None] * h + dot(k_ref[c, b, head], values, trans_a=True)
        h_out_ref[c, b, head, :, cols] = h
        return h

    lax.fori_loop(0, num_chunks, chunk, jnp.zeros((dk, block_v), jnp.float32))


def exit_states(p, init, starts, tiling: TritonStatePassTiling):
    """Each chunk's exit state `[NC, B, H, Dk, Dv]` from `ChunkParts` p (stacked over chunks)."""
    num_chunks, batch, heads, _, dk = p.k.shape
    dv = p.u.shape[-1]
    tiling = tiling.resolved(dv)
    args = [starts.astype(jnp.int32), init, p.decay, p.k, p.u] + ([] if p.w is None else [p.w])
    kernel = functools.partial(
        _exit_states_kernel, num_chunks=num_chunks, block_v=tiling.block_v, precise=tiling.precise
    )
    return pl.pallas_call(
        kernel,
        grid=_grid(batch, heads, dv, tiling),
        out_shape=out_struct((num_chunks, batch, heads, dk, dv), jnp.float32, *args),
        compiler_params=tiling.params(),
        interpret=tiling.interpret,
        name="ejkernel_linear_attention_exit_states",
    )(*args)


def _entry_grads_kernel(starts_ref, decay_ref, *rest, num_chunks: int, block_v: int, has_w: bool, precise: bool):
    """In reverse: `g = d_exit + dh_next` (if the next chunk carries on), `dh = dh_own + decay ⊙ g − wᵀ(k g)`."""
    if has_w:
        k_ref, w_ref, dh_own_ref, d_exit_ref, dh_in_ref, d_exit_total_ref = rest
    else:
        dh_own_ref, d_exit_ref, dh_in_ref, d_exit_total_ref = rest
    dot = functools.partial(matmul, precise=precise)
    b, head, block = _program()
    cols = pl.ds(pl.multiple_of(block * block_v, block_v), block_v)
    dk = decay_ref.shape[-1]

    def chunk(i, dh_next):
        c = num_chunks - 1 - i
        continues = (c + 1 < num_chunks) & (starts_ref[jnp.minimum(c + 1, num_chunks - 1), b] < 0)
        g = d_exit_ref[c, b, head, :, cols] + jnp.where(continues, dh_next, 0.0)
        dh = dh_own_ref[c, b, head, :, cols] + decay_ref[c, b, head][:, None] * g
        if has_w:
            dh = dh - dot(w_ref[c, b, head], dot(k_ref[c, b, head], g), trans_a=True)
        dh_in_ref[c, b, head, :, cols] = dh
        d_exit_total_ref[c, b, head, :, cols] = g
        return dh

    lax.fori_loop(0, num_chunks, chunk, jnp.zeros((dk, block_v), jnp.float32))


def entry_grads(p, dh_own, d_exit, starts, tiling: TritonStatePassTiling):
    """`(dh_in, d_exit_total)` `[NC, B, H, Dk, Dv]`: gradients of every chunk's entry and exit state."""
    num_chunks, batch, heads, dk, dv = dh_own.shape
    tiling = tiling.resolved(dv)
    args = [starts.astype(jnp.int32), p.decay] + ([] if p.w is None else [p.k, p.w]) + [dh_own, d_exit]
    kernel = functools.partial(
        _entry_grads_kernel,
        num_chunks=num_chunks,
        block_v=tiling.block_v,
        has_w=p.w is not None,
        precise=tiling.precise,
    )
    shape = out_struct((num_chunks, batch, heads, dk, dv), jnp.float32, *args)
    return pl.pallas_call(
        kernel,
        grid=_grid(batch, heads, dv, tiling),
        out_shape=[shape, shape],
        compiler_params=tiling.params(),
        interpret=tiling.interpret,
        name="ejkernel_linear_attention_entry_grads",
    )(*args)


def _step_kernel(*refs, names: tuple[str, ...], step, block_v: int):
    """One token of a recurrence on this program's `[Dk, block_v]` slice of the state."""
    token_refs, (h_ref, out_ref, h_new_ref) = refs[: len(names)], refs[len(names) :]
    b, head, block = _program()
    cols = pl.ds(pl.multiple_of(block * block_v, block_v), block_v)
    value_sized = {"v", "a_value"}  # per value column: only this program's columns
    token = {
        name: ref[b, head, cols] if name in value_sized else ref[b, head]
        for name, ref in zip(names, token_refs, strict=True)
    }
    h, out = step(h_ref[b, head, :, cols], **token)
    out_ref[b, head, cols] = out
    h_new_ref[b, head, :, cols] = h


def step_forward(step, tokens: dict, state, tiling: TritonStatePassTiling):
    """`step(state, **tokens)` for one token per batch row: tokens `[B, H, ...]`, state `[B, H, Dk, Dv]` float32."""
    batch, heads, dk, dv = state.shape
    tiling = tiling.resolved(dv)
    names = tuple(tokens)
    args = [tokens[n] for n in names] + [state]
    kernel = functools.partial(_step_kernel, names=names, step=step, block_v=tiling.block_v)
    return pl.pallas_call(
        kernel,
        grid=_grid(batch, heads, dv, tiling),
        out_shape=[
            out_struct((batch, heads, dv), jnp.float32, *args),
            out_struct((batch, heads, dk, dv), jnp.float32, *args),
        ],
        compiler_params=tiling.params(),
        interpret=tiling.interpret,
        name="ejkernel_linear_attention_step",
    )(*args)


def fused_step(step, tokens: dict, state, tiling: TritonStatePassTiling):
    """`step_forward` with the gradient of the plain-JAX step (one token, cheap)."""
    reference = lambda tokens, state: step(state, **tokens)[::-1]
    return differentiated_as(reference, functools.partial(step_forward, step, tiling=tiling))(tokens, state)
