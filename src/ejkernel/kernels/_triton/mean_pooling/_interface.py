"""Mean pooling as a Pallas kernel lowered through Triton.

One program per (sequence, feature block, split of the sequence) streams its rows in `[block_s, block_d]`
tiles and accumulates in float32, so the input is read exactly once; splitting long sequences keeps
the GPU full when there are few sequences. XLA adds up the float32 partial sums. A dense `[B, S, ...]`
batch is pooled as B packed sequences of length S (the reshape is free). The backward is a broadcast, which XLA
already runs at memory bandwidth, so it is the one every platform shares (`_common.mean_pooling`).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from ejkernel.kernels._common.mean_pooling import pool_with_vjp
from ejkernel.kernels._triton._helpers import resolve_interpret

DEFAULT_BLOCK_S = 32
DEFAULT_BLOCK_D = 512


def _pool_kernel(cu_ref, x_ref, o_ref, *, block_s: int, block_d: int, features: int, splits: int):
    seq, feature_block, split = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    seq_start, seq_end = cu_ref[seq], cu_ref[seq + 1]
    # This program sums rows [start, end): its share of the sequence, in whole tiles.
    rows_per_split = pl.cdiv(pl.cdiv(seq_end - seq_start, splits), block_s) * block_s
    start = jnp.minimum(seq_start + split * rows_per_split, seq_end)
    end = jnp.minimum(start + rows_per_split, seq_end)
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
    plgpu.store(o_ref.at[split, seq, cols], acc, mask=col_ok if ragged_cols else None)


def _split_count(num_seqs: int, feature_blocks: int, tokens: int, block_s: int) -> int:
    """Enough programs to fill the GPU (~1024), but at least 4 tiles of work per program."""
    wanted = pl.cdiv(1024, num_seqs * feature_blocks)
    return max(1, min(wanted, tokens // max(num_seqs, 1) // (4 * block_s)))


def _pool_packed(x2d, cu_seqlens, *, block_s: int, block_d: int, num_warps: int, num_stages: int, interpret: bool):
    features = x2d.shape[1]
    num_seqs = cu_seqlens.shape[0] - 1
    block_d = min(block_d, pl.next_power_of_2(features))
    feature_blocks = pl.cdiv(features, block_d)
    splits = _split_count(num_seqs, feature_blocks, x2d.shape[0], block_s)
    if x2d.shape[0] < block_s:  # a tile must fit inside the array even where its rows are masked off
        x2d = jnp.pad(x2d, ((0, block_s - x2d.shape[0]), (0, 0)))
    cu_seqlens = cu_seqlens.astype(jnp.int32)
    kernel = functools.partial(_pool_kernel, block_s=block_s, block_d=block_d, features=features, splits=splits)
    partial_sums = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((splits, num_seqs, features), jnp.float32),
        grid=(num_seqs, feature_blocks, splits),
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="ejkernel_mean_pooling",
    )(cu_seqlens, x2d)  # rows past the end of x2d are only read under a False mask
    lengths = jnp.maximum(cu_seqlens[1:] - cu_seqlens[:-1], 1).astype(jnp.float32)
    return (partial_sums.sum(axis=0) / lengths[:, None]).astype(x2d.dtype)


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
        interpret=resolve_interpret(interpret, "triton mean_pooling"),
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
