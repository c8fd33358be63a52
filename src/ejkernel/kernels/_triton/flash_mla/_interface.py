"""Multi-head latent attention through a Pallas-Triton kernel (absorbed decode and prefill forward).

`flash_mla_triton` folds `w_kc` into the query (`_common.mla.absorbed_query`), runs `_kernel.attend` over
the latent rows (split over the context when few query rows leave the GPU idle), joins the splits and
sinks (`_kernel.combine`) and expands through `w_vc`. The kernel is a forward: a differentiated call
runs the XLA implementation's forward and backward (`_common.mla.absorbed_attention` over the plain-JAX
flash attention of `_common.flash_attention`, whose custom VJP keeps memory linear), so training through
`platform="triton"` is correct, and inference takes the kernel.

Refused with NotImplementedError (automatic dispatch falls back to XLA): a bias or dense attention mask,
dropout, float64, and latent ranks above `MAX_RANK`.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax.experimental import pallas as pl

from ejkernel.kernels._common.attention import decline, fold_sinks, pad_axes
from ejkernel.kernels._common.device import num_sms
from ejkernel.kernels._common.differentiation import trained_as
from ejkernel.kernels._common.flash_attention.entry import flash_attention_xla
from ejkernel.kernels._common.mla import absorbed_attention, absorbed_query, canonical_call, expand_values
from ejkernel.kernels._triton._helpers import resolve_interpret
from ejkernel.kernels._triton.flash_mla._kernel import TritonFlashMlaStatic, attend, combine, padded_dim

SUPPORTED_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
MAX_RANK = 1024  # the [block_q, rank] float32 accumulator lives in registers
WHO = "triton flash_mla"


def _tiling(params, rows: int, kv_len: int, rank: int):
    """(block_q, block_k, num_warps, num_stages); the defaults keep the `[block_q, rank]` float32
    accumulator at 64 registers a thread and two stages of latent tiles in shared memory."""
    defaults = (64, 64, 4, 2) if rank <= 128 else (32, 64, 8, 2)
    fields = ("block_q", "block_k", "num_warps", "num_stages")
    block_q, block_k, warps, stages = (
        d if params is None or getattr(params, f) is None else getattr(params, f)
        for f, d in zip(fields, defaults, strict=True)
    )
    fit = lambda block, size: min(block, max(16, pl.next_power_of_2(size)))
    return fit(block_q, rows), fit(block_k, kv_len), warps, stages


def _splits(requested, batch: int, row_blocks: int, key_blocks: int) -> int:
    """Context splits: with fewer programs than SMs, as many splits as fill one wave (at least 2 key
    blocks each); a partial second wave would leave most SMs idle while it runs."""
    if requested is not None:
        return max(1, min(requested, key_blocks))
    programs = batch * row_blocks
    sms = num_sms()
    return max(1, min(sms // programs, key_blocks // 2))


def flash_mla_triton(
    query, key_value, w_kc, w_vc, b_q=None, b_k=None, cu_seqlens=None, *, cfg=None, interpret=None, **options
):
    """`[B, Sq, Hq, Dv]` (semantics and options: `flash_mla_reference`) with the attention in one Triton kernel.

    Tiles from `cfg.fwd_params` (`block_q` query rows of (position, head), `block_k` latent rows per
    step, `num_warps`, `num_stages`) and `cfg.num_splits` (context splits; None: enough programs for the
    GPU). `interpret=None` compiles for the GPU (off a GPU it is an error: ask for `interpret=True`).
    """
    call = canonical_call(query, key_value, w_kc, w_vc, b_q, b_k, cu_seqlens, **options)
    dims, attention = call.dims, call.attention
    if jnp.dtype(query.dtype) not in SUPPORTED_DTYPES:
        raise NotImplementedError(f"{WHO} takes float32/bfloat16/float16, got {query.dtype}")
    decline(WHO, {name: options.get(name) is not None for name in ("bias", "attention_mask")})
    decline(WHO, {"dropout": attention.dropout_prob > 0.0})
    if dims.rank > MAX_RANK:
        raise NotImplementedError(f"{WHO} takes latent ranks up to {MAX_RANK}, got {dims.rank}")
    if min(dims.batch, dims.q_len, dims.kv_len, dims.num_heads) == 0:
        raise NotImplementedError(f"{WHO} needs non-empty inputs")

    rows = dims.q_len * dims.num_heads
    block_q, block_k, warps, stages = _tiling(getattr(cfg, "fwd_params", None), rows, dims.kv_len, dims.rank)
    splits = _splits(
        getattr(cfg, "num_splits", None), dims.batch, pl.cdiv(rows, block_q), pl.cdiv(dims.kv_len, block_k)
    )
    st = TritonFlashMlaStatic(
        num_heads=dims.num_heads,
        q_len=dims.q_len,
        kv_len=dims.kv_len,
        rank=dims.rank,
        rope_dim=dims.rope_dim,
        softmax_scale=attention.softmax_scale,
        causal=attention.causal,
        window=attention.sliding_window,
        soft_cap=attention.logits_soft_cap,
        segments=attention.q_segment_ids is not None,
        block_q=block_q,
        block_k=block_k,
        splits=splits,
        num_warps=warps,
        num_stages=stages,
        interpret=resolve_interpret(interpret, WHO),
    )
    q_seg = attention.q_segment_ids
    q_seg_rows = None if q_seg is None else jnp.repeat(q_seg, dims.num_heads, axis=1)

    def forward(query, key_value, w_kc, w_vc, b_q, b_k, softmax_aux):
        sinks = fold_sinks(softmax_aux, dims.num_heads)
        q = absorbed_query(query, w_kc, b_q, b_k, dims).reshape(dims.batch, rows, -1)
        rank_pad, rope_pad = padded_dim(dims.rank) - dims.rank, padded_dim(dims.rope_dim) - dims.rope_dim
        q_lat, kv = pad_axes(q[..., : dims.rank], {2: rank_pad}), pad_axes(key_value, {2: rank_pad})
        q_rope = rope_keys = None
        if dims.rope_dim:
            q_rope, rope_keys = pad_axes(q[..., dims.rank :], {2: rope_pad}), pad_axes(b_k, {2: rope_pad})
        partials, lse = attend(st, q_lat, q_rope, kv, rope_keys, q_seg_rows, attention.kv_segment_ids)
        latent = partials[0] if splits == 1 and sinks is None else combine(partials, lse, sinks, dims.num_heads)
        latent = latent[..., : dims.rank].astype(query.dtype)
        latent = latent.reshape(dims.batch, dims.q_len, dims.num_heads, dims.rank)
        return expand_values(latent, w_vc, dims, query.dtype)

    xla = functools.partial(absorbed_attention, flash_attention_xla, cu_seqlens=cu_seqlens, cfg=None, **options)

    reference = lambda *t: xla(*t[:6], softmax_aux=t[6])
    return trained_as(reference, forward)(query, key_value, w_kc, w_vc, b_q, b_k, options.get("softmax_aux"))
