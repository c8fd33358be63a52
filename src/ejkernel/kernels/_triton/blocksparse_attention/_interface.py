"""Block-sparse attention through Pallas-Triton kernels: checks, padding, the block table, the custom VJP.

`blocksparse_attention_triton` checks what the kernels can serve (NotImplementedError before any kernel
is traced, so automatic dispatch moves on), builds the block table of its tiles once per call, packs
its rows as `[count, edges, blocks...]` (power-of-two wide), pads lengths to the tiles and head dims
to powers of two, and calls the forward (`_fwd.py`) and backward (`_bwd.py`) kernels.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from ejkernel.kernels._common.attention import pad_axes, round_up
from ejkernel.kernels._common.sparse_attention.block_table import build_block_table
from ejkernel.kernels._common.sparse_attention.checked_call import blocksparse_call, padded_mask_operands
from ejkernel.kernels._triton._helpers import resolve_interpret
from ejkernel.kernels._triton.blocksparse_attention._bwd import backward
from ejkernel.kernels._triton.blocksparse_attention._fwd import TritonBlockSparseStatic, forward
from ejkernel.ops.config import BwdParams, FwdParams

SUPPORTED_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
MAX_HEAD_DIM = 256
MIN_BLOCK = 16  # smallest tile edge the Triton matmuls take
WHO = "triton blocksparse_attention"


def default_tiles(head_dim: int) -> tuple[int, int, int, int, int, int]:
    """(block_q, block_k, forward warps, forward stages, backward warps, backward stages) for a head dim."""
    if head_dim <= 64:
        return 128, 64, 4, 3, 4, 2
    if head_dim <= 128:
        return 128, 64, 8, 3, 8, 2
    return 64, 32, 4, 2, 4, 2


def pack_lists(blocks, counts, edges):
    """Table rows `[..., width]` -> `[..., W]` rows `[count, edges, blocks..., 0...]`, W a power of two."""
    width = pl.next_power_of_2(blocks.shape[-1] + 2)
    rows = jnp.concatenate([counts[..., None], edges[..., None], blocks], axis=-1).astype(jnp.int32)
    return pad_axes(rows, {rows.ndim - 1: width - rows.shape[-1]})


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(st, q, k, v, bias, sinks, q_seg, kv_seg, mask, fwd_lists, bwd_lists):
    return forward(st, q, k, v, bias, sinks, q_seg, kv_seg, mask, fwd_lists)[0]


def _attention_fwd(st, q, k, v, bias, sinks, q_seg, kv_seg, mask, fwd_lists, bwd_lists):
    out, lse = forward(st, q, k, v, bias, sinks, q_seg, kv_seg, mask, fwd_lists)
    return out, (q, k, v, bias, sinks, q_seg, kv_seg, mask, fwd_lists, bwd_lists, out, lse)


def _attention_bwd(st, residuals, do):
    return (*backward(st, residuals, do), None, None, None, None, None)


_attention.defvjp(_attention_fwd, _attention_bwd)


def blocksparse_attention_triton(
    query,
    key,
    value,
    softmax_aux=None,
    bias=None,
    *,
    fwd_params: FwdParams | None = None,
    bwd_params: BwdParams | None = None,
    interpret: bool | None = None,
    **options,
):
    """Block-sparse attention `[B, H, Sq, D] x [B, Hkv, Sk, D] -> [B, H, Sq, Dv]` on Pallas-Triton kernels.

    `**options` are the public options of `ejkernel.modules.blocksparse_attention` (defaults and checks in
    `_common.sparse_attention.checked_call.blocksparse_call`), plus canonical segment ids.
    Tiles: `fwd_params.block_q x block_k` for the table and every kernel (defaults by head dim);
    warps and stages from `fwd_params` (forward) and `bwd_params` (both backward kernels).
    `interpret=None` compiles for the GPU (off a GPU: an error; `interpret=True` interprets).
    Refuses (NotImplementedError) other dtypes, head dims over 256, tiles under 16 and
    `fused_backward=True` (its backward is two kernels).
    """
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
    head_dim, value_dim = query.shape[-1], value.shape[-1]
    block_q, block_k, fwd_warps, fwd_stages, bwd_warps, bwd_stages = default_tiles(max(head_dim, value_dim))
    given = lambda params, name, default: (
        default if params is None or getattr(params, name) is None else getattr(params, name)
    )
    block_q, block_k = given(fwd_params, "block_q", block_q), given(fwd_params, "block_k", block_k)
    if min(block_q, block_k) < MIN_BLOCK:
        raise NotImplementedError(f"{WHO} needs tiles of at least {MIN_BLOCK}, got {block_q}x{block_k}")
    block_q = min(block_q, max(MIN_BLOCK, pl.next_power_of_2(call.q_len)))
    block_k = min(block_k, max(MIN_BLOCK, pl.next_power_of_2(call.kv_len)))

    mask = call.mask
    table = build_block_table(mask, q_len=call.q_len, kv_len=call.kv_len, block_q=block_q, block_k=block_k)
    interpret = resolve_interpret(interpret, WHO)
    st = TritonBlockSparseStatic(
        softmax_scale=call.softmax_scale,
        soft_cap=call.soft_cap,
        fast_tanh=not interpret and query.dtype != jnp.float32,
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
        fwd_warps=given(fwd_params, "num_warps", fwd_warps),
        fwd_stages=given(fwd_params, "num_stages", fwd_stages),
        bwd_warps=given(bwd_params, "num_warps", bwd_warps),
        bwd_stages=given(bwd_params, "num_stages", bwd_stages),
        interpret=bool(interpret),
    )

    q_pad, kv_pad = round_up(call.q_len, block_q) - call.q_len, round_up(call.kv_len, block_k) - call.kv_len
    d_pad = max(MIN_BLOCK, pl.next_power_of_2(head_dim)) - head_dim
    dv_pad = max(MIN_BLOCK, pl.next_power_of_2(value_dim)) - value_dim
    bias, dense, q_seg, kv_seg = padded_mask_operands(call, table, q_pad, kv_pad)
    out = _attention(
        st,
        pad_axes(query, {2: q_pad, 3: d_pad}),
        pad_axes(key, {2: kv_pad, 3: d_pad}),
        pad_axes(value, {2: kv_pad, 3: dv_pad}),
        bias,
        call.sink,
        q_seg,
        kv_seg,
        dense,
        pack_lists(table.kv_blocks, table.kv_counts, table.kv_edges),
        pack_lists(table.q_blocks, table.q_counts, table.q_edges),
    )
    return out[:, :, : call.q_len, :value_dim]
