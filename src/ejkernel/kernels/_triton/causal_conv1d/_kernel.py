"""The Pallas-Triton kernels of the causal depthwise convolution: the shifted-tile forward (`design="shifted"`;
the default forward is `_window`'s) and the state write. The backward is plain JAX (`_interface`).

Every call is packed: `x [T, C]` holding N sequences with bounds `cu [N + 1]` (a dense `[B, S, C]` batch is
B sequences of length S, whose positions are found by division instead of a search). A program owns a tile
of `block_t` tokens x `block_c` channels (channels contiguous) and reads tap `j`'s input as the tile shifted
`W - 1 - j` rows back: the shifted loads overlap in the cache, so HBM sees x about once. A token whose
shifted input lies before its sequence's start reads its sequence's history instead (the newest `W - 1`
columns of its slot of the state pool; zeros without a pool or for a slot outside it). Each token's sequence
is a binary search of `cu` per row of the tile (a few steps of cached loads).

The new states are a second kernel (one program per sequence x channel tile) that writes the pool in place:
the forward kernel has finished reading every history by then, and where several non-empty sequences name
one slot only the last writes it (the reference's order), so no program reads a slot another one writes.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from ejkernel.kernels._triton._helpers import and_masks

from ._parts import (
    TritonCausalConvStatic,
    TritonCausalConvTiling,
    compiler_params,
    kernel_inputs,
    silu,
    unpack_refs,
)


def _positions(cu_ref, rows, st: TritonCausalConvStatic):
    """`(seq, local, inside)` of the int32 token indices `rows`: the token's sequence (clamped into
    `[0, N)`), its offset in it, and whether it belongs to one (tokens past `cu[N]` do not)."""
    if st.seq_len is not None:
        seq = lax.div(rows, jnp.int32(st.seq_len))
        return jnp.minimum(seq, st.num_seqs - 1), rows - seq * st.seq_len, rows < st.tokens
    # seq = the number of bounds cu[1..N] at or below the row: a binary search over [0, N].
    lo, hi = jnp.zeros_like(rows), jnp.full_like(rows, st.num_seqs)
    for _ in range(st.num_seqs.bit_length()):
        mid = lax.div(lo + hi, jnp.int32(2))
        active = lo < hi
        right = cu_ref[jnp.minimum(mid + 1, st.num_seqs)] <= rows
        lo = jnp.where(active & right, mid + 1, lo)
        hi = jnp.where(active & ~right, mid, hi)
    seq = jnp.minimum(lo, st.num_seqs - 1)
    return seq, rows - cu_ref[seq], lo < st.num_seqs


class _ConvTile:
    """One program's view: its channels, taps and bias, and the inputs of the tokens at given rows."""

    def __init__(self, st, cu_ref, slots_ref, x_ref, w_ref, b_ref, state_ref, block_c):
        self.st, self.cu_ref, self.slots_ref, self.x_ref, self.state_ref = st, cu_ref, slots_ref, x_ref, state_ref
        c0 = pl.program_id(1) * block_c
        self.block = pl.ds(pl.multiple_of(c0, block_c), block_c)
        self.cols = c0 + jnp.arange(block_c, dtype=jnp.int32)[None, :]
        # [1, block_c]: the channels that exist; None where every tile is whole (no mask to evaluate)
        self.col_ok = None if st.channels % block_c == 0 else self.cols < st.channels

        def load(ref, *index):  # a channel vector, zeros past the channels
            mask = None if self.col_ok is None else self.col_ok[0]
            return plgpu.load(ref.at[index], mask=mask, other=0.0 if mask is not None else None).astype(jnp.float32)

        # taps[s]: the weight of the input s tokens back (tap W - 1 - s)
        self.taps = [load(w_ref, self.cols[0], st.width - 1 - s)[None, :] for s in range(st.width)]
        self.bias = load(b_ref, self.cols[0])[None, :] if b_ref is not None else None

    def mask(self, row_ok):
        """`[rows, block_c]`: rows where `row_ok` (a vector), channels that exist."""
        return and_masks(None if row_ok is None else row_ok[:, None], self.col_ok)

    def x_rows(self, rows, shift):
        """x at `rows + shift` (float32, zeros outside `[0, T)`)."""
        src = rows + shift
        mask = self.mask((src >= 0) & (src < self.st.tokens))
        src = jnp.clip(src, 0, self.st.tokens - 1)[:, None]
        return plgpu.load(self.x_ref.at[src, self.cols], mask=mask, other=0.0).astype(jnp.float32)

    def history(self, where):
        """Per tap s = 1 .. W-1: the history entry s tokens back of the tokens at positions `where`, for those
        fewer than s tokens into their sequence (zeros elsewhere, and for a slot outside the pool). Skipped
        (zeros) for a tile that holds no such token."""
        st = self.st
        seq, local, inside = where
        slot = self.slots_ref[seq]
        slot_ok = inside & (slot >= 0) & (slot < st.num_slots)
        slot = jnp.clip(slot, 0, st.num_slots - 1)[:, None]
        shape = (local.shape[0], self.cols.shape[1])

        def load():
            past = []
            for s in range(1, st.width):
                column = jnp.clip(st.state_width - s + local, 0, st.state_width - 1)[:, None]
                mask = self.mask(slot_ok & (local < s))
                past.append(plgpu.load(self.state_ref.at[slot, self.cols, column], mask=mask, other=0.0))
            return tuple(p.astype(jnp.float32) for p in past)

        near_start = jnp.min(jnp.where(slot_ok, local, st.width)) < st.width - 1
        return lax.cond(near_start, load, lambda: (jnp.zeros(shape, jnp.float32),) * (st.width - 1))

    def inputs(self, rows, where):
        """Per tap: the input `s` tokens back of the tokens at `rows` (positions `where`)."""
        st = self.st
        _, local, inside = where
        past = self.history(where) if st.state_width is not None and st.width > 1 else None
        values = []
        for s in range(st.width):
            value = jnp.where((inside & (local >= s))[:, None], self.x_rows(rows, -s), 0.0)
            values.append(value if past is None or s == 0 else value + past[s - 1])
        return values

    def preactivation(self, values):
        y = sum(self.taps[s] * v for s, v in enumerate(values))
        return y if self.bias is None else y + self.bias


def _forward_kernel(*refs, st: TritonCausalConvStatic, block_t: int, block_c: int):
    cu_ref, slots_ref, x_ref, w_ref, b_ref, state_ref, rest = unpack_refs(refs, st)
    out_ref = rest[0]  # (then the aliased pool, untouched)
    tile = _ConvTile(st, cu_ref, slots_ref, x_ref, w_ref, b_ref, state_ref, block_c)
    t0 = pl.program_id(0) * block_t
    rows = t0 + jnp.arange(block_t, dtype=jnp.int32)
    where = _positions(cu_ref, rows, st)
    y = tile.preactivation(tile.inputs(rows, where))
    if st.silu:
        y = silu(y, st.fast_silu)
    y = jnp.where(where[2][:, None], y, 0.0)
    mask = tile.mask(None if st.tokens % block_t == 0 else rows < st.tokens)
    plgpu.store(out_ref.at[pl.ds(pl.multiple_of(t0, block_t), block_t), tile.block], y.astype(out_ref.dtype), mask=mask)


def forward(st: TritonCausalConvStatic, t: TritonCausalConvTiling, interpret: bool, cu, slots, x, weight, bias, state):
    """`out [T, C]` in x's dtype, and the pool, passed through untouched (aliased: from here to the state
    write the pool is one buffer, so a donated pool is updated in place and read before it is written)."""
    args = kernel_inputs(cu, slots, x, weight, bias, state)
    out_shape = [jax.ShapeDtypeStruct(x.shape, x.dtype)]
    if state is not None:
        out_shape.append(jax.ShapeDtypeStruct(state.shape, state.dtype))
    out = pl.pallas_call(
        functools.partial(_forward_kernel, st=st, block_t=t.block_t, block_c=t.block_c),
        out_shape=out_shape,
        grid=(pl.cdiv(st.tokens, t.block_t), pl.cdiv(st.channels, t.block_c)),
        input_output_aliases={len(args) - 1: 1} if state is not None else {},
        compiler_params=compiler_params(t),
        interpret=interpret,
        name="ejkernel_causal_conv1d_fwd",
    )(*args)
    return out[0], (out[1] if state is not None else None)


def _later_writer(cu_ref, slots_ref, r, slot, num_seqs: int):
    """Whether a non-empty sequence after `r` names `slot` (it writes the slot instead of `r`)."""
    block = min(128, pl.next_power_of_2(num_seqs))

    def body(b, found):
        idx = b * block + jnp.arange(block, dtype=jnp.int32)
        later = (idx > r) & (idx < num_seqs)
        idx = jnp.minimum(idx, num_seqs - 1)
        hit = later & (cu_ref[idx + 1] > cu_ref[idx]) & (slots_ref[idx] == slot)
        return jnp.maximum(found, jnp.max(hit.astype(jnp.int32)))

    return lax.fori_loop(lax.div(r, jnp.int32(block)), pl.cdiv(num_seqs, block), body, jnp.int32(0)) > 0


def _state_kernel(cu_ref, slots_ref, x_ref, state_ref, new_ref, *, st: TritonCausalConvStatic, block_c: int):
    r, c0 = pl.program_id(0), pl.program_id(1) * block_c  # (read outside `pl.when`: interpret mode needs it)
    start, length = cu_ref[r], cu_ref[r + 1] - cu_ref[r]
    slot = slots_ref[r]
    writes = (length > 0) & (slot >= 0) & (slot < st.num_slots)
    if not st.unique_slots:
        writes = writes & ~_later_writer(cu_ref, slots_ref, r, slot, st.num_seqs)

    @pl.when(writes)
    def _():
        kept = st.state_width
        column = jnp.arange(pl.next_power_of_2(kept), dtype=jnp.int32)[:, None]  # [Ws (padded), 1]
        cols = (c0 + jnp.arange(block_c, dtype=jnp.int32))[None, :]
        ok = (column < kept) & (cols < st.channels)
        pos = length + column  # in the stream history ++ tokens, whose last Ws entries are the new state
        from_history = pos < kept
        old = plgpu.load(state_ref.at[slot, cols, jnp.minimum(pos, kept - 1)], mask=ok & from_history, other=0.0)
        row = jnp.clip(start + pos - kept, 0, st.tokens - 1)
        new = plgpu.load(x_ref.at[row, cols], mask=ok & ~from_history, other=0.0).astype(new_ref.dtype)
        plgpu.store(new_ref.at[slot, cols, column], jnp.where(from_history, old, new), mask=ok)


def write_states(st: TritonCausalConvStatic, t: TritonCausalConvTiling, interpret: bool, cu, slots, x, pool):
    """The pool after each non-empty sequence's slot (in range) takes the last Ws inputs of its stream; written
    in place (the pool is aliased to the result), the slot named last by the sequences winning."""
    return pl.pallas_call(
        functools.partial(_state_kernel, st=st, block_c=t.block_c),
        out_shape=jax.ShapeDtypeStruct(pool.shape, pool.dtype),
        grid=(st.num_seqs, pl.cdiv(st.channels, t.block_c)),
        input_output_aliases={3: 0},
        compiler_params=compiler_params(t),
        interpret=interpret,
        name="ejkernel_causal_conv1d_state",
    )(cu, slots, x, pool)
