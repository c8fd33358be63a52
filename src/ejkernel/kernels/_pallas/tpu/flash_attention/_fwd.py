"""Flash attention forward as a Pallas Mosaic TPU kernel, and the pieces the backward shares with it.

Operands arrive from the wrapper in the TPU-friendly layout `[B, H, S, D]`, sequence lengths padded
to block multiples (`TpuFlashStatic` keeps the true lengths). The grid is `(B, H, q blocks, k blocks)`: the
last axis is sequential ("arbitrary") and carries the online softmax in VMEM scratch (`m`, `l` kept
lane-replicated as `[block_q, 128]`, and the `[block_q, Dv]` float32 accumulator), initialised at
k block 0 and written out at the last k block.

Blocks that causal / sliding-window / key-length masking leaves empty are skipped with `pl.when`, and
their key/value index maps are clamped to the nearest visible block so a skipped step fetches
nothing new. Visible blocks that are fully allowed by position run without building a positional
mask; only edge blocks build one. Per-row statistics stay in natural-log units.

Side inputs use the layouts the TPU tiling wants: query segment ids lane-replicated `[B, Sq, 128]`,
key segment ids sublane-replicated `[B, 8, Sk]`, sink logits `[8, H]` and the dropout seed `[1]` in
SMEM, the boolean mask as int8.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ejkernel.kernels._common.attention import Operands, RefReader, join_sink
from ejkernel.reference.dropout import dropout_keep

LANES = 128  # TPU vreg lanes: width of the replicated per-row statistics and query segment ids
SUBLANES = 8  # TPU vreg sublanes: height of the replicated key segment ids and sink logits
NT_DIMS = (((1,), (1,)), ((), ()))  # a @ b.T


@dataclasses.dataclass(frozen=True)
class TpuFlashStatic:
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
    block_q: int  # forward tiles
    block_k: int
    bwd_block_q: int  # backward tiles (both backward kernels)
    bwd_block_k: int
    interpret: object  # False, or the `pltpu.InterpretParams` to run the kernels with

    @property
    def group(self) -> int:
        return self.num_heads // self.num_kv_heads


def compiler_params(num_axes: int, sequential: int = 1):
    """Grid axes parallel except the last `sequential`, which carry the scratch accumulators."""
    semantics = ("parallel",) * (num_axes - sequential) + ("arbitrary",) * sequential
    return pltpu.CompilerParams(dimension_semantics=semantics)


def lanes(x, width: int):
    """A lane-replicated `[rows, 128]` statistic as `[rows, width]`."""
    if width == LANES:
        return x
    if width < LANES:
        return x[:, :width]
    reps = pl.cdiv(width, LANES)
    y = jnp.tile(x, (1, reps))
    return y if reps * LANES == width else y[:, :width]


# ---- which (query block, key block) pairs hold allowed keys ----


def _and(*conds):
    """Conjunction that stays a Python `True` when nothing constrains it."""
    out = True
    for c in conds:
        if c is True:
            continue
        out = c if out is True else jnp.logical_and(out, c)
    return out


def block_state(
    st: TpuFlashStatic, q_start, block_q: int, k_start, block_k: int, *, q_len_padded: int, kv_len_padded: int
):
    """(visible, interior) for the tile at (q_start, k_start): traced bools or Python `True`.

    visible: some (query, key) pair in the tile passes the positional masks (and, when the query
    axis is padded past a whole block, the tile holds a real query row); interior: every pair does.
    """
    q_end, k_end = q_start + block_q - 1, k_start + block_k - 1
    visible, interior = [], []
    if st.kv_len != kv_len_padded:
        visible.append(k_start < st.kv_len)
        interior.append(k_end < st.kv_len)
    if -(-st.q_len // block_q) * block_q != q_len_padded:  # a block made only of padding rows
        visible.append(q_start < st.q_len)
    if st.causal:
        visible.append(k_start <= q_end)
        interior.append(k_end <= q_start)
    if st.window is not None:
        left, right = st.window
        visible += [k_end >= q_start - left, k_start <= q_end + right]
        interior += [k_start >= q_end - left, k_end <= q_start + right]
        if st.kv_len != kv_len_padded:  # the first row's window may start past the last real key
            visible.append(q_start - left < st.kv_len)
    return _and(*visible), _and(*interior)


def position_mask(st: TpuFlashStatic, q_start, k_start, shape, *, kv_len_padded: int):
    """Boolean `[block_q, block_k]` tile of the causal / window / key-length masks."""
    rows = q_start + lax.broadcasted_iota(jnp.int32, shape, 0)
    cols = k_start + lax.broadcasted_iota(jnp.int32, shape, 1)
    conds = []
    if st.kv_len != kv_len_padded:
        conds.append(cols < st.kv_len)
    if st.causal:
        conds.append(cols <= rows)
    if st.window is not None:
        left, right = st.window
        conds += [cols >= rows - left, cols <= rows + right]
    return _and(*conds)


def kv_block_range(st: TpuFlashStatic, q_start, block_q: int, block_k: int, num_k_blocks: int):
    """First and last key block that can be visible for a query block (index-map arithmetic).

    Numerators are clamped at 0 so every division is of non-negative integers; the result only
    steers which block a skipped step points at, never what is computed.
    """
    q_end = q_start + block_q - 1
    lo = 0
    hi = min(num_k_blocks - 1, (st.kv_len - 1) // block_k)
    if st.causal:
        hi = jnp.minimum(hi, lax.div(q_end, block_k))
    if st.window is not None:
        left, right = st.window
        lo = lax.div(jnp.maximum(q_start - left, 0), block_k)
        hi = jnp.minimum(hi, lax.div(jnp.maximum(q_end + right, 0), block_k))
    return lo, hi


def q_block_range(st: TpuFlashStatic, k_start, block_k: int, block_q: int, num_q_blocks: int):
    """First and last query block that can see a key block (index-map arithmetic, see above)."""
    k_end = jnp.minimum(k_start + block_k - 1, st.kv_len - 1)  # the last real key of the block
    lo = 0
    hi = min(num_q_blocks - 1, (st.q_len - 1) // block_q)
    if st.causal:
        lo = lax.div(k_start, block_q)
    if st.window is not None:
        left, right = st.window
        lo = jnp.maximum(lo, lax.div(jnp.maximum(k_start - right, 0), block_q))
        hi = jnp.minimum(hi, lax.div(jnp.maximum(k_end + left, 0), block_q))
    return lo, hi


def clamp_block(i, lo, hi, num_blocks: int):
    """Block index `i` moved into [lo, hi] (and the array), so skipped steps re-use a fetched block."""
    return jnp.clip(jnp.minimum(jnp.maximum(i, lo), hi), 0, num_blocks - 1)


def run_tile(visible, interior, body):
    """Calls `body(positional)` under the right `pl.when`: interior tiles skip the positional mask."""
    if visible is True and interior is True:
        body(False)
        return
    if interior is True:
        pl.when(visible)(lambda: body(False))
        return
    pl.when(_and(visible, interior))(lambda: body(False))
    pl.when(_and(visible, jnp.logical_not(interior)))(lambda: body(True))


# ---- numerics shared by the three kernels ----


def logits(q, k, bias_tile, st: TpuFlashStatic):
    """`q @ k.T` -> (scaled, soft-capped, biased float32 logits; tanh tile of the cap or None)."""
    s = lax.dot_general(q, k, NT_DIMS, preferred_element_type=jnp.float32)
    t = None
    if st.soft_cap is None:
        s = s * st.softmax_scale
    else:
        t = jnp.tanh(s * (st.softmax_scale / st.soft_cap))
        s = t * st.soft_cap
    if bias_tile is not None:
        s = s + bias_tile.astype(jnp.float32)
    return s, t


def allowed_tile(
    st: TpuFlashStatic,
    ops: Operands,
    positional: bool,
    q_start,
    k_start,
    shape,
    *,
    kv_len_padded,
    q_seg_ref,
    kv_seg_ref,
    mask_ref,
):
    """Boolean tile of allowed pairs (positions if `positional`, segments, mask), or Python True."""
    conds = []
    if positional:
        conds.append(position_mask(st, q_start, k_start, shape, kv_len_padded=kv_len_padded))
    if ops.segments:
        q_ids = lanes(q_seg_ref[...], shape[1])  # [block_q, block_k]
        kv_ids = kv_seg_ref[0:1, :]  # [1, block_k]
        conds.append(jnp.logical_and(q_ids == kv_ids, q_ids >= 0))
    if ops.mask:
        conds.append(mask_ref[...] != 0)
    return _and(*conds)


def masked_logits(st: TpuFlashStatic, ops: Operands, positional: bool, q_start, k_start, shape, *, kv_len_padded, refs):
    """`logits` of the tile with disallowed pairs at -inf: (s, tanh tile of the cap or None).

    `refs` are `(q_ref, k_ref, bias_ref, q_seg_ref, kv_seg_ref, mask_ref)` (None where absent).
    """
    q_ref, k_ref, bias_ref, q_seg_ref, kv_seg_ref, mask_ref = refs
    s, t = logits(q_ref[...], k_ref[...], bias_ref[...] if ops.bias else None, st)
    allowed = allowed_tile(
        st,
        ops,
        positional,
        q_start,
        k_start,
        shape,
        kv_len_padded=kv_len_padded,
        q_seg_ref=q_seg_ref,
        kv_seg_ref=kv_seg_ref,
        mask_ref=mask_ref,
    )
    if allowed is not True:
        s = jnp.where(allowed, s, -jnp.inf)
    return s, t


def keep_tile(st: TpuFlashStatic, seed_ref, batch_head, q_start, k_start, shape):
    """Dropout keep mask of the tile (absolute positions, as in the reference)."""
    rows = q_start + lax.broadcasted_iota(jnp.int32, shape, 0)
    cols = k_start + lax.broadcasted_iota(jnp.int32, shape, 1)
    return dropout_keep(seed_ref[0], batch_head, rows, cols, st.dropout_prob)


def side_specs(st: TpuFlashStatic, ops: Operands, *, block_q: int, block_k: int, index):
    """BlockSpecs of the optional per-tile operands, in kernel order (bias, mask, segments, sinks, seed).

    `index(*grid) -> (b, h, q block, k block)` gives the tile a grid step reads.
    """
    specs = []

    def tile_spec(has_batch, has_heads):
        def index_map(*grid):
            b, h, qb, kb = index(*grid)
            return (b if has_batch else 0, h if has_heads else 0, qb, kb)

        return pl.BlockSpec((None, None, block_q, block_k), index_map)

    if ops.bias:
        specs.append(tile_spec(ops.bias_batch, ops.bias_heads))
    if ops.mask:
        specs.append(tile_spec(ops.mask_batch, ops.mask_heads))
    if ops.segments:
        specs.append(pl.BlockSpec((None, block_q, LANES), lambda *g: (index(*g)[0], index(*g)[2], 0)))
        specs.append(pl.BlockSpec((None, SUBLANES, block_k), lambda *g: (index(*g)[0], 0, index(*g)[3])))
    if ops.sinks:
        specs.append(pl.BlockSpec(memory_space=pltpu.SMEM))
    if ops.dropout:
        specs.append(pl.BlockSpec(memory_space=pltpu.SMEM))
    return specs


def side_args(ops: Operands, bias, mask, q_seg, kv_seg, sinks=None, seed=None):
    args = [bias] if ops.bias else []
    args += [mask] if ops.mask else []
    args += [q_seg, kv_seg] if ops.segments else []
    args += [sinks] if ops.sinks else []
    args += [seed] if ops.dropout else []
    return args


# ---- forward ----


def _forward_kernel(*refs, st: TpuFlashStatic, ops: Operands, q_len_padded: int, kv_len_padded: int):
    read = RefReader(refs)
    q_ref, k_ref, v_ref = read(), read(), read()
    bias_ref, mask_ref = read(ops.bias), read(ops.mask)
    q_seg_ref, kv_seg_ref = read(ops.segments), read(ops.segments)
    sinks_ref, seed_ref = read(ops.sinks), read(ops.dropout)
    o_ref, lse_ref, m_scratch, l_scratch, acc_scratch = read.rest()

    block_q, block_k = st.block_q, st.block_k
    b, h, qi, ki = (pl.program_id(i) for i in range(4))
    q_start, k_start = qi * block_q, ki * block_k

    @pl.when(ki == 0)
    def _init():
        m_scratch[...] = jnp.full(m_scratch.shape, -jnp.inf, jnp.float32)
        l_scratch[...] = jnp.zeros(l_scratch.shape, jnp.float32)
        acc_scratch[...] = jnp.zeros(acc_scratch.shape, jnp.float32)

    def body(positional: bool):
        shape = (block_q, block_k)
        refs = (q_ref, k_ref, bias_ref, q_seg_ref, kv_seg_ref, mask_ref)
        s, _ = masked_logits(st, ops, positional, q_start, k_start, shape, kv_len_padded=kv_len_padded, refs=refs)
        m_prev, l_prev = m_scratch[...], l_scratch[...]  # [block_q, 128]
        m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
        # A row with nothing allowed so far keeps m = -inf; shifting it by 0 keeps inf - inf away.
        shift = jnp.where(m_next == -jnp.inf, 0.0, m_next)
        alpha = jnp.exp(m_prev - shift)
        p = jnp.exp(s - lanes(shift, block_k))
        l_scratch[...] = alpha * l_prev + jnp.sum(p, axis=1, keepdims=True)
        m_scratch[...] = m_next
        if ops.dropout:
            keep = keep_tile(st, seed_ref, b * st.num_heads + h, q_start, k_start, shape)
            p = jnp.where(keep, p, 0.0)
        v = v_ref[...]
        pv = lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
        acc_scratch[...] = acc_scratch[...] * lanes(alpha, v.shape[-1]) + pv

    visible, interior = block_state(
        st, q_start, block_q, k_start, block_k, q_len_padded=q_len_padded, kv_len_padded=kv_len_padded
    )
    run_tile(visible, interior, body)

    @pl.when(ki == pl.num_programs(3) - 1)
    def _finish():
        m, denom, acc = m_scratch[...], l_scratch[...], acc_scratch[...]
        value_dim = acc.shape[-1]
        if ops.sinks:  # the sinks join the denominator only
            sink = sinks_ref[0, h]  # this head's log-sum-exp of its sink logits
            m, alpha, denom = join_sink(m, denom, sink, jnp.exp)
            acc = acc * lanes(alpha, value_dim)
        empty = denom == 0.0  # no allowed key and no sink: output 0, lse +inf (every p recomputes to 0)
        denom = jnp.where(empty, 1.0, denom)
        keep_scale = 1.0 / (1.0 - st.dropout_prob) if ops.dropout else 1.0
        o_ref[...] = (acc * lanes(keep_scale / denom, value_dim)).astype(o_ref.dtype)
        lse_ref[...] = jnp.where(empty, jnp.inf, m + jnp.log(denom))


def forward(st: TpuFlashStatic, q, k, v, bias, sinks, q_seg, kv_seg, mask, seed):
    """Padded `[B, H, S, D]` operands -> (output `[B, H, Sqp, Dv]`, lse `[B, H, Sqp, 128]` float32)."""
    batch, num_heads, q_len_padded, head_dim = q.shape
    kv_len_padded, value_dim = k.shape[2], v.shape[3]
    block_q, block_k, group = st.block_q, st.block_k, st.group
    num_q_blocks, num_k_blocks = q_len_padded // block_q, kv_len_padded // block_k
    ops = Operands.of(bias, sinks, q_seg, mask, seed)
    if ops.sinks:  # one row per sublane, as SMEM operands are laid out
        sinks = jnp.broadcast_to(sinks.astype(jnp.float32)[None, :], (SUBLANES, num_heads))

    def kv_block(qi, ki):
        lo, hi = kv_block_range(st, qi * block_q, block_q, block_k, num_k_blocks)
        return clamp_block(ki, lo, hi, num_k_blocks)

    def tile_index(b, h, qi, ki):
        return b, h, qi, kv_block(qi, ki)

    in_specs = [
        pl.BlockSpec((None, None, block_q, head_dim), lambda b, h, qi, ki: (b, h, qi, 0)),
        pl.BlockSpec((None, None, block_k, head_dim), lambda b, h, qi, ki: (b, h // group, kv_block(qi, ki), 0)),
        pl.BlockSpec((None, None, block_k, value_dim), lambda b, h, qi, ki: (b, h // group, kv_block(qi, ki), 0)),
        *side_specs(st, ops, block_q=block_q, block_k=block_k, index=tile_index),
    ]
    kernel = functools.partial(_forward_kernel, st=st, ops=ops, q_len_padded=q_len_padded, kv_len_padded=kv_len_padded)
    return pl.pallas_call(
        kernel,
        grid=(batch, num_heads, num_q_blocks, num_k_blocks),
        in_specs=in_specs,
        out_specs=[
            pl.BlockSpec((None, None, block_q, value_dim), lambda b, h, qi, ki: (b, h, qi, 0)),
            pl.BlockSpec((None, None, block_q, LANES), lambda b, h, qi, ki: (b, h, qi, 0)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct((batch, num_heads, q_len_padded, value_dim), q.dtype),
            jax.ShapeDtypeStruct((batch, num_heads, q_len_padded, LANES), jnp.float32),
        ],
        scratch_shapes=[
            pltpu.VMEM((block_q, LANES), jnp.float32),
            pltpu.VMEM((block_q, LANES), jnp.float32),
            pltpu.VMEM((block_q, value_dim), jnp.float32),
        ],
        compiler_params=compiler_params(4),
        interpret=st.interpret,
        name="ejkernel_tpu_flash_attention_fwd",
    )(q, k, v, *side_args(ops, bias, mask, q_seg, kv_seg, sinks, seed))
