"""Flash attention through Pallas-Triton kernels: the canonical entry point and its custom VJP.

`flash_attention_triton` checks what the kernels can serve (raising `NotImplementedError` before any
kernel is traced, so automatic dispatch can fall back), pads sequence lengths to block multiples and
head dims to powers of two (only when needed; plain jnp, so autodiff slices the gradients back), folds
the sink logits into one log-sum-exp per head, and calls the differentiable core.

Layout stays `[B, S, H, D]` throughout; grouped-query heads read their key/value head through the
kernels' index maps, never through a repeated copy.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax.experimental import pallas as pl

from ejkernel.kernels._common import SMEM_BYTES
from ejkernel.kernels._common.attention import (
    attention_lse_vjp,
    attention_vjp,
    bounded_soft_cap,
    check_options,
    check_qkv,
    checked_zero_offset,
    fold_sinks,
    pad_axes,
    round_up,
)
from ejkernel.kernels._common.attention_call import AttentionCall
from ejkernel.kernels._triton._helpers import resolve_interpret
from ejkernel.kernels._triton.flash_attention._bwd import backward, natural_lse
from ejkernel.kernels._triton.flash_attention._fwd import TritonFlashStatic, TritonFlashTiling, forward
from ejkernel.ops.config import BwdParams, FwdParams

SUPPORTED_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
MAX_HEAD_DIM = 256
MIN_BLOCK = 16  # smallest tile edge the Triton matmuls take
WHO = "triton flash_attention"


# Shared memory per thread block on H100/H200; the software pipeline keeps `num_stages` copies of each
# loop step's loaded tiles there. Defaults are shrunk to leave Triton headroom for its own scratch;
# an explicit tiling is refused only when its tiles alone cannot fit.
DEFAULT_SMEM_BUDGET = SMEM_BYTES - 16 * 1024


def default_fwd_tiling(head_dim: int) -> TritonFlashTiling:
    """Forward (block_q, block_k, num_warps, num_stages): best of a sweep on an H200 (bf16, no bias)."""
    if head_dim <= 64:
        return TritonFlashTiling(64, 64, 4, 3)
    if head_dim <= 128:
        return TritonFlashTiling(128, 128, 8, 3)
    return TritonFlashTiling(64, 32, 4, 2)


def default_bwd_tiling(head_dim: int) -> TritonFlashTiling:
    """Both backward kernels' tiling: best of a sweep on an H200 (bf16, no bias)."""
    if head_dim <= 128:
        return TritonFlashTiling(64, 64, 4, 2)
    return TritonFlashTiling(64, 32, 4, 2)


def smem_estimate(
    t: TritonFlashTiling, *, streamed_q: bool, head_dim: int, value_dim: int, itemsize: int, logit_bytes: int
):
    """Bytes of pipelined tile buffers: per stage, the streamed rows of two operands plus bias/mask tiles.

    The forward and dQ kernels stream key/value rows (`block_k`); the dK/dV kernel streams query and
    output-gradient rows (`block_q`, with their logsumexp and delta).
    """
    rows = t.block_q if streamed_q else t.block_k
    per_stage = rows * ((head_dim + value_dim) * itemsize + (8 if streamed_q else 0))
    per_stage += t.block_q * t.block_k * logit_bytes
    return t.num_stages * per_stage


def _tiling(
    params: FwdParams | None, default: TritonFlashTiling, q_len: int, kv_len: int, streams: tuple[bool, ...], **sizes
):
    fields = ("block_q", "block_k", "num_warps", "num_stages")
    given = {f: getattr(params, f) for f in fields if params is not None and getattr(params, f) is not None}
    t = TritonFlashTiling(**{f: given.get(f, getattr(default, f)) for f in fields})
    if min(t.block_q, t.block_k) < MIN_BLOCK:
        raise NotImplementedError(
            f"triton flash_attention needs block sizes >= {MIN_BLOCK}, got {t.block_q}x{t.block_k}"
        )
    # Short sequences get a smaller tile rather than mostly padding.
    t = dataclasses.replace(
        t,
        block_q=min(t.block_q, max(MIN_BLOCK, pl.next_power_of_2(q_len))),
        block_k=min(t.block_k, max(MIN_BLOCK, pl.next_power_of_2(kv_len))),
    )

    def need(t):
        return max(smem_estimate(t, streamed_q=s, **sizes) for s in streams)

    while need(t) > DEFAULT_SMEM_BUDGET:  # shrink what the caller left to the defaults
        if t.num_stages > 2 and "num_stages" not in given:
            t = dataclasses.replace(t, num_stages=t.num_stages - 1)
        elif t.block_k >= t.block_q and t.block_k > MIN_BLOCK and "block_k" not in given:
            t = dataclasses.replace(t, block_k=t.block_k // 2)
        elif t.block_q > MIN_BLOCK and "block_q" not in given:
            t = dataclasses.replace(t, block_q=t.block_q // 2)
        elif t.block_k > MIN_BLOCK and "block_k" not in given:
            t = dataclasses.replace(t, block_k=t.block_k // 2)
        else:
            break
    if need(t) > SMEM_BYTES:
        raise NotImplementedError(
            f"triton flash_attention tiling {t} needs about {need(t) // 1024} KiB of shared memory "
            f"(at most {SMEM_BYTES // 1024} KiB)"
        )
    return t


_attention = attention_vjp(forward, backward)
_attention_with_lse = attention_lse_vjp(forward, backward, natural_lse)


def plan(
    query,
    key,
    value,
    bias,
    softmax_aux,
    call: AttentionCall,
    *,
    fwd_params: FwdParams | None = None,
    bwd_params: BwdParams | None = None,
    interpret: bool | None = None,
):
    """Checks a call and prepares it for the kernels: `(st, operands, (q_len, value_dim))`.

    `operands` are `(q, k, v, bias, sinks, q_seg, kv_seg, mask, seed)`, padded as the tiles need, for
    `forward` / `backward` or the custom VJP; the true output is `[:, :q_len, :, :value_dim]` of theirs.
    Raises NotImplementedError for what the kernels cannot serve, before any kernel is traced.
    """
    # ---- what the kernels cannot serve: refuse before tracing anything ----
    batch, q_len, kv_len, num_heads, num_kv_heads, head_dim, value_dim = check_qkv(
        query, key, value, who=WHO, dtypes=SUPPORTED_DTYPES, max_head_dim=MAX_HEAD_DIM
    )
    if min(q_len, kv_len, batch, num_heads) == 0:
        raise NotImplementedError(f"{WHO} needs non-empty inputs")
    check_options(
        batch,
        num_heads,
        q_len,
        kv_len,
        who=WHO,
        dtypes=SUPPORTED_DTYPES,
        sink_dtypes=SUPPORTED_DTYPES,
        seq_broadcast=False,  # the kernels read bias / mask tiles as they are
        bias=bias,
        softmax_aux=softmax_aux,
        call=call,
    )
    window, logits_soft_cap, attention_mask = call.sliding_window, call.logits_soft_cap, call.attention_mask

    sizes = dict(
        head_dim=max(MIN_BLOCK, pl.next_power_of_2(head_dim)),
        value_dim=max(MIN_BLOCK, pl.next_power_of_2(value_dim)),
        itemsize=jnp.dtype(query.dtype).itemsize,
        logit_bytes=(0 if bias is None else jnp.dtype(bias.dtype).itemsize) + (attention_mask is not None),
    )
    widest = max(head_dim, value_dim)
    fwd = _tiling(fwd_params, default_fwd_tiling(widest), q_len, kv_len, (False,), **sizes)
    bwd = _tiling(bwd_params, default_bwd_tiling(widest), q_len, kv_len, (False, True), **sizes)
    interpret = resolve_interpret(interpret, WHO)
    st = TritonFlashStatic(
        softmax_scale=call.softmax_scale,
        causal=call.causal,
        window=window,
        soft_cap=logits_soft_cap,
        dropout_prob=call.dropout_prob,
        q_len=q_len,
        kv_len=kv_len,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        fwd=fwd,
        bwd=bwd,
        bwd_dq=bwd,
        interpret=bool(interpret),
        # tanh.approx's ~5e-4 relative error is below 16-bit input precision; float32 keeps the exact tanh.
        fast_tanh=not interpret and query.dtype != jnp.float32,
        bounded=bias is None and bounded_soft_cap(logits_soft_cap, query.dtype, kv_len),
        # Only where every real query row has an allowed key (key 0, or its own position in a window):
        # an empty row would send every program to the redo.
        checked_zero_offset=logits_soft_cap is None
        and bias is None
        and not call.segments
        and attention_mask is None
        and (window is None or q_len <= kv_len)
        and checked_zero_offset(query.dtype, kv_len),
    )

    # ---- pad to what the tiles need (no copy when shapes already fit) ----
    q_pad = round_up(q_len, max(fwd.block_q, bwd.block_q)) - q_len
    kv_pad = round_up(kv_len, max(fwd.block_k, bwd.block_k)) - kv_len
    d_pad = max(MIN_BLOCK, pl.next_power_of_2(head_dim)) - head_dim
    dv_pad = max(MIN_BLOCK, pl.next_power_of_2(value_dim)) - value_dim
    q = pad_axes(query, {1: q_pad, 3: d_pad})
    k = pad_axes(key, {1: kv_pad, 3: d_pad})
    v = pad_axes(value, {1: kv_pad, 3: dv_pad})
    bias_p = pad_axes(bias, {2: q_pad, 3: kv_pad})
    mask = None
    if attention_mask is not None:
        mask = pad_axes(jnp.asarray(attention_mask, jnp.bool_).astype(jnp.int8), {2: q_pad, 3: kv_pad})
    q_seg = kv_seg = None
    if call.segments:
        q_seg = pad_axes(jnp.asarray(call.q_segment_ids, jnp.int32), {1: q_pad}, value=-1)
        kv_seg = pad_axes(jnp.asarray(call.kv_segment_ids, jnp.int32), {1: kv_pad}, value=-1)
    sinks = fold_sinks(softmax_aux, num_heads)
    seed = None
    if call.dropout_prob > 0.0:
        seed = jnp.asarray(call.dropout_seed).astype(jnp.uint32).reshape(1)

    return st, (q, k, v, bias_p, sinks, q_seg, kv_seg, mask, seed), (q_len, value_dim)


def flash_attention_triton(
    query,
    key,
    value,
    bias,
    softmax_aux,
    call: AttentionCall,
    *,
    fwd_params: FwdParams | None = None,
    bwd_params: BwdParams | None = None,
    interpret: bool | None = None,
    return_lse: bool = False,
):
    """Exact attention `[B, Sq, H, D] x [B, Sk, Hkv, D] x [B, Sk, Hkv, Dv] -> [B, Sq, H, Dv]`.

    Canonical flash-attention contract (see `ejkernel.reference.flash_attention`), options in `call`: optional additive
    `bias [1|B, 1|H, Sq, Sk]`, sink logits `softmax_aux` (length H: one per head, else shared), segment
    ids (negative = padding), boolean `attention_mask [1|B, 1|H, Sq, Sk]`, causal and `(left, right)`
    sliding-window masks, tanh soft cap and counter-based dropout. Differentiable in query, key,
    value, bias and softmax_aux. `interpret=None` compiles for the GPU (off a GPU: an error; pass
    `interpret=True` for Pallas interpret mode). `return_lse=True` also returns each row's log-sum-exp
    `[B, Sq, H]` float32 (natural log, sinks included, -inf for a row with neither key nor sink), itself
    differentiable, as the reference's step 8 defines it.

    Raises NotImplementedError for what the kernels cannot serve (dtype, head dim, tile sizes).
    """
    st, operands, (q_len, value_dim) = plan(
        query,
        key,
        value,
        bias,
        softmax_aux,
        call,
        fwd_params=fwd_params,
        bwd_params=bwd_params,
        interpret=interpret,
    )
    if return_lse:
        out, lse = _attention_with_lse(st, *operands)
        return out[:, :q_len, :, :value_dim], jnp.swapaxes(lse[:, :, :q_len], 1, 2)
    out = _attention(st, *operands)
    if out.shape[1] != q_len or out.shape[3] != value_dim:
        out = out[:, :q_len, :, :value_dim]
    return out
