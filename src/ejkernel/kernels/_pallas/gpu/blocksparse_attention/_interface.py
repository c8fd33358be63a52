"""Block-sparse attention on the Mosaic GPU (Hopper) flash attention kernels: checks, the table, the VJP.

The forward, dQ, dK/dV and fused backward kernels are flash attention's (`_pallas/gpu/flash_attention`),
run in the `[B, H, S, D]` layout with walks that stream only what the block table lists (`_walks`):
per 128-row query tile the key blocks of its table row (forward, dQ), per 128-key CTA the query
blocks of its table column, for each query head of its group (dK/dV). Listed partial blocks are
masked by the positional rules (causal, sliding window, chunks), the key length and the segment ids;
full blocks run without any mask work. Empty rows write zeros (and get zero gradients).

Serves bf16/fp16 query/key/value of one head dim, 64 or 128, grouped-query heads, soft cap and sink
logits, masks given by positional rules, segment ids (known while tracing or not), and dense masks or
mask builders that are constant on the table's tiles and known while tracing (then the table alone
says them). Declines (NotImplementedError, before any kernel is traced, so that automatic selection
moves on to Triton): bias, a dense mask that varies within a tile or is only known at run time, other
dtypes and head dims, table tiles other than 128 or 256, and GPUs other than Hopper.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ejkernel.kernels._common.attention import decline, pad_axes, round_up
from ejkernel.kernels._common.device import is_hopper
from ejkernel.kernels._common.sparse_attention.block_table import build_block_table
from ejkernel.kernels._common.sparse_attention.checked_call import blocksparse_call
from ejkernel.kernels._pallas.gpu.blocksparse_attention._walks import (
    MosaicGpuBlockSparseStatic,
    column_lists,
    concrete,
    key_tiles,
    launch_order,
    query_tiles,
    row_lists,
)
from ejkernel.kernels._pallas.gpu.flash_attention._interface import (
    HEAD_DIMS,
    check_kernel_tiles,
    kernel_choices,
)
from ejkernel.kernels._pallas.gpu.flash_attention._tiling import CTA_ROWS
from ejkernel.ops.config import BwdParams, FwdParams

WHO = "mosaic gpu blocksparse_attention"
DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
TABLE_TILES = (128, 256)  # the table's tiles: whole 128-row CTAs


def _walks(st: MosaicGpuBlockSparseStatic, rows, row_order, cols, col_order, q_seg, kv_seg):
    num_q_tiles, num_q_blocks = st.q_len_padded // CTA_ROWS, st.q_len_padded // st.table_q
    segments = () if q_seg is None else (q_seg, kv_seg)
    return (
        key_tiles(st, st.block_k, rows, row_order, num_q_tiles, segments, st.q_tiles_per_cta),
        key_tiles(st, st.block_k_dq, rows, row_order, num_q_tiles, segments),
        query_tiles(st, st.block_q_dkv, cols, col_order, num_q_blocks, segments),
    )


def _forward(st: MosaicGpuBlockSparseStatic, q, k, v, sinks, *lists):
    from ejkernel.kernels._pallas.gpu.flash_attention._fwd import forward  # loads Mosaic GPU

    return forward(st, q, k, v, sinks, walk=_walks(st, *lists)[0])


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(st, q, k, v, sinks, rows, row_order, cols, col_order, q_seg, kv_seg):
    return _forward(st, q, k, v, sinks, rows, row_order, cols, col_order, q_seg, kv_seg)[0]


def _attention_fwd(st, q, k, v, sinks, *lists):
    out, lse = _forward(st, q, k, v, sinks, *lists)
    return out, (q, k, v, sinks, lists, out, lse)


def _attention_bwd(st, residuals, do):
    from ejkernel.kernels._pallas.gpu.flash_attention._interface import backward

    q, k, v, sinks, lists, out, lse = residuals
    _, dq_tiles, dkv_tiles = _walks(st, *lists)
    dq, dk, dv, dsinks = backward(st, q, k, v, sinks, out, lse, do.astype(out.dtype), dq_tiles, dkv_tiles)
    return dq, dk, dv, dsinks, *(None,) * len(lists)


_attention.defvjp(_attention_fwd, _attention_bwd)


def _param(params, name: str, default: int) -> int:
    value = None if params is None else getattr(params, name)
    return default if value is None else value


def _partial_tiles(table) -> bool:
    """Whether any listed tile needs a mask (True when the table is only known at run time)."""
    edges = table.kv_edges
    return bool(np.asarray(edges).any()) if concrete(edges) else True


def plan(query, key, value, softmax_aux=None, bias=None, *, fwd_params=None, bwd_params=None, **options):
    """Checks what the kernels serve; returns `(MosaicGpuBlockSparseStatic, padded q, k, v, folded sinks, (row lists,
    column lists, padded q / kv segment ids or None))`. `**options`: the public options of
    `blocksparse_attention` and canonical segment ids."""
    decline(WHO, {"bias": bias is not None})
    call = blocksparse_call(
        WHO,
        query,
        key,
        value,
        softmax_aux,
        bias,
        fuses_backward=True,
        dtypes=DTYPES,
        max_head_dim=max(HEAD_DIMS),
        **options,
    )
    head_dim, value_dim = query.shape[-1], value.shape[-1]
    if head_dim != value_dim or head_dim not in HEAD_DIMS:
        raise NotImplementedError(f"{WHO} needs query/key/value head dims in {HEAD_DIMS}, got {head_dim}/{value_dim}")
    table_q, table_k = _param(fwd_params, "block_q", 128), _param(fwd_params, "block_k", 128)
    if table_q not in TABLE_TILES or table_k not in TABLE_TILES:
        raise NotImplementedError(
            f"{WHO} takes block tables of {TABLE_TILES}-row tiles (fwd_params.block_q x block_k), "
            f"got {table_q}x{table_k}"
        )
    block_k = _param(fwd_params, "block_n", 128)  # the forward's key step
    block_k_dq = _param(bwd_params, "block_k", 64)
    block_q_dkv = _param(bwd_params, "block_q", 64)
    stages = _param(fwd_params, "num_stages", 2)
    fused = bool(options.get("fused_backward"))
    # Three stages of the dQ and dK/dV rings where they fit beside 64-row steps at head dim 128 (H100,
    # S=16384, random blocks at 10% / 25%: forward+backward 1.830 / 3.976 ms against 1.890 / 4.072 with
    # two); elsewhere two (the fused backward, asked for or chosen with soft cap, needs them at head dim 128).
    deep = head_dim == 128 and not fused and call.soft_cap is None and block_k_dq == block_q_dkv == 64
    stages_bwd = _param(bwd_params, "num_stages", 3 if deep else 2)
    blocks = {"fwd_params.block_n": block_k, "bwd_params.block_k": block_k_dq, "bwd_params.block_q": block_q_dkv}
    check_kernel_tiles(WHO, head_dim, blocks, "fwd_params.block_n", stages, stages_bwd)
    if block_k > table_k:
        raise NotImplementedError(f"{WHO}: the forward's key step ({block_k}) exceeds the table's tiles ({table_k})")
    # Two 128-row query tiles per forward CTA (fwd_params.block_m = 256): the second tile's first key
    # blocks load while the first tile ends, meant for rows that list few blocks; on an H100 (S=16384,
    # random blocks at 10% / 25%) it ran as one tile does (0.501 / 1.052 against 0.502 / 1.046 ms).
    cta_rows = _param(fwd_params, "block_m", CTA_ROWS)
    if cta_rows not in (CTA_ROWS, 2 * CTA_ROWS):
        raise NotImplementedError(f"{WHO}: a forward CTA runs 128 or 256 query rows, got fwd_params.block_m={cta_rows}")
    q_tiles = round_up(call.q_len, table_q) // CTA_ROWS
    # (the second tile's 2 x 64 query rows fit shared memory beside a K/V ring of up to 64 KiB each)
    if cta_rows == 2 * CTA_ROWS and (q_tiles % 2 or stages * block_k * head_dim > 512 * 64):
        raise NotImplementedError(
            f"{WHO}: two query tiles per CTA need an even number of them ({q_tiles}) and a key/value ring "
            f"of at most {512 * 64 // head_dim} rows (got {stages} x {block_k})"
        )
    if fused and (block_q_dkv != 64 or (head_dim == 128 and stages_bwd != 2)):
        raise NotImplementedError(
            f"{WHO}: the fused backward streams 64-row query tiles (and 2 stages at head dim 128), got "
            f"bwd_params.block_q={block_q_dkv}, num_stages={stages_bwd}"
        )

    mask = call.mask
    table = build_block_table(mask, q_len=call.q_len, kv_len=call.kv_len, block_q=table_q, block_k=table_k)
    if table.needs_dense_mask:
        raise NotImplementedError(
            f"{WHO} serves masks that are constant on its {table_q}x{table_k} tiles (given concretely); "
            "this one varies within tiles or is only known at run time"
        )
    partial = _partial_tiles(table)
    choices = kernel_choices(
        head_dim, query.dtype, call.kv_len, call.soft_cap, block_k, block_q_dkv, stages_bwd, partial, mask.causal
    )
    if fused:
        choices["fused_bwd"] = True
    st = MosaicGpuBlockSparseStatic(
        softmax_scale=call.softmax_scale,
        soft_cap=call.soft_cap,
        causal=mask.causal,
        window=None if mask.sliding_window is None else tuple(int(x) for x in mask.sliding_window),
        q_len=call.q_len,
        kv_len=call.kv_len,
        num_heads=call.heads,
        num_kv_heads=call.kv_heads,
        block_k=block_k,
        stages=stages,
        block_k_dq=block_k_dq,
        block_q_dkv=block_q_dkv,
        stages_bwd=stages_bwd,
        q_tiles_per_cta=cta_rows // CTA_ROWS,
        heads_major=True,
        # tiles fetched into L2 two steps ahead: a tile listed by few rows misses L2 on its first read
        # (H200, S=16384 H=16 D=128, random blocks, forward+backward at 10% / 25%: 1.845 / 4.043 ms
        # against 1.887 / 4.148 without; the forward alone unchanged)
        prefetch=2,
        chunk_size=mask.chunk_size,
        table_q=table_q,
        table_k=table_k,
        table_batch=table.kv_blocks.shape[0] > 1,
        table_heads=table.kv_blocks.shape[1] > 1,
        segments=mask.q_segment_ids is not None,
        partial_tiles=partial,
        **choices,
    )
    q_pad, kv_pad = st.q_len_padded - call.q_len, st.kv_len_padded - call.kv_len
    q, k, v = pad_axes(query, {2: q_pad}), pad_axes(key, {2: kv_pad}), pad_axes(value, {2: kv_pad})
    q_seg = kv_seg = None
    if st.segments:  # padded positions belong to no segment
        q_seg = pad_axes(mask.q_segment_ids.astype(jnp.int32), {1: q_pad}, value=-1)
        kv_seg = pad_axes(mask.kv_segment_ids.astype(jnp.int32), {1: kv_pad}, value=-1)
    group = call.heads // call.kv_heads
    cols = column_lists(table, group)
    lists = (
        row_lists(table),
        launch_order(table.kv_counts, table_q // CTA_ROWS),
        cols,
        launch_order(cols[..., group], table_k // CTA_ROWS),  # every head's steps of each key tile
        q_seg,
        kv_seg,
    )
    return st, q, k, v, call.sink, lists


def mosaic_blocksparse(query, key, value, softmax_aux=None, bias=None, **options):
    """The kernels' differentiable block-sparse attention without the device check (lets CPU tests lower
    it for CUDA, or run it in Mosaic GPU interpret mode)."""
    st, q, k, v, sinks, lists = plan(query, key, value, softmax_aux, bias, **options)
    *tables, q_seg, kv_seg = lists
    out = _attention(st, q, k, v, sinks, *(jnp.asarray(x) for x in tables), q_seg, kv_seg)
    return out if out.shape[2] == st.q_len else out[:, :, : st.q_len]


def blocksparse_attention_mosaic_gpu(
    query,
    key,
    value,
    softmax_aux=None,
    bias=None,
    *,
    fwd_params: FwdParams | None = None,
    bwd_params: BwdParams | None = None,
    **options,
):
    """Block-sparse attention `[B, H, Sq, D] x [B, Hkv, Sk, D] -> [B, H, Sq, D]` on Hopper GPUs.

    `**options` are the public options of `ejkernel.modules.blocksparse_attention` (defaults and checks
    in `_common.sparse_attention.checked_call.blocksparse_call`), plus canonical segment ids. Tiles:
    `fwd_params.block_q x block_k` the block table's (128 or 256; default 128 x 128),
    `fwd_params.block_n` the forward's key step (64 or 128, default 128), `num_stages` its ring,
    `block_m` its query rows per CTA (128, or 256: two query tiles per CTA);
    `bwd_params.block_k` the dQ kernel's key step and `bwd_params.block_q` the dK/dV kernel's query
    step (64 or 128, default 64), `num_stages` their ring (default 3 at head dim 128 with 64-row steps
    and no soft cap, else 2). `fused_backward=True` runs the fused
    backward (dQ added in float32 by TMA reductions), which the kernels otherwise choose where it
    measured faster (head dim 64, soft cap). Differentiable in query, key, value and softmax_aux.
    """
    decline(WHO, {"bias": bias is not None})
    if not is_hopper():
        device = jax.devices()[0].device_kind
        raise NotImplementedError(f"{WHO} needs a Hopper GPU (compute capability 9.x), not {device}")
    return mosaic_blocksparse(
        query, key, value, softmax_aux, bias, fwd_params=fwd_params, bwd_params=bwd_params, **options
    )
