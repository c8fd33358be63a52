"""Flash attention forward: one Pallas-Triton program per (query block, batch, query head).

Each program holds a `[block_q, D]` query tile and streams the key/value blocks that can hold allowed
keys for it, accumulating in float32 with base-2 exponentials. Without soft cap or bias the logits
stay raw `q·k` and the scale (times log2(e)) is folded into the exponent's multiply: the forward is
bound by instruction issue. Where it is safe there is no running max at all: each logit is
exponentiated against offset 0, so nothing is rescaled. With a soft cap (`TritonFlashStatic.bounded`) the cap
proves it (|logit| <= cap·log2(e)). Otherwise (`TritonFlashStatic.checked_zero_offset`) the first pass marks
the rows whose sums of weights left `ZERO_OFFSET_SUMS` (largest logit under about -55, or logits
near 69), and a second, light pass recomputes the blocks that hold such rows with the running max
of the online softmax. Dropping the max and the rescale saved 2-20% of the forward on an H100.
Key blocks that are fully allowed by position (causal, window, key length) run without any
positional masking; only the edge blocks build a mask tile. Outputs are the attention output and
each row's logsumexp in two float32 parts `[B, H, Sq]`, which is all the backward needs: the row's
offset (its largest logit, or 0 without a running max or allowed key), in the units the running max
is kept in (raw `q·k` without soft cap and bias), and the rest in base 2 (+inf for a row with no
allowed key and no sink). One float rounds the logsumexp to its ulp, ~0.004 at |logit| ~ 4e4, and
the backward must know by how much (see `_bwd`). With a running max the weights are taken from
differences to it, which are exact, so that the denominator is exactly relative to the offset
whatever the compiler contracts into an FMA.

Arrays arrive padded by the wrapper: sequence lengths to block multiples and head dims to powers of
two. `TritonFlashStatic` carries the true lengths, so padded keys are masked and padded query rows are ignored.
"""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from ejkernel.kernels._common.attention import LOG2E, ZERO_OFFSET_SUMS, Operands, RefReader, join_sink
from ejkernel.kernels._common.vma import out_struct
from ejkernel.kernels._triton._helpers import (
    and_masks,
    dot,
    exp2,
    kv_blocks_for_q_block,
    position_mask,
    segment_guarded,
    segment_span,
)
from ejkernel.reference.dropout import dropout_keep


@dataclasses.dataclass(frozen=True)
class TritonFlashTiling:
    """One kernel's tiles and Triton settings (the forward's, or one of the two backward kernels')."""

    block_q: int
    block_k: int
    num_warps: int
    num_stages: int


@dataclasses.dataclass(frozen=True)
class TritonFlashStatic:
    """Everything about a call that is fixed at trace time (hashable: it keys the custom VJP)."""

    softmax_scale: float
    causal: bool
    window: tuple[int, int] | None
    soft_cap: float | None
    dropout_prob: float
    q_len: int  # true lengths, before the wrapper's padding
    kv_len: int
    num_heads: int
    num_kv_heads: int
    fwd: TritonFlashTiling
    bwd: TritonFlashTiling  # the dK/dV kernel
    bwd_dq: TritonFlashTiling  # the dQ (and dBias) kernel
    interpret: bool
    fast_tanh: bool = False  # the soft cap uses the hardware's approximate tanh (16-bit inputs on a GPU)
    bounded: bool = False  # soft-capped bfloat16 without bias: the forward's 2^logit needs no running max
    # No running max either, but checked: blocks with a row whose sums leave ZERO_OFFSET_SUMS are redone with one.
    checked_zero_offset: bool = False

    @property
    def group(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def dropout(self) -> bool:
        return self.dropout_prob > 0.0


def logits_base2(s, bias_tile, st: TritonFlashStatic):
    """Raw `q·k` tile -> (logits in base-2 units, tanh tile of the soft cap or None)."""
    if st.soft_cap is None:
        x, t = s * (st.softmax_scale * LOG2E), None
    else:
        z = s * (st.softmax_scale / st.soft_cap)
        t = plgpu.approx_tanh(z) if st.fast_tanh else jnp.tanh(z)
        x = t * (st.soft_cap * LOG2E)
    if bias_tile is not None:
        x = x + bias_tile.astype(jnp.float32) * LOG2E
    return x, t


def raw_logits(st: TritonFlashStatic, bias: bool) -> bool:
    """Whether the kernels keep logits as raw `q·k` (no soft cap, no bias): the scale then joins in the exponent."""
    return st.soft_cap is None and not bias


def key_block_logits(
    kb,
    q,
    edge: bool,
    *,
    st: TritonFlashStatic,
    ops: Operands,
    raw: bool,
    block_k: int,
    q_pos,
    q_seg,
    kv_len_padded: int,
    refs,
):
    """Key block `kb` against a `[block_q, D]` query tile: `(cols, k_pos, k, x, t)`.

    `x` is the logit tile, raw `q·k` when `raw` (no soft cap, no bias), else in base-2 units with `t`
    the soft cap's tanh tile (or None). Disallowed pairs are -inf: positions count only on edge blocks;
    segments and the mask wherever the call has them. `refs` = (k, bias, kv segment ids, mask).
    """
    k_ref, bias_ref, kv_seg_ref, mask_ref = refs
    k_start = pl.multiple_of(kb * block_k, block_k)
    cols = pl.ds(k_start, block_k)
    k = k_ref[cols, :]
    x, t = dot(q, k, trans_b=True), None
    if not raw:
        x, t = logits_base2(x, bias_ref[:, cols] if ops.bias else None, st)
    k_pos = k_start + jnp.arange(block_k, dtype=jnp.int32)[None, :]
    allowed = and_masks(
        position_mask(q_pos, k_pos, kv_len=st.kv_len, kv_len_padded=kv_len_padded, causal=st.causal, window=st.window)
        if edge
        else None,
        ((q_seg == kv_seg_ref[cols][None, :]) & (q_seg >= 0)) if ops.segments else None,
        (mask_ref[:, cols] != 0) if ops.mask else None,
    )
    if allowed is not None:
        x = jnp.where(allowed, x, -jnp.inf)
    return cols, k_pos, k, x, t


def needs_edges(st: TritonFlashStatic, kv_len_padded: int) -> bool:
    """Whether any block can need a positional mask (else every visited block is interior)."""
    return st.causal or st.window is not None or st.kv_len != kv_len_padded


def query_block_index(pid, num_q_blocks: int, causal: bool):
    """With causal masking, launch the heaviest (last) query blocks first for a shorter tail."""
    return num_q_blocks - 1 - pid if causal else pid


def _forward_kernel(*refs, st: TritonFlashStatic, ops: Operands, num_q_blocks: int, kv_len_padded: int, redo: bool):
    """One query block's output and logsumexp (offset, rest).

    With `st.checked_zero_offset` the forward launches this twice. The first pass uses offset 0 and
    marks each row whose sum of weights left `ZERO_OFFSET_SUMS` with a NaN rest. In the second
    (`redo`, outputs aliased to the first's) a program whose block holds a marked row recomputes the
    block with the running max, and the others return at once. The redo is a launch of its own because
    a second key loop in the same kernel slowed the first by up to 20% (H100, head dim 64, causal).
    """
    read = RefReader(refs)
    q_ref, k_ref, v_ref = read(), read(), read()
    bias_ref, mask_ref = read(ops.bias), read(ops.mask)
    q_seg_ref, kv_seg_ref = read(ops.segments), read(ops.segments)
    sink_ref, seed_ref = read(ops.sinks), read(ops.dropout)
    _, _, marked_rest_ref = read(redo), read(redo), read(redo)  # the first pass's outputs, aliased to ours
    o_ref, offset_ref, rest_ref = read.rest()

    block_q, block_k = st.fwd.block_q, st.fwd.block_k
    qi = query_block_index(pl.program_id(0), num_q_blocks, st.causal)
    b, h = pl.program_id(1), pl.program_id(2)
    q_start = qi * block_q
    q_pos = q_start + jnp.arange(block_q, dtype=jnp.int32)[:, None]
    batch_head = b * st.num_heads + h
    raw = raw_logits(st, ops.bias)  # the running max is of raw scores

    def base2(x):
        """Running-max units -> base-2 logits."""
        return x * (st.softmax_scale * LOG2E) if raw else x

    def key_loop(zero_offset: bool):
        """Accumulates every key block this query block may see: (acc, running max, row sums)."""
        q = q_ref[...]
        q_seg = q_seg_ref[...][:, None] if ops.segments else None
        seed = seed_ref[...] if ops.dropout else None

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

        def step(kb, carry, edge: bool):
            acc, m_prev, l_prev = carry
            cols, k_pos, _, x, _ = logits(kb, q, edge)
            if zero_offset:  # offset 0 for every row (m stays 0): nothing to rescale
                p = exp2(base2(x), interpret=st.interpret)
                m_next, l_next = m_prev, l_prev + jnp.sum(p, axis=1)
            else:
                m_next = jnp.maximum(m_prev, jnp.max(x, axis=1))
                # A row with nothing allowed so far keeps m = -inf; shift it by 0 so no inf - inf appears.
                shift = jnp.where(m_next == -jnp.inf, 0.0, m_next)
                alpha = exp2(base2(m_prev - shift), interpret=st.interpret)
                # Scaled difference, not x·scale - shift·scale: the latter's rounding of shift·scale (or an
                # FMA's exact x·scale) would skew every weight of the row against the backward's.
                p = exp2(base2(x - shift[:, None]), interpret=st.interpret)
                l_next = l_prev * alpha + jnp.sum(p, axis=1)
                acc = acc * alpha[:, None]
            if ops.dropout:
                p = jnp.where(dropout_keep(seed, batch_head, q_pos, k_pos, st.dropout_prob), p, 0.0)
            v = v_ref[cols, :]
            acc = acc + dot(p.astype(v.dtype), v)
            return acc, m_next, l_next

        carry = (
            jnp.zeros((block_q, o_ref.shape[-1]), jnp.float32),
            jnp.full((block_q,), 0.0 if zero_offset else -jnp.inf, jnp.float32),
            jnp.zeros((block_q,), jnp.float32),
        )
        edge_step = functools.partial(step, edge=True)
        interior_step = functools.partial(step, edge=False)
        if ops.segments:
            q_span = segment_span(q_seg_ref[...])
            edge_step = segment_guarded(edge_step, q_span, kv_seg_ref, block_k)
            interior_step = segment_guarded(interior_step, q_span, kv_seg_ref, block_k)
        if not needs_edges(st, kv_len_padded):
            return lax.fori_loop(0, kv_len_padded // block_k, interior_step, carry)
        lo, mid_lo, mid_hi, hi = kv_blocks_for_q_block(
            q_start, block_q=block_q, block_k=block_k, kv_len=st.kv_len, causal=st.causal, window=st.window
        )
        if st.window is not None:  # without a left bound, mid_lo == lo
            carry = lax.fori_loop(lo, mid_lo, edge_step, carry)
        carry = lax.fori_loop(mid_lo, mid_hi, interior_step, carry)
        return lax.fori_loop(mid_hi, hi, edge_step, carry)

    def attend(zero_offset: bool, mark: bool):
        acc, m, denom = key_loop(zero_offset)
        if mark:  # x * 0 is NaN where x is not finite; padded query rows may be empty
            low, high = ZERO_OFFSET_SUMS
            row_ok = (denom >= low) & (denom <= high) & (jnp.sum(acc, axis=1) * 0.0 == 0.0)
            row_ok = row_ok | (q_pos[:, 0] >= st.q_len)
        offset = jnp.where(m == -jnp.inf, 0.0, m)  # a row that saw no key keeps offset 0
        lift = 0.0  # the rest's part above log2(denom): where a sink outweighs the offset
        if ops.sinks:  # the sinks join the denominator only
            sink = sink_ref[pl.ds(h, 1)] * LOG2E  # [1], already this head's log-sum-exp of its sinks
            m2 = base2(offset)
            shift, alpha, denom = join_sink(m2, denom, sink, functools.partial(exp2, interpret=st.interpret))
            acc = acc * alpha[:, None]
            lift = shift - m2
        empty = denom == 0.0  # no allowed key and no sink: output 0, rest +inf (every p recomputes to 0)
        denom = jnp.where(empty, 1.0, denom)
        keep_scale = 1.0 / (1.0 - st.dropout_prob) if ops.dropout else 1.0
        o_ref[...] = (acc * (keep_scale / denom)[:, None]).astype(o_ref.dtype)
        rest = jnp.where(empty, jnp.inf, lift + jnp.log2(denom))
        offset_ref[...] = offset
        rest_ref[...] = jnp.where(row_ok, rest, jnp.nan) if mark else rest

    if redo:
        marked = marked_rest_ref[...]  # NaN != NaN marks a row
        pl.when(jnp.max(jnp.where(marked != marked, 1, 0)) > 0)(lambda: attend(zero_offset=False, mark=False))
    else:
        zero_offset = st.bounded or st.checked_zero_offset
        attend(zero_offset=zero_offset, mark=st.checked_zero_offset)


def bias_like_spec(ops_batch: bool, ops_heads: bool, block, index):
    """BlockSpec for a `[Bb, Hb, Sq, Sk]` operand broadcast over batch/heads where its axis is 1.

    `index(b, h, *grid)` gives the (query, key) block indices; `block` is the (query, key) block shape.
    """

    def index_map(*grid):
        b, h = grid[1], grid[2]
        qb, kb = index(*grid)
        return (b if ops_batch else 0, h if ops_heads else 0, qb, kb)

    return pl.BlockSpec((None, None, *block), index_map)


def query_block_operands(ops: Operands, block_q: int, kv_len_padded: int, qmap, bias, mask, q_seg, kv_seg):
    """(BlockSpecs, arrays) of the optional bias, mask and segment ids for a grid over (query block, batch, head).

    Each program sees its `block_q` query rows against every key; `qmap(i)` is the i-th program's query block.
    """
    specs, arrays = [], []
    row_block = lambda i, b, h: (qmap(i), 0)
    if ops.bias:
        specs.append(bias_like_spec(ops.bias_batch, ops.bias_heads, (block_q, kv_len_padded), row_block))
        arrays.append(bias)
    if ops.mask:
        specs.append(bias_like_spec(ops.mask_batch, ops.mask_heads, (block_q, kv_len_padded), row_block))
        arrays.append(mask)
    if ops.segments:
        specs += [
            pl.BlockSpec((None, block_q), lambda i, b, h: (b, qmap(i))),
            pl.BlockSpec((None, kv_len_padded), lambda i, b, h: (b, 0)),
        ]
        arrays += [q_seg, kv_seg]
    return specs, arrays


# The redo pass's tiling. Its programs mostly check a few rows and return, so it keeps shared memory
# small (no pipeline stages) and many of them share an SM; the redo itself is rare and may be slow.
REDO_TILING = TritonFlashTiling(block_q=64, block_k=32, num_warps=4, num_stages=1)


def forward(st: TritonFlashStatic, q, k, v, bias, sinks, q_seg, kv_seg, mask, seed):
    """Padded operands -> (output [B, Sqp, H, Dvp] in q.dtype, lse = (offset, rest), each [B, H, Sqp] float32).

    A row's base-2 logsumexp is `offset·scale·log2(e) + rest` with raw logits (no soft cap, no bias),
    else `offset + rest`; the backward takes the pair as it is.
    """
    out, offset, rest = _launch(st, False, q, k, v, bias, sinks, q_seg, kv_seg, mask, seed)
    if st.checked_zero_offset:
        # Divisors of the first pass's blocks, so the padded lengths hold a whole number of them.
        redo_tiling = dataclasses.replace(
            REDO_TILING,
            block_q=min(REDO_TILING.block_q, st.fwd.block_q),
            block_k=min(REDO_TILING.block_k, st.fwd.block_k),
        )
        redo_st = dataclasses.replace(st, fwd=redo_tiling)
        out, offset, rest = _launch(redo_st, True, q, k, v, bias, sinks, q_seg, kv_seg, mask, seed, out, offset, rest)
    return out, (offset, rest)


def _launch(st: TritonFlashStatic, redo: bool, q, k, v, bias, sinks, q_seg, kv_seg, mask, seed, *marked):
    """One pass of the forward kernel over every (query block, batch, head); `marked` = the first pass's outputs."""
    batch, q_len_padded, num_heads, head_dim = q.shape
    kv_len_padded, value_dim = k.shape[1], v.shape[3]
    group = st.group
    block_q = st.fwd.block_q
    num_q_blocks = q_len_padded // block_q
    ops = Operands.of(bias, sinks, q_seg, mask, seed)
    qmap = functools.partial(query_block_index, num_q_blocks=num_q_blocks, causal=st.causal)

    in_specs = [
        pl.BlockSpec((None, block_q, None, head_dim), lambda i, b, h: (b, qmap(i), h, 0)),
        pl.BlockSpec((None, kv_len_padded, None, head_dim), lambda i, b, h: (b, 0, h // group, 0)),
        pl.BlockSpec((None, kv_len_padded, None, value_dim), lambda i, b, h: (b, 0, h // group, 0)),
    ]
    args = [q, k, v]
    row_specs, row_args = query_block_operands(ops, block_q, kv_len_padded, qmap, bias, mask, q_seg, kv_seg)
    in_specs += row_specs
    args += row_args
    if ops.sinks:
        in_specs.append(pl.BlockSpec((num_heads,), lambda i, b, h: (0,)))
        args.append(sinks)
    if ops.dropout:
        in_specs.append(pl.BlockSpec((1,), lambda i, b, h: (0,)))
        args.append(seed)
    out_specs = [
        pl.BlockSpec((None, block_q, None, value_dim), lambda i, b, h: (b, qmap(i), h, 0)),
        pl.BlockSpec((None, None, block_q), lambda i, b, h: (b, h, qmap(i))),
        pl.BlockSpec((None, None, block_q), lambda i, b, h: (b, h, qmap(i))),
    ]
    kernel = functools.partial(
        _forward_kernel, st=st, ops=ops, num_q_blocks=num_q_blocks, kv_len_padded=kv_len_padded, redo=redo
    )
    return pl.pallas_call(
        kernel,
        grid=(num_q_blocks, batch, num_heads),
        in_specs=in_specs + (out_specs if redo else []),
        out_specs=out_specs,
        out_shape=[
            out_struct((batch, q_len_padded, num_heads, value_dim), q.dtype, *args),
            out_struct((batch, num_heads, q_len_padded), jnp.float32, *args),
            out_struct((batch, num_heads, q_len_padded), jnp.float32, *args),
        ],
        input_output_aliases={len(args) + i: i for i in range(3)} if redo else {},
        compiler_params=plgpu.CompilerParams(num_warps=st.fwd.num_warps, num_stages=st.fwd.num_stages),
        interpret=st.interpret,
        name="ejkernel_flash_attention_fwd_redo" if redo else "ejkernel_flash_attention_fwd",
    )(*args, *marked)
