"""Mean pooling as a Pallas kernel lowered through Triton.

One program per (sequence, feature block) streams its sequence's rows in `[block_s, block_d]` tiles
and accumulates in float32, so the input is read exactly once. A dense `[B, S, ...]` batch is pooled
as B packed sequences of length S (the reshape is free). The backward is a broadcast, which XLA
already runs at memory bandwidth, so it is shared with the XLA implementation.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from ejkernel.kernels._xla.mean_pooling._interface import pool_with_vjp

DEFAULT_BLOCK_S = 32
DEFAULT_BLOCK_D = 512


def _pool_kernel(cu_ref, x_ref, o_ref, *, block_s: int, block_d: int, features: int):
    seq, feature_block = pl.program_id(0), pl.program_id(1)
    start, end = cu_ref[seq], cu_ref[seq + 1]
    cols = pl.ds(pl.multiple_of(feature_block * block_d, block_d), block_d)
    col_ok = feature_block * block_d + jnp.arange(block_d) < features
    ragged_cols = features % block_d != 0

    def tile(row0, row_ok=None):
        mask = col_ok[None, :] if ragged_cols else None
        if row_ok is not None:
            mask = row_ok[:, None] if mask is None else mask & row_ok[:, None]
        if mask is None:
            return x_ref[pl.ds(row0, block_s), cols].astype(jnp.float32)
        return plgpu.load(x_ref.at[pl.ds(row0, block_s), cols], mask=mask, other=0.0).astype(jnp.float32)

    full_tiles = (end - start) // block_s

    def body(i, acc):
        return acc + jnp.sum(tile(start + i * block_s), axis=0)

    acc = jax.lax.fori_loop(0, full_tiles, body, jnp.zeros((block_d,), jnp.float32))
    tail = start + full_tiles * block_s
    acc += jnp.sum(tile(tail, tail + jnp.arange(block_s) < end), axis=0)
    mean = acc / jnp.maximum(end - start, 1).astype(jnp.float32)
    plgpu.store(o_ref.at[seq, cols], mean.astype(o_ref.dtype), mask=col_ok if ragged_cols else None)


def _pool_packed(x2d, cu_seqlens, *, block_s: int, block_d: int, num_warps: int, num_stages: int, interpret: bool):
    features = x2d.shape[1]
    num_seqs = cu_seqlens.shape[0] - 1
    block_d = min(block_d, pl.next_power_of_2(features))
    if x2d.shape[0] < block_s:  # a tile must fit inside the array even where its rows are masked off
        x2d = jnp.pad(x2d, ((0, block_s - x2d.shape[0]), (0, 0)))
    kernel = functools.partial(_pool_kernel, block_s=block_s, block_d=block_d, features=features)
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((num_seqs, features), x2d.dtype),
        grid=(num_seqs, pl.cdiv(features, block_d)),
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="ejkernel_mean_pooling",
    )(cu_seqlens.astype(jnp.int32), x2d)  # rows past the end of x2d are only read under a False mask


def mean_pooling_triton(x: jax.Array, cu_seqlens: jax.Array | None = None, *, cfg=None, interpret: bool | None = None):
    """Mean over axis 1 of `x [B, S, ...]`, or per packed sequence of `x [T, ...]` given `cu_seqlens`."""
    if not jnp.issubdtype(x.dtype, jnp.floating) or x.dtype == jnp.float64:
        raise NotImplementedError(f"triton mean_pooling takes float16/bfloat16/float32, got {x.dtype}")
    params = getattr(cfg, "fwd_params", None)
    tiling = dict(
        block_s=(params and params.block_k) or DEFAULT_BLOCK_S,
        block_d=(params and params.block_d) or DEFAULT_BLOCK_D,
        num_warps=(params and params.num_warps) or 4,
        num_stages=(params and params.num_stages) or 3,
        interpret=jax.default_backend() != "gpu" if interpret is None else interpret,
    )

    def forward(x, cu_seqlens):
        if cu_seqlens is None:
            batch, seq = x.shape[:2]
            bounds = jnp.arange(batch + 1, dtype=jnp.int32) * seq
            pooled = _pool_packed(x.reshape(batch * seq, -1), bounds, **tiling)
        else:
            pooled = _pool_packed(x.reshape(x.shape[0], -1), cu_seqlens, **tiling)
        return pooled.reshape(pooled.shape[:1] + x.shape[(1 if cu_seqlens is not None else 2) :])

    return pool_with_vjp(forward, x, cu_seqlens)
