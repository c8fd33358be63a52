"""Flash attention through Pallas Mosaic TPU kernels: the canonical entry point and its custom VJP.

`flash_attention_tpu` checks what the kernels can serve (raising `NotImplementedError` before any
kernel is traced, so automatic dispatch can fall back), moves the heads ahead of the sequence
(`[B, S, H, D] -> [B, H, S, D]`: TPU tiles want the sequence and head dims last), pads sequence
lengths to block multiples (plain jnp, so autodiff slices the gradients back), folds the sink logits
into one log-sum-exp per head and calls the differentiable core. Grouped-query heads read their
key/value head through the kernels' index maps, never through a repeated copy.

Off TPU the kernels run in TPU interpret mode (`pltpu.InterpretParams()`), which is how CPU CI
checks them.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental import pallas as pl

from ejkernel.kernels._common.attention import (
    attention_vjp,
    check_options,
    check_qkv,
    fold_sinks,
    pad_axes,
    round_up,
)
from ejkernel.kernels._common.attention_call import AttentionCall
from ejkernel.kernels._pallas.tpu import resolve_interpret
from ejkernel.kernels._pallas.tpu.flash_attention._bwd import backward
from ejkernel.kernels._pallas.tpu.flash_attention._fwd import LANES, SUBLANES, TpuFlashStatic, forward
from ejkernel.ops.config import BwdParams, FwdParams

SUPPORTED_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
MAX_HEAD_DIM = 256
MIN_BLOCK = 8  # one sublane tile
DEFAULT_BLOCK_Q = 128
DEFAULT_BLOCK_K = 128
WHO = "pallas tpu flash_attention"


def _requested_blocks(params, fallback: tuple[int, int]) -> tuple[int, int]:
    block_q = params.block_q if params is not None and params.block_q is not None else fallback[0]
    block_k = params.block_k if params is not None and params.block_k is not None else fallback[1]
    if min(block_q, block_k) < MIN_BLOCK:
        raise NotImplementedError(f"{WHO} needs blocks >= {MIN_BLOCK}, got {block_q}x{block_k}")
    return block_q, block_k


def _fit(block: int, length: int, granule: int) -> int:
    """A short sequence gets a smaller (power-of-two) block rather than mostly padding."""
    return min(block, max(granule, pl.next_power_of_2(length)))


_attention = attention_vjp(forward, backward)


def flash_attention_tpu(
    query,
    key,
    value,
    bias,
    softmax_aux,
    call: AttentionCall,
    *,
    fwd_params: FwdParams | None = None,
    bwd_params: BwdParams | None = None,
    interpret=None,
):
    """Exact attention `[B, Sq, H, D] x [B, Sk, Hkv, D] x [B, Sk, Hkv, Dv] -> [B, Sq, H, Dv]` on TPU.

    Canonical flash-attention contract (see `ejkernel.reference.flash_attention`), options in `call`: optional additive
    `bias [1|B, 1|H, Sq, Sk]`, sink logits `softmax_aux` (length H: one per head, else shared), segment
    ids (negative = padding), boolean `attention_mask [1|B, 1|H, Sq, Sk]`, causal and `(left, right)`
    sliding-window masks, tanh soft cap and counter-based dropout. Differentiable in query, key,
    value, bias and softmax_aux.

    Tiles come from `fwd_params` / `bwd_params` (block_q, block_k; other fields are ignored); unset
    fields of `bwd_params` take the forward's, unset forward fields are 128. Blocks shrink to the next
    power of two of a shorter sequence. On a TPU, a key block must be a multiple of 128 or cover the
    whole (padded) key axis, and a query block a multiple of the dtype's sublane tile (8 float32,
    16 bfloat16, 32 with an attention mask).

    `interpret=None` compiles for the TPU when JAX's default backend is a TPU and otherwise runs TPU
    interpret mode; `True` forces interpret mode, and a `pltpu.InterpretParams` is used as given.

    Raises NotImplementedError for what the kernels cannot serve (dtype, head dim, tile sizes, empty
    inputs).
    """
    # ---- what the kernels cannot serve: refuse before tracing anything ----
    batch, q_len, kv_len, num_heads, num_kv_heads, head_dim, value_dim = check_qkv(
        query, key, value, who=WHO, dtypes=SUPPORTED_DTYPES, max_head_dim=MAX_HEAD_DIM
    )
    if min(q_len, kv_len, batch, num_heads, head_dim, value_dim) == 0:
        raise NotImplementedError(f"{WHO} needs non-empty inputs")
    check_options(
        batch,
        num_heads,
        q_len,
        kv_len,
        who=WHO,
        dtypes=SUPPORTED_DTYPES,
        bias=bias,
        softmax_aux=softmax_aux,
        call=call,
    )
    attention_mask = call.attention_mask

    interpret = resolve_interpret(interpret)
    on_tpu = interpret is False

    # ---- tiles ----
    granule = 32 if attention_mask is not None else (16 if query.dtype == jnp.bfloat16 else 8)
    fwd_req = _requested_blocks(fwd_params, (DEFAULT_BLOCK_Q, DEFAULT_BLOCK_K))
    bwd_req = _requested_blocks(bwd_params, fwd_req)
    fwd_q, bwd_q = (_fit(b[0], q_len, granule) for b in (fwd_req, bwd_req))
    fwd_k, bwd_k = (_fit(b[1], kv_len, granule) for b in (fwd_req, bwd_req))
    q_len_padded = round_up(q_len, max(fwd_q, bwd_q))
    kv_len_padded = round_up(kv_len, max(fwd_k, bwd_k))
    if on_tpu:
        for block_q, block_k in ((fwd_q, fwd_k), (bwd_q, bwd_k)):
            if block_q % granule or (block_k % LANES and block_k != kv_len_padded):
                raise NotImplementedError(
                    f"pallas tpu flash_attention: tile {block_q}x{block_k} does not fit the TPU tiling "
                    f"(query block a multiple of {granule}; key block a multiple of {LANES} or the whole "
                    f"padded key length {kv_len_padded})"
                )
    st = TpuFlashStatic(
        softmax_scale=call.softmax_scale,
        causal=call.causal,
        window=call.sliding_window,
        soft_cap=call.logits_soft_cap,
        dropout_prob=call.dropout_prob,
        q_len=q_len,
        kv_len=kv_len,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        block_q=fwd_q,
        block_k=fwd_k,
        bwd_block_q=bwd_q,
        bwd_block_k=bwd_k,
        interpret=interpret,
    )

    # ---- layout and padding (plain jnp: autodiff transposes and slices the gradients back) ----
    q_pad, kv_pad = q_len_padded - q_len, kv_len_padded - kv_len
    q = pad_axes(jnp.swapaxes(query, 1, 2), {2: q_pad})
    k = pad_axes(jnp.swapaxes(key, 1, 2), {2: kv_pad})
    v = pad_axes(jnp.swapaxes(value, 1, 2), {2: kv_pad})
    bias_p = None
    if bias is not None:
        bias_p = pad_axes(jnp.broadcast_to(bias, (*bias.shape[:2], q_len, kv_len)), {2: q_pad, 3: kv_pad})
    mask = None
    if attention_mask is not None:
        mask = jnp.broadcast_to(jnp.asarray(attention_mask, jnp.bool_), (*attention_mask.shape[:2], q_len, kv_len))
        mask = pad_axes(mask.astype(jnp.int8), {2: q_pad, 3: kv_pad})
    q_seg = kv_seg = None
    if call.segments:
        q_seg = pad_axes(jnp.asarray(call.q_segment_ids, jnp.int32), {1: q_pad}, value=-1)
        kv_seg = pad_axes(jnp.asarray(call.kv_segment_ids, jnp.int32), {1: kv_pad}, value=-1)
        q_seg = jnp.broadcast_to(q_seg[:, :, None], (batch, q_len_padded, LANES))  # lane-replicated
        kv_seg = jnp.broadcast_to(kv_seg[:, None, :], (batch, SUBLANES, kv_len_padded))  # sublane-replicated
    sinks = fold_sinks(softmax_aux, num_heads)
    seed = None
    if call.dropout_prob > 0.0:
        seed = jnp.asarray(call.dropout_seed).astype(jnp.int32).reshape(1)

    out = _attention(st, q, k, v, bias_p, sinks, q_seg, kv_seg, mask, seed)
    return jnp.swapaxes(out[:, :, :q_len], 1, 2)
