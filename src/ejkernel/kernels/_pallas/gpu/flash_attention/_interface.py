"""Flash attention through Pallas Mosaic GPU kernels (Hopper): checks, padding, sinks and the custom VJP.

Serves 16-bit query/key/value with head dim 64 or 128, any query/key lengths (padded to tile
multiples, padded keys masked), causal and `(left, right)` windows, grouped-query heads, tanh soft
cap and sink logits. A sink is one more softmax column without a value: the forward adds it to each
row's denominator as it writes the row, and its gradient is a reduction over rows outside the
kernels. Bias, masks, segment ids and dropout are declined (`NotImplementedError`), so automatic
selection falls through to the Triton kernels that serve them. float8 (e4m3) query/key/value run a
forward of their own (`float8_attention`, `_fwd_fp8`), inference only, causal or not and nothing else
(the XLA path serves the rest).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ejkernel.kernels._common.attention import (
    LOG2E,
    attention_vjp,
    bounded_soft_cap,
    check_qkv,
    decline_call,
    fold_sinks,
    pad_axes,
    round_up,
)
from ejkernel.kernels._common.attention_call import AttentionCall
from ejkernel.kernels._common.device import is_hopper
from ejkernel.kernels._common.float8_attention import check_descales, inference_only
from ejkernel.kernels._pallas.gpu.flash_attention._tiling import (
    CTA_ROWS,
    ROWS,
    SMEM_BYTES,
    MosaicGpuFlashStatic,
    float8_smem_bytes,
)
from ejkernel.ops.config import BwdParams, FwdParams

WHO = "mosaic gpu flash_attention"
DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
HEAD_DIMS = (64, 128)
FLOAT8_DTYPES = (jnp.dtype(jnp.float8_e4m3fn),)  # P is rounded to e4m3 too: one 8-bit type for both matmuls


def _forward(st: MosaicGpuFlashStatic, q, k, v, bias, sinks, q_seg, kv_seg, mask, seed):
    from ejkernel.kernels._pallas.gpu.flash_attention._fwd import forward  # loads Mosaic GPU (~0.35 s)

    return forward(st, q, k, v, sinks)


def exp2_unless_empty(x, lse):
    """`2^x`, and 0 on rows whose log-sum-exp is -inf (nothing to weigh: avoids -inf - -inf)."""
    return jnp.where(lse == -jnp.inf, 0.0, jnp.exp2(jnp.where(lse == -jnp.inf, 0.0, x)))


def backward(st: MosaicGpuFlashStatic, q, k, v, sinks, out, lse, do, key_tiles=None, query_tiles=None):
    """The padded backward -> `(dq, dk, dv, dsinks | None)`; `key_tiles` / `query_tiles`: the walks of the
    dQ and dK/dV kernels (default: flash attention's, see `_parts.KeyTiles`)."""
    from ejkernel.kernels._pallas.gpu.flash_attention._bwd import backward_dkv, backward_dq, backward_fused

    rows = "bhsd,bhsd->bhs" if st.heads_major else "bshd,bshd->bhs"
    delta = jnp.einsum(rows, out.astype(jnp.float32), do.astype(jnp.float32))
    lse_b = jnp.where(lse == -jnp.inf, jnp.inf, lse)  # rows with no allowed key: probabilities 0
    if st.fused_bwd:
        dq, dk, dv = backward_fused(st, q, k, v, do, lse_b, delta, query_tiles)
        dq = (dq * st.softmax_scale).astype(q.dtype)
    else:
        dq = backward_dq(st, q, k, v, do, lse_b, delta, key_tiles)
        dk, dv = backward_dkv(st, q, k, v, do, lse_b, delta, query_tiles)
    dsinks = None
    if sinks is not None:
        # d lse'/d sink = 2^(sink - lse'); each row's output moves by -(its delta) per unit of lse'.
        weight = exp2_unless_empty((sinks * LOG2E)[None, :, None] - lse, lse)
        dsinks = -jnp.sum(weight * delta, axis=(0, 2))
    return dq, dk, dv, dsinks


def _backward(st: MosaicGpuFlashStatic, residuals, do):
    q, k, v, _, sinks, _, _, _, _, out, lse = residuals
    dq, dk, dv, dsinks = backward(st, q, k, v, sinks, out, lse, do)
    return dq, dk, dv, None, dsinks


_attention = attention_vjp(_forward, _backward)


def _param(params, name: str, default: int) -> int:
    value = None if params is None else getattr(params, name)
    return default if value is None else value


def check_kernel_tiles(who: str, head_dim: int, blocks: dict[str, int], fwd_step: str, stages: int, stages_bwd: int):
    """NotImplementedError unless the kernels' tiles (`blocks`: rows per step, by parameter name; `fwd_step`
    names the forward's key step) and ring depths fit them."""
    for name, block in blocks.items():
        # 256-row key tiles fit the registers only beside the small accumulators of head dim 64
        allowed_sizes = (64, 128, 256) if name == fwd_step and head_dim == 64 else (64, 128)
        if block not in allowed_sizes:
            raise NotImplementedError(f"{who} takes tiles of {allowed_sizes} rows here, got {name}={block}")
    if min(stages, stages_bwd) < 2:
        raise NotImplementedError(f"{who} needs num_stages >= 2 (one slot loads while one computes)")


def kernel_choices(
    head_dim: int,
    dtype,
    kv_len: int,
    soft_cap: float | None,
    block_k: int,
    block_q_dkv: int,
    stages_bwd: int,
    masked_diagonal: bool,
    causal: bool,
) -> dict:
    """The measured choices of how the kernels run a call: `MosaicGpuFlashStatic` fields from `bounded` to
    `overlap_schedule`.

    `masked_diagonal`: some tiles hold both allowed and masked pairs (causal, windows, partial blocks);
    `causal`: the rows see ever more keys (the causal measurements below).
    """
    bounded = bounded_soft_cap(soft_cap, dtype, kv_len)
    # The soft cap's tanh doubles the forward's special-function work; moving part of the exp2 to the
    # FMA units pays where that unit is the bottleneck (measured on an H200: 3-9% faster with soft cap,
    # 5% slower without). At head dim 64 the soft-capped forward also takes its row sums as P·e₀ on the
    # tensor cores, which frees the FMA units for a larger share (measured on an H100: 0.81 -> 0.85x of
    # the plain kernel non-causal, 0.82 -> 0.83x causal; slower at head dim 128 and without soft cap).
    row_sums_on_tc = soft_cap is not None and head_dim == 64
    fma_share = 0.0 if soft_cap is None else 5 / 8 if row_sums_on_tc else 1 / 4
    exp2_fma_cols = int(block_k * fma_share)
    # At head dim 128 that forward is bound by instruction issue: multiplying q by the tanh's input
    # scale once (rounded to bfloat16, like the inputs themselves) instead of every score measured
    # 6-9% faster on an H200. At head dim 64, with 5/8 of the exp2 on the FMA units, it measured 2-4%
    # faster causal and -5 to +2% non-causal (H100, R = 20): causal only.
    q_prescaled = bounded and (head_dim == 128 or causal)
    # The fused backward computes each score tile once, not twice: it wins where the softmax work
    # (the soft cap's tanh) or the small head dim makes that recomputation dear. It streams 64-row
    # query tiles; at head dim 128 its float32 dQ staging leaves shared memory for two stages only.
    fused_bwd = block_q_dkv == 64 and (head_dim == 64 or (soft_cap is not None and stages_bwd == 2))
    # Issuing tile t's Q·Kᵀ beside tile t-1's P·V hides the softmax behind the tensor cores at head
    # dim 128 (measured on an H100: non-causal forward 0.93-0.96 -> 1.04-1.06x cuDNN). Where diagonal
    # tiles are masked the warpgroups had better still take turns at the tensor cores (causal: 1-3%
    # faster than free-running). At head dim 64 and with the soft cap's tanh it measured slower.
    overlap = head_dim == 128 and soft_cap is None
    overlap_schedule = masked_diagonal
    return dict(
        bounded=bounded,
        exp2_fma_cols=exp2_fma_cols,
        row_sums_on_tc=row_sums_on_tc,
        q_prescaled=q_prescaled,
        fused_bwd=fused_bwd,
        overlap=overlap,
        overlap_schedule=overlap_schedule,
    )


def _served_shapes(query, key, value, dtypes, fwd_params) -> tuple:
    """`check_qkv`'s dimensions of a call the kernels serve: `dtypes`, equal head dims in `HEAD_DIMS`, non-empty,
    `ROWS` query rows a warpgroup; NotImplementedError (one line) for what they do not."""
    dims = check_qkv(query, key, value, who=WHO, dtypes=dtypes, max_head_dim=max(HEAD_DIMS))
    batch, q_len, kv_len, num_heads, _, head_dim, value_dim = dims
    if head_dim != value_dim or head_dim not in HEAD_DIMS:
        raise NotImplementedError(f"{WHO} needs query/key/value head dims in {HEAD_DIMS}, got {head_dim}/{value_dim}")
    if min(batch, q_len, kv_len, num_heads) == 0:
        raise NotImplementedError(f"{WHO} needs non-empty inputs")
    if fwd_params is not None and fwd_params.block_q not in (None, ROWS):
        raise NotImplementedError(f"{WHO}: a warpgroup owns {ROWS} query rows, got block_q={fwd_params.block_q}")
    return dims


def plan(
    query, key, value, softmax_aux, *, softmax_scale, causal, sliding_window, fwd_params, bwd_params, soft_cap=None
):
    """Checks what the kernels serve; returns `(MosaicGpuFlashStatic, padded q, k, v, folded sinks)`."""
    _, q_len, kv_len, num_heads, num_kv_heads, head_dim, _ = _served_shapes(query, key, value, DTYPES, fwd_params)
    # At head dim 64 the forward is bound by its exp2s: 256-key tiles halve the per-tile overheads
    # (measured on an H200: non-causal forward 0.92 -> 0.98x cuDNN), but waste work on masked
    # diagonal tiles (causal 0.91 -> 0.84x).
    wide = head_dim == 64 and not causal and sliding_window is None
    block_k = _param(fwd_params, "block_k", 256 if wide else 128)
    block_k_dq = _param(bwd_params, "block_k", 64)
    block_q_dkv = _param(bwd_params, "block_q", 64)
    blocks = {"fwd_params.block_k": block_k, "bwd_params.block_k": block_k_dq, "bwd_params.block_q": block_q_dkv}
    stages = _param(fwd_params, "num_stages", 2)
    stages_bwd = _param(bwd_params, "num_stages", 2)
    check_kernel_tiles(WHO, head_dim, blocks, "fwd_params.block_k", stages, stages_bwd)
    masked_diagonal = bool(causal) or sliding_window is not None
    choices = kernel_choices(
        head_dim, query.dtype, kv_len, soft_cap, block_k, block_q_dkv, stages_bwd, masked_diagonal, bool(causal)
    )
    q_pad = round_up(q_len, CTA_ROWS) - q_len
    # Two query tiles per CTA (the longest and the shortest rows of a causal head) give every CTA the
    # same work and load the second tile while the first ends. That pays where CTAs are short: at head
    # dim 64 and up to 16 tiles per head (measured on an H100, causal forward: S=1024 0.90 -> 0.98x
    # cuDNN, S=2048 0.95 -> 0.98x; S=4096 and 8192 1-3% slower, head dim 128 up to 5% slower). The
    # second tile's 32 KiB of shared memory fits beside a key/value ring of up to 512 keys.
    num_q_tiles = (q_len + q_pad) // CTA_ROWS
    short_causal = causal and sliding_window is None and head_dim == 64 and num_q_tiles <= 16
    paired = short_causal and num_q_tiles % 2 == 0 and stages * block_k <= 512
    st = MosaicGpuFlashStatic(
        softmax_scale=float(softmax_scale),
        soft_cap=None if soft_cap is None else float(soft_cap),
        causal=bool(causal),
        window=None if sliding_window is None else (int(sliding_window[0]), int(sliding_window[1])),
        q_len=q_len,
        kv_len=kv_len,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        block_k=block_k,
        stages=stages,
        block_k_dq=block_k_dq,
        block_q_dkv=block_q_dkv,
        stages_bwd=stages_bwd,
        q_tiles_per_cta=2 if paired else 1,
        **choices,
    )
    q = pad_axes(query, {1: q_pad})
    kv_pad = st.kv_len_padded - kv_len
    k, v = pad_axes(key, {1: kv_pad}), pad_axes(value, {1: kv_pad})
    return st, q, k, v, fold_sinks(softmax_aux, num_heads)


def mosaic_attention(query, key, value, softmax_aux=None, *, fwd_params=None, bwd_params=None, **options):
    """The kernels' differentiable attention without the device check (lets CPU tests lower it for CUDA)."""
    st, q, k, v, sinks = plan(query, key, value, softmax_aux, fwd_params=fwd_params, bwd_params=bwd_params, **options)
    out = _attention(st, q, k, v, None, sinks, None, None, None, None)
    return out if out.shape[1] == st.q_len else out[:, : st.q_len]


def float8_attention(
    query,
    key,
    value,
    descales,
    *,
    softmax_scale,
    causal,
    fwd_params=None,
    overlap=None,
    overlap_schedule=None,
    exp2_fma_cols=0,
):
    """e4m3 attention through the float8 forward (`_fwd_fp8`): `descales` as `check_descales` returns them;
    bfloat16 out, inference only. Without the device check (CPU tests lower it for CUDA and interpret it).

    `overlap`: the overlapped schedule instead of the ping-pong (`MosaicGpuFlashStatic.overlap`; None: on without
    a mask, off causal, as measured on an H200 at H 16, D 128 in session 48: non-causal 766-785 TFLOP/s overlapped
    at 2 x 8192 and 1 x 16384, causal 652-695 with the ping-pong); `overlap_schedule`: whether its warpgroups take
    turns at issuing (None: where causal). `exp2_fma_cols`: columns of each score tile whose exp2 runs on the FMA
    units (`MosaicGpuFlashStatic.exp2_fma_cols`; at e4m3's matmul rate the special-function unit's exp2s take as
    long as the matmuls).
    `fwd_params` may set `block_k` (64 or 128) and `num_stages` (2 or more, as
    shared memory allows).
    """
    _, q_len, kv_len, num_heads, num_kv_heads, head_dim, _ = _served_shapes(
        query, key, value, FLOAT8_DTYPES, fwd_params
    )
    overlap = not causal if overlap is None else bool(overlap)
    block_k = _param(fwd_params, "block_k", 128)
    stages = _param(fwd_params, "num_stages", 2)
    if block_k not in (64, 128) or stages < 2:  # (P·V's K is block_k: at most 128 bytes of e4m3, one swizzled row)
        raise NotImplementedError(f"{WHO}: float8 takes block_k 64 or 128 and num_stages >= 2, got {block_k}, {stages}")
    if not 0 <= exp2_fma_cols <= block_k or exp2_fma_cols % 16:
        raise ValueError(f"exp2_fma_cols must be a multiple of 16 in [0, block_k={block_k}], got {exp2_fma_cols}")
    smem = float8_smem_bytes(head_dim, block_k, stages)
    if smem > SMEM_BYTES:
        raise NotImplementedError(
            f"{WHO}: float8 at block_k={block_k}, num_stages={stages} needs {smem // 1024} KiB "
            f"of shared memory, more than {SMEM_BYTES // 1024}"
        )
    st = MosaicGpuFlashStatic(
        softmax_scale=float(softmax_scale),
        soft_cap=None,
        causal=bool(causal),
        window=None,
        q_len=q_len,
        kv_len=kv_len,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        block_k=block_k,
        stages=stages,
        block_k_dq=64,
        block_q_dkv=64,
        stages_bwd=2,
        exp2_fma_cols=int(exp2_fma_cols),
        overlap=bool(overlap),
        overlap_schedule=bool(causal) if overlap_schedule is None else bool(overlap_schedule),
    )
    q_descale, k_descale, v_descale = descales
    group = num_heads // num_kv_heads
    logit_scale = softmax_scale * LOG2E * q_descale * jnp.repeat(k_descale, group)
    rows = jnp.stack([logit_scale, jnp.repeat(v_descale, group)], axis=1)  # [H, 2]
    scales = jnp.broadcast_to(rows[:, :, None], (num_heads, 2, ROWS)).astype(jnp.float32)

    def run(q, k, v, scales):
        from ejkernel.kernels._pallas.gpu.flash_attention import _fwd_fp8  # loads Mosaic GPU

        q = pad_axes(q, {1: round_up(q_len, CTA_ROWS) - q_len})
        k, v = (pad_axes(x, {1: st.kv_len_padded - kv_len}) for x in (k, v))
        return _fwd_fp8.forward_fp8(st, q, k, _fwd_fp8.v_transposed(v), scales)[:, :q_len]

    return inference_only(run)(query, key, value, scales)


def flash_attention_mosaic_gpu(
    query,
    key,
    value,
    bias,
    softmax_aux,
    call: AttentionCall,
    *,
    fwd_params: FwdParams | None = None,
    bwd_params: BwdParams | None = None,
    descales=None,
):
    """Canonical flash-attention contract (see `ejkernel.reference.flash_attention`) on Hopper GPUs, options
    in `call`.

    Differentiable in query, key, value and softmax_aux. float8 query/key/value come with `descales`
    (`q [H], k [Hkv], v [Hkv]` float32) and run the float8 forward, inference only, causal or not, nothing
    else. Raises NotImplementedError for what the kernels do not serve, before anything is traced.
    """
    descales = check_descales(WHO, query, key, descales)
    serves = ("causal",) if descales is not None else ("causal", "sliding_window", "logits_soft_cap")
    decline_call(
        WHO, call, serves=serves, bias=bias is not None, sinks=descales is not None and softmax_aux is not None
    )
    if not is_hopper():
        device = jax.devices()[0].device_kind
        raise NotImplementedError(f"{WHO} needs a Hopper GPU (compute capability 9.x), not {device}")
    if descales is not None:
        return float8_attention(
            query, key, value, descales, softmax_scale=call.softmax_scale, causal=call.causal, fwd_params=fwd_params
        )
    return mosaic_attention(
        query,
        key,
        value,
        softmax_aux,
        softmax_scale=call.softmax_scale,
        causal=call.causal,
        sliding_window=call.sliding_window,
        soft_cap=call.logits_soft_cap,
        fwd_params=fwd_params,
        bwd_params=bwd_params,
    )
