"""Block-sparse attention through Pallas Mosaic TPU kernels: checks, padding, the block table, the custom VJP.

`blocksparse_attention_tpu` checks what the kernels can serve (NotImplementedError before tracing, so
automatic dispatch moves on), builds the block table of its tiles once per call and hands it to the
kernels (`_kernel.py`) as flat scalar-prefetch arrays. Off TPU the kernels run in TPU interpret mode
(`pltpu.InterpretParams()`), which is how CPU CI checks them; their grids have a step per listed
entry slot, so keep interpret-mode shapes small.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from ejkernel.kernels._common.attention import pad_axes, round_up
from ejkernel.kernels._common.sparse_attention.block_table import build_block_table
from ejkernel.kernels._common.sparse_attention.checked_call import blocksparse_call, padded_mask_operands
from ejkernel.kernels._pallas.tpu import resolve_interpret
from ejkernel.kernels._pallas.tpu.blocksparse_attention._kernel import TpuBlockSparseStatic, backward, forward
from ejkernel.kernels._pallas.tpu.flash_attention._fwd import LANES, SUBLANES
from ejkernel.ops.config import BwdParams, FwdParams

SUPPORTED_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
MAX_HEAD_DIM = 256
MIN_BLOCK = 8  # one sublane tile
DEFAULT_BLOCK = 128
WHO = "pallas tpu blocksparse_attention"


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(st, q, k, v, bias, sinks, q_seg, kv_seg, mask, table):
    return forward(st, q, k, v, bias, sinks, q_seg, kv_seg, mask, table)[0]


def _attention_fwd(st, q, k, v, bias, sinks, q_seg, kv_seg, mask, table):
    out, lse = forward(st, q, k, v, bias, sinks, q_seg, kv_seg, mask, table)
    return out, (q, k, v, bias, sinks, q_seg, kv_seg, mask, table, out, lse)


def _attention_bwd(st, residuals, do):
    return (*backward(st, residuals, do), None, None, None, None)


_attention.defvjp(_attention_fwd, _attention_bwd)


def blocksparse_attention_tpu(
    query,
    key,
    value,
    softmax_aux=None,
    bias=None,
    *,
    fwd_params: FwdParams | None = None,
    bwd_params: BwdParams | None = None,
    interpret=None,
    **options,
):
    """Block-sparse attention `[B, H, Sq, D] x [B, Hkv, Sk, D] -> [B, H, Sq, Dv]` on TPU kernels.

    `**options` are the public options of `ejkernel.modules.blocksparse_attention` (defaults and checks in
    `_common.sparse_attention.checked_call.blocksparse_call`), plus canonical segment ids.
    Tiles: `fwd_params.block_q x block_k` (default 128 x 128) for the table and every kernel; on a
    TPU a key tile must be a multiple of 128 (or the whole padded key axis) and a query tile of the
    dtype's sublane tile. `interpret=None` runs TPU interpret mode off TPU.
    """
    del bwd_params
    call = blocksparse_call(
        WHO,
        query,
        key,
        value,
        softmax_aux,
        bias,
        fuses_backward=False,
        dtypes=SUPPORTED_DTYPES,
        max_head_dim=MAX_HEAD_DIM,
        **options,
    )
    interpret = resolve_interpret(interpret)

    block_q = fwd_params.block_q if fwd_params is not None and fwd_params.block_q else DEFAULT_BLOCK
    block_k = fwd_params.block_k if fwd_params is not None and fwd_params.block_k else DEFAULT_BLOCK
    if min(block_q, block_k) < MIN_BLOCK:
        raise NotImplementedError(f"{WHO} needs tiles of at least {MIN_BLOCK}, got {block_q}x{block_k}")
    granule = 32 if call.mask.attention_mask is not None else (16 if query.dtype == jnp.bfloat16 else 8)
    block_q = min(block_q, max(granule, pl.next_power_of_2(call.q_len)))
    block_k = min(block_k, max(granule, pl.next_power_of_2(call.kv_len)))
    q_len_padded, kv_len_padded = round_up(call.q_len, block_q), round_up(call.kv_len, block_k)
    if interpret is False and (block_q % granule or (block_k % LANES and block_k != kv_len_padded)):
        raise NotImplementedError(
            f"{WHO}: tile {block_q}x{block_k} does not fit the TPU tiling (query tile a multiple of {granule}; "
            f"key tile a multiple of {LANES} or the whole padded key length {kv_len_padded})"
        )

    mask = call.mask
    table = build_block_table(mask, q_len=call.q_len, kv_len=call.kv_len, block_q=block_q, block_k=block_k)
    st = TpuBlockSparseStatic(
        softmax_scale=call.softmax_scale,
        soft_cap=call.soft_cap,
        causal=mask.causal,
        window=mask.sliding_window,
        chunk_size=mask.chunk_size,
        q_len=call.q_len,
        kv_len=call.kv_len,
        num_heads=call.heads,
        num_kv_heads=call.kv_heads,
        block_q=block_q,
        block_k=block_k,
        table_batch=table.kv_blocks.shape[0] > 1,
        table_heads=table.kv_blocks.shape[1] > 1,
        num_q_blocks=table.num_q_blocks,
        num_k_blocks=table.num_k_blocks,
        interpret=interpret,
    )
    q_pad, kv_pad = q_len_padded - call.q_len, kv_len_padded - call.kv_len
    bias, dense, q_seg, kv_seg = padded_mask_operands(call, table, q_pad, kv_pad)
    if q_seg is not None:
        q_seg = jnp.broadcast_to(q_seg[:, :, None], (call.batch, q_len_padded, LANES))  # lane-replicated
        kv_seg = jnp.broadcast_to(kv_seg[:, None, :], (call.batch, SUBLANES, kv_len_padded))  # sublane-replicated
    flat = tuple(
        jnp.asarray(x, jnp.int32).reshape(-1)
        for x in (table.kv_blocks, table.kv_counts, table.kv_edges, table.q_blocks, table.q_counts, table.q_edges)
    )
    out = _attention(
        st,
        pad_axes(query, {2: q_pad}),
        pad_axes(key, {2: kv_pad}),
        pad_axes(value, {2: kv_pad}),
        bias,
        call.sink,
        q_seg,
        kv_seg,
        dense,
        flat,
    )
    return out[:, :, : call.q_len]
