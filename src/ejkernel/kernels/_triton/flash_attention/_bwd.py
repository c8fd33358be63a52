"""Flash attention backward (FlashAttention-2 style), as two Pallas-Triton kernels.

With `delta = rowsum(dO * O)` precomputed (plain jnp), P is recomputed from the base-2 logsumexp and

    dV = (P∘Z)ᵀ dO,   dP = (dO Vᵀ)∘Z,   dS = P∘(dP − delta),   dQ = scale·(dS∘C) K,   dK = scale·(dS∘C)ᵀ Q

(Z the dropout keep mask over 1 − rate, C = 1 − tanh² the soft-cap derivative, 1 without a cap;
dBias = dS). Sinks only enter through the logsumexp, so dS needs no change for them; their own
gradient is `−Σ exp(sink − lse)·delta`, taken in the wrapper.

- dK/dV kernel: one program per (key block, batch, key/value head). It holds its `[block_k, D]` K and V
  tiles and loops over every query head of its group and the query blocks that can see the key
  block, accumulating dK and dV in registers: K and V are never repeated and no per-query-head dK/dV
  buffer exists. Tiles are computed transposed (`[block_k, block_q]`), so P and dS feed the matmuls
  without any register transpose.
- dQ kernel: one program per (query block, batch, query head), looping over the key blocks that can
  hold allowed keys, like the forward. It also writes dBias (dS tiles), zeros for skipped blocks.

Both skip fully masked blocks and apply positional masks only on edge blocks, like the forward.

Large logits. The forward gives each row's logsumexp L as (offset, rest), exact; the kernels take one
float32 `lse`, L rounded, and recompute P' = 2^(logit - lse) = P·2^-e with e = lse - L, up to ~0.002 at
|logit| ~ 4e4 (where the ulp is ~0.004): dropped, that row factor put dV off by 2.5e-3 there, 0.33 near
1e7. The wrapper scales each row of dO (and so delta) by 2^e instead, which gives the exact dV and dS
from P' (dS = P'·(dP·2^e - delta·2^e)), so the kernels' loops keep one operation per element for the
exponent (taking the offset and rest apart there cost the backward 8-15% on an H200). Without soft cap
or bias that operation is logit·scale - lse with the product unrounded (an FMA), as the forward's
denominator is exact relative to the offset.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from ejkernel.kernels._common.attention import LOG2E, Operands, RefReader, sum_to_bias_shape
from ejkernel.kernels._common.vma import out_struct
from ejkernel.kernels._triton._helpers import (
    and_masks,
    dot,
    exp2,
    kv_blocks_for_q_block,
    position_mask,
    q_blocks_for_kv_block,
    segment_guarded,
    segment_span,
)
from ejkernel.kernels._triton.flash_attention._fwd import (
    TritonFlashStatic,
    TritonFlashTiling,
    key_block_logits,
    logits_base2,
    needs_edges,
    query_block_index,
    query_block_operands,
    raw_logits,
)
from ejkernel.reference.dropout import dropout_keep


def _split12(c: float) -> tuple[float, float]:
    """A float32 constant as hi + lo, each of at most 12 significant bits: products with 12-bit halves are exact."""
    c32 = np.float32(c)
    hi = (c32.view(np.uint32) & np.uint32(0xFFFFF000)).view(np.float32)
    return float(hi), float(np.float32(c32 - hi))


def _halves(x):
    """x as hi + lo (exactly), each of at most 12 significant bits."""
    hi = lax.reduce_precision(x, exponent_bits=8, mantissa_bits=11)
    return hi, x - hi


def _scaled_minus(x, scale: float, lse, *, interpret: bool):
    """x·scale - lse with the product unrounded (one FMA): its ulp at |logit| ~ 4e4 would be ~0.004.

    Compiled: one `fma.rn.f32` (an explicit instruction, so it cannot be left uncontracted). Interpreted:
    the same value from exact 12-bit half products. `x` may be -inf (masked) and `lse` +inf (empty row).
    """
    lse = jnp.broadcast_to(lse, x.shape)
    if not interpret:
        scale_bits = np.float32(scale).view(np.uint32)
        [y] = plgpu.elementwise_inline_asm(
            f"fma.rn.f32 $0, $1, 0f{int(scale_bits):08X}, $2;",
            args=[x, -lse],
            constraints="=f,f,f",
            pack=1,
            result_shape_dtypes=[jax.ShapeDtypeStruct(x.shape, jnp.float32)],
        )
        return y
    c_hi, c_lo = _split12(scale)
    x_hi, x_lo = _halves(x)
    y = ((x_hi * c_hi - lse) + (x_lo * c_hi + x_hi * c_lo)) + x_lo * c_lo
    return jnp.where(x == -jnp.inf, -jnp.inf, y)


def _weights(x, lse, st: TritonFlashStatic, raw: bool):
    """P' = 2^(logit - lse) of a logit tile (raw `q·k` when `raw`, else base 2); lse = +inf gives 0."""
    x = _scaled_minus(x, st.softmax_scale * LOG2E, lse, interpret=st.interpret) if raw else x - lse
    return exp2(x, interpret=st.interpret)


def single_lse(st: TritonFlashStatic, offset, rest, raw: bool):
    """The forward's (offset, rest) -> (lse, e): the base-2 logsumexp L = offset·scale·log2(e) + rest
    (offset + rest without `raw`) rounded to one float32, and e = lse - L to float32 precision."""
    big, mid, tiny = offset, 0.0, 0.0
    if raw:  # offset·scale = big + mid + tiny, each an exact product of halves
        c_hi, c_lo = _split12(st.softmax_scale * LOG2E)
        o_hi, o_lo = _halves(offset)
        big, mid, tiny = o_hi * c_hi, o_lo * c_hi + o_hi * c_lo, o_lo * c_lo
    lse = big + (mid + (rest + tiny))
    # Each step below is exact until the values are as small as rest: lse is near big (or both are small)
    # and mid cancels what is left of the product.
    e = (((lse - big) - mid) - rest) - tiny
    empty = rest == jnp.inf
    return jnp.where(empty, jnp.inf, lse), jnp.where(empty, 0.0, e)


def _dq_kernel(
    *refs, st: TritonFlashStatic, tiling: TritonFlashTiling, ops: Operands, num_q_blocks: int, kv_len_padded: int
):
    read = RefReader(refs)
    q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref = (read() for _ in range(6))
    bias_ref, mask_ref = read(ops.bias), read(ops.mask)
    q_seg_ref, kv_seg_ref = read(ops.segments), read(ops.segments)
    seed_ref = read(ops.dropout)
    dq_ref = read()
    dbias_ref = read(ops.bias)

    block_q, block_k = tiling.block_q, tiling.block_k
    qi = query_block_index(pl.program_id(0), num_q_blocks, st.causal)
    b, h = pl.program_id(1), pl.program_id(2)
    q_start = qi * block_q
    q_pos = q_start + jnp.arange(block_q, dtype=jnp.int32)[:, None]
    q, do = q_ref[...], do_ref[...]
    lse, delta = lse_ref[...][:, None], delta_ref[...][:, None]
    q_seg = q_seg_ref[...][:, None] if ops.segments else None
    seed = seed_ref[...] if ops.dropout else None
    batch_head = b * st.num_heads + h
    keep_scale = 1.0 / (1.0 - st.dropout_prob) if ops.dropout else 1.0
    raw = raw_logits(st, ops.bias)

    logits = functools.partial(
        key_block_logits,
        st=st,
        ops=ops,
        raw=raw,
        block_k=block_k,
        q_pos=q_pos,
        q_seg=q_seg,
        kv_len_padded=kv_len_padded,
        refs=(k_ref, bias_ref, kv_seg_ref, mask_ref),
    )

    def step(kb, dq, edge: bool):
        cols, k_pos, k, x, t = logits(kb, q, edge)
        p = _weights(x, lse, st, raw)  # lse = +inf on empty rows: p = 0 there
        dp = dot(do, v_ref[cols, :], trans_b=True)
        if ops.dropout:
            keep = dropout_keep(seed, batch_head, q_pos, k_pos, st.dropout_prob)
            dp = jnp.where(keep, dp * keep_scale, 0.0)
        ds = p * (dp - delta)
        if ops.bias:
            dbias_ref[:, cols] = ds.astype(dbias_ref.dtype)
        if t is not None:
            ds = ds * (1.0 - t * t)
        return dq + dot(ds.astype(k.dtype), k)

    def zero_dbias(kb, carry):
        cols = pl.ds(pl.multiple_of(kb * block_k, block_k), block_k)
        dbias_ref[:, cols] = jnp.zeros((block_q, block_k), dbias_ref.dtype)
        return carry

    dq = jnp.zeros((block_q, q_ref.shape[-1]), jnp.float32)
    edge_step = functools.partial(step, edge=True)
    interior_step = functools.partial(step, edge=False)
    if ops.segments and not ops.bias:  # with a bias, every visited block must write its dBias tile
        q_span = segment_span(q_seg_ref[...])
        edge_step = segment_guarded(edge_step, q_span, kv_seg_ref, block_k)
        interior_step = segment_guarded(interior_step, q_span, kv_seg_ref, block_k)
    num_k_blocks = kv_len_padded // block_k
    if needs_edges(st, kv_len_padded):
        lo, mid_lo, mid_hi, hi = kv_blocks_for_q_block(
            q_start, block_q=block_q, block_k=block_k, kv_len=st.kv_len, causal=st.causal, window=st.window
        )
        if st.window is not None:
            dq = lax.fori_loop(lo, mid_lo, edge_step, dq)
        dq = lax.fori_loop(mid_lo, mid_hi, interior_step, dq)
        dq = lax.fori_loop(mid_hi, hi, edge_step, dq)
        if ops.bias:  # dBias is dense: the skipped (fully masked) blocks get zeros
            lax.fori_loop(0, lo, zero_dbias, 0)
            lax.fori_loop(hi, num_k_blocks, zero_dbias, 0)
    else:
        dq = lax.fori_loop(0, num_k_blocks, interior_step, dq)
    dq_ref[...] = (dq * st.softmax_scale).astype(dq_ref.dtype)


def _dkv_kernel(*refs, st: TritonFlashStatic, tiling: TritonFlashTiling, ops: Operands, kv_len_padded: int):
    read = RefReader(refs)
    q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref = (read() for _ in range(6))
    bias_ref, mask_ref = read(ops.bias), read(ops.mask)
    q_seg_ref, kv_seg_ref = read(ops.segments), read(ops.segments)
    seed_ref = read(ops.dropout)
    dk_ref, dv_ref = read.rest()

    block_q, block_k, group = tiling.block_q, tiling.block_k, st.group
    kb, b, hkv = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    k_start = kb * block_k
    k_pos = k_start + jnp.arange(block_k, dtype=jnp.int32)[:, None]  # keys are the rows here
    k, v = k_ref[...], v_ref[...]
    kv_seg = kv_seg_ref[...][:, None] if ops.segments else None
    seed = seed_ref[...] if ops.dropout else None
    keep_scale = 1.0 / (1.0 - st.dropout_prob) if ops.dropout else 1.0
    raw = raw_logits(st, ops.bias)

    def tile_t(ref, per_head: bool, g, rows):
        """A `[block_q, block_k]` tile of a bias-like operand, transposed to `[block_k, block_q]`."""
        return (ref[g, rows, :] if per_head else ref[rows, :]).T

    def step(qb, carry, g, edge: bool):
        dk, dv = carry
        q_start = pl.multiple_of(qb * block_q, block_q)
        rows = pl.ds(q_start, block_q)
        q, do = q_ref[rows, g, :], do_ref[rows, g, :]
        lse, delta = lse_ref[g, rows][None, :], delta_ref[g, rows][None, :]
        x, t = dot(k, q, trans_b=True), None  # [block_k, block_q]
        if not raw:
            x, t = logits_base2(x, tile_t(bias_ref, ops.bias_heads, g, rows) if ops.bias else None, st)
        q_pos = q_start + jnp.arange(block_q, dtype=jnp.int32)[None, :]
        allowed = and_masks(
            position_mask(
                q_pos, k_pos, kv_len=st.kv_len, kv_len_padded=kv_len_padded, causal=st.causal, window=st.window
            )
            if edge
            else None,
            ((kv_seg == q_seg_ref[rows][None, :]) & (kv_seg >= 0)) if ops.segments else None,
            (tile_t(mask_ref, ops.mask_heads, g, rows) != 0) if ops.mask else None,
        )
        if allowed is not None:
            x = jnp.where(allowed, x, -jnp.inf)
        p = _weights(x, lse, st, raw)
        dp = dot(v, do, trans_b=True)
        if ops.dropout:
            keep = dropout_keep(seed, b * st.num_heads + hkv * group + g, q_pos, k_pos, st.dropout_prob)
            p_kept = jnp.where(keep, p * keep_scale, 0.0)
            dp = jnp.where(keep, dp * keep_scale, 0.0)
        else:
            p_kept = p
        dv = dv + dot(p_kept.astype(do.dtype), do)
        ds = p * (dp - delta)
        if t is not None:
            ds = ds * (1.0 - t * t)
        dk = dk + dot(ds.astype(q.dtype), q)
        return dk, dv

    num_q_blocks = -(-st.q_len // block_q)  # blocks of padding rows only have dO = 0: skipped
    if needs_edges(st, kv_len_padded):
        lo, mid_lo, mid_hi, hi = q_blocks_for_kv_block(
            k_start,
            block_q=block_q,
            block_k=block_k,
            q_len=st.q_len,
            kv_len=st.kv_len,
            causal=st.causal,
            window=st.window,
        )
    else:
        lo, mid_lo, mid_hi, hi = 0, 0, num_q_blocks, num_q_blocks

    kv_span = segment_span(kv_seg_ref[...]) if ops.segments else None

    def head(g, carry):
        edge_step = functools.partial(step, g=g, edge=True)
        interior_step = functools.partial(step, g=g, edge=False)
        if ops.segments:
            edge_step = segment_guarded(edge_step, kv_span, q_seg_ref, block_q)
            interior_step = segment_guarded(interior_step, kv_span, q_seg_ref, block_q)
        if needs_edges(st, kv_len_padded):
            carry = lax.fori_loop(lo, mid_lo, edge_step, carry)
        carry = lax.fori_loop(mid_lo, mid_hi, interior_step, carry)
        if needs_edges(st, kv_len_padded):
            carry = lax.fori_loop(mid_hi, hi, edge_step, carry)
        return carry

    carry = (jnp.zeros((block_k, k_ref.shape[-1]), jnp.float32), jnp.zeros((block_k, v_ref.shape[-1]), jnp.float32))
    carry = head(0, carry) if group == 1 else lax.fori_loop(0, group, head, carry)
    dk, dv = carry
    dk_ref[...] = (dk * st.softmax_scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def dq_and_dbias(
    st: TritonFlashStatic, tiling: TritonFlashTiling, q, k, v, do, lse, delta, bias, q_seg, kv_seg, mask, seed
):
    """dQ `[B, Sqp, H, D]` and, with a bias, dS as float32 `[B, H, Sqp, Skp]` (None without)."""
    batch, q_len_padded, num_heads, head_dim = q.shape
    kv_len_padded, value_dim = k.shape[1], v.shape[3]
    group, block_q = st.group, tiling.block_q
    ops = Operands.of(bias, None, q_seg, mask, seed)
    num_q_blocks = q_len_padded // block_q
    qmap = functools.partial(query_block_index, num_q_blocks=num_q_blocks, causal=st.causal)
    in_specs = [
        pl.BlockSpec((None, block_q, None, head_dim), lambda i, b, h: (b, qmap(i), h, 0)),
        pl.BlockSpec((None, kv_len_padded, None, head_dim), lambda i, b, h: (b, 0, h // group, 0)),
        pl.BlockSpec((None, kv_len_padded, None, value_dim), lambda i, b, h: (b, 0, h // group, 0)),
        pl.BlockSpec((None, block_q, None, value_dim), lambda i, b, h: (b, qmap(i), h, 0)),
        pl.BlockSpec((None, None, block_q), lambda i, b, h: (b, h, qmap(i))),
        pl.BlockSpec((None, None, block_q), lambda i, b, h: (b, h, qmap(i))),
    ]
    args = [q, k, v, do, lse, delta]
    row_specs, row_args = query_block_operands(ops, block_q, kv_len_padded, qmap, bias, mask, q_seg, kv_seg)
    in_specs += row_specs
    args += row_args
    if ops.dropout:
        in_specs.append(pl.BlockSpec((1,), lambda i, b, h: (0,)))
        args.append(seed)
    out_specs = [pl.BlockSpec((None, block_q, None, head_dim), lambda i, b, h: (b, qmap(i), h, 0))]
    out_shape = [out_struct(q.shape, q.dtype, *args)]
    if ops.bias:
        out_specs.append(pl.BlockSpec((None, None, block_q, kv_len_padded), lambda i, b, h: (b, h, qmap(i), 0)))
        out_shape.append(out_struct((batch, num_heads, q_len_padded, kv_len_padded), jnp.float32, *args))
    outs = pl.pallas_call(
        functools.partial(
            _dq_kernel, st=st, tiling=tiling, ops=ops, num_q_blocks=num_q_blocks, kv_len_padded=kv_len_padded
        ),
        grid=(num_q_blocks, batch, num_heads),
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=plgpu.CompilerParams(num_warps=tiling.num_warps, num_stages=tiling.num_stages),
        interpret=st.interpret,
        name="ejkernel_flash_attention_bwd_dq",
    )(*args)
    return outs[0], (outs[1] if ops.bias else None)


def dk_dv(st: TritonFlashStatic, tiling: TritonFlashTiling, q, k, v, do, lse, delta, bias, q_seg, kv_seg, mask, seed):
    """dK `[B, Skp, Hkv, D]` and dV `[B, Skp, Hkv, Dv]`, one program per (key block, batch, kv head)."""
    batch, q_len_padded, _, head_dim = q.shape
    kv_len_padded, num_kv_heads, value_dim = k.shape[1], k.shape[2], v.shape[3]
    group, block_k = st.group, tiling.block_k
    ops = Operands.of(bias, None, q_seg, mask, seed)
    in_specs = [
        pl.BlockSpec((None, q_len_padded, group, head_dim), lambda j, b, g: (b, 0, g, 0)),
        pl.BlockSpec((None, block_k, None, head_dim), lambda j, b, g: (b, j, g, 0)),
        pl.BlockSpec((None, block_k, None, value_dim), lambda j, b, g: (b, j, g, 0)),
        pl.BlockSpec((None, q_len_padded, group, value_dim), lambda j, b, g: (b, 0, g, 0)),
        pl.BlockSpec((None, group, q_len_padded), lambda j, b, g: (b, g, 0)),
        pl.BlockSpec((None, group, q_len_padded), lambda j, b, g: (b, g, 0)),
    ]
    args = [q, k, v, do, lse, delta]

    def group_spec(batch_axis: bool, head_axis: bool):
        if head_axis:  # this kv head's query heads, all rows, one key block
            return pl.BlockSpec((None, group, q_len_padded, block_k), lambda j, b, g: (b if batch_axis else 0, g, 0, j))
        return pl.BlockSpec((None, None, q_len_padded, block_k), lambda j, b, g: (b if batch_axis else 0, 0, 0, j))

    if ops.bias:
        in_specs.append(group_spec(ops.bias_batch, ops.bias_heads))
        args.append(bias)
    if ops.mask:
        in_specs.append(group_spec(ops.mask_batch, ops.mask_heads))
        args.append(mask)
    if ops.segments:
        in_specs += [
            pl.BlockSpec((None, q_len_padded), lambda j, b, g: (b, 0)),
            pl.BlockSpec((None, block_k), lambda j, b, g: (b, j)),
        ]
        args += [q_seg, kv_seg]
    if ops.dropout:
        in_specs.append(pl.BlockSpec((1,), lambda j, b, g: (0,)))
        args.append(seed)
    return pl.pallas_call(
        functools.partial(_dkv_kernel, st=st, tiling=tiling, ops=ops, kv_len_padded=kv_len_padded),
        grid=(kv_len_padded // block_k, batch, num_kv_heads),
        in_specs=in_specs,
        out_specs=[
            pl.BlockSpec((None, block_k, None, head_dim), lambda j, b, g: (b, j, g, 0)),
            pl.BlockSpec((None, block_k, None, value_dim), lambda j, b, g: (b, j, g, 0)),
        ],
        out_shape=[out_struct(k.shape, k.dtype, *args), out_struct(v.shape, v.dtype, *args)],
        compiler_params=plgpu.CompilerParams(num_warps=tiling.num_warps, num_stages=tiling.num_stages),
        interpret=st.interpret,
        name="ejkernel_flash_attention_bwd_dkv",
    )(*args)


def _small_lse(st: TritonFlashStatic, bias, sinks) -> bool:
    """Whether every logsumexp is bounded below 2^7 (soft-capped logits, no bias or sinks): rounded to one
    float32 it is then within 2^-17 (as it always was), and the wrapper skips the 2^e pass over dO."""
    if st.soft_cap is None or bias is not None or sinks is not None:
        return False
    return abs(st.soft_cap) * LOG2E + math.log2(st.kv_len) < 2.0**7


def natural_lse(st: TritonFlashStatic, operands, lse):
    """The forward's `(offset, rest)` -> each row's natural log-sum-exp `[B, H, Sq]` (sinks included; -inf for
    a row the kernels left empty)."""
    offset, rest = lse
    base2, _ = single_lse(st, offset, rest, raw_logits(st, operands[3] is not None))
    return jnp.where(rest == jnp.inf, -jnp.inf, base2 * (1.0 / LOG2E))


def backward(st: TritonFlashStatic, residuals, do, dlse=None):
    """Cotangents of the padded output (and of `natural_lse`'s, `dlse [B, H, Sq]`) -> (dq, dk, dv, dbias | None,
    dsinks | None). An lse cotangent adds `dlse·P` to dS, so it joins as `delta − dlse` (sinks alike)."""
    q, k, v, bias, sinks, q_seg, kv_seg, mask, seed, out, (offset, rest) = residuals
    lse, e = single_lse(st, offset, rest, raw_logits(st, bias is not None))
    do = do.astype(out.dtype)
    delta = jnp.einsum("bqhd,bqhd->bhq", out.astype(jnp.float32), do.astype(jnp.float32))
    if dlse is not None:
        delta = delta - jnp.where(rest == jnp.inf, 0.0, dlse.astype(jnp.float32))
    if not _small_lse(st, bias, sinks):
        # dO's rows times 2^e undo the kernels' P' = P·2^-e (see the module's docstring); delta follows.
        # A pass over dO: ~35 us, 0.4-3.4% of an H200's bf16 backward at 4k tokens (B 4, H 16, D 64-128).
        w = jnp.exp2(e)
        do = (do.astype(jnp.float32) * jnp.swapaxes(w, 1, 2)[..., None]).astype(out.dtype)
        delta = delta * w
    operands = (q, k, v, do, lse, delta, bias, q_seg, kv_seg, mask, seed)
    dq, dbias = dq_and_dbias(st, st.bwd_dq, *operands)
    dk, dv = dk_dv(st, st.bwd, *operands)
    if dbias is not None:
        dbias = sum_to_bias_shape(dbias, bias)
    dsinks = None
    if sinks is not None:
        # d lse / d sink = P_sink = exp(sink - lse), and d out / d lse = -out: dsink = -Σ P_sink·delta
        # (here P_sink·2^-e against delta·2^e).
        p_sink = jnp.exp2(sinks.astype(jnp.float32)[None, :, None] * LOG2E - lse)
        dsinks = -jnp.sum(p_sink * delta, axis=(0, 2)).astype(sinks.dtype)
    return dq, dk, dv, dbias, dsinks
