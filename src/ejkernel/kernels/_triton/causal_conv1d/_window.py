"""The sliding-window forward of the causal depthwise convolution: each input row is read from HBM once.

A program owns a run of `block_t` tokens x `block_c` channels (channels contiguous) and walks it in steps of
`step_rows` rows, carrying the last `W - 1` input rows of the run's sequence in registers: a step loads its
rows (one contiguous channel vector each, independent of the carry, so the loads of a step are in flight
together), makes their outputs from the carry and the new rows, and keeps the newest `W - 1` rows. With
`prefetch`, a step loads the next step's rows instead of its own (carried in registers to the next step), so
that loads are in flight while a step computes and stores. Before the
walk the carry is filled with the `W - 1` inputs before the run: x's rows, or, before the sequence's start, the
newest columns of its slot of the state pool (zeros without a pool or for a slot outside it).

A run inside one sequence (its first token's sequence holds its last token too: in a dense batch whose length
`block_t` divides, every run) walks without a mask or a sequence lookup. Any other run (it crosses sequence
bounds, holds padding tokens past `cu[N]`, or ends past the tokens) walks one row at a time, following the
bounds with a scalar sequence index and refilling the carry from the new sequence's history at its first
token. Packed calls find a run's first sequence with one scalar binary search of `cu`.
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
    sequence_of,
    silu,
    unpack_refs,
)


class _Run:
    """One program's channels, taps and bias, and the loads and stores of single rows."""

    def __init__(self, st: TritonCausalConvStatic, refs, block_c: int):
        self.st = st
        self.cu_ref, self.slots_ref, self.x_ref, w_ref, b_ref, self.state_ref, (self.out_ref, *_) = unpack_refs(
            refs, st
        )
        c0 = pl.program_id(1) * block_c
        self.block = pl.ds(pl.multiple_of(c0, block_c), block_c)
        self.cols = c0 + jnp.arange(block_c, dtype=jnp.int32)
        # the channels that exist; None where every program's channels do (no mask to evaluate)
        self.col_ok = None if st.channels % block_c == 0 else self.cols < st.channels
        # taps[s]: the weight of the input s tokens back (tap W - 1 - s)
        self.taps = [self._load(w_ref.at[self.cols, st.width - 1 - s]) for s in range(st.width)]
        self.bias = self._load(b_ref.at[self.cols]) if b_ref is not None else None

    def _load(self, at, where=None, as_stored=False):
        """A channel vector in float32 (`as_stored`: in its own dtype), zeros where `where` (a scalar) is False
        or past the channels."""
        mask = and_masks(None if where is None else jnp.full(self.cols.shape, where), self.col_ok)
        value = plgpu.load(at, mask=mask, other=0.0 if mask is not None else None)
        return value if as_stored else value.astype(jnp.float32)

    def x_row(self, row, where=None, as_stored=False):
        """x's row `row` (clamped into the tokens; zeros where `where` is False)."""
        return self._load(self.x_ref.at[jnp.clip(row, 0, self.st.tokens - 1), self.block], where, as_stored)

    def start(self, seq):
        """The first token of sequence `seq`, a scalar."""
        return seq * self.st.seq_len if self.st.seq_len is not None else self.cu_ref[seq]

    def sequence_of(self, row):
        """The sequence holding token `row` (`_parts.sequence_of`)."""
        return sequence_of(self.cu_ref, row, self.st)

    def before(self, row, seq):
        """The `W - 1` inputs before token `row` of sequence `seq`, oldest first: x's rows from the sequence's
        start on, its history (the newest columns of its slot) before it."""
        st = self.st
        begin = self.start(seq)
        if st.state_width is not None:
            slot = self.slots_ref[seq]
            slot_ok = (slot >= 0) & (slot < st.num_slots)
            slot = jnp.clip(slot, 0, st.num_slots - 1)
        window = []
        for back in range(st.width - 1, 0, -1):
            source = row - back
            value = self.x_row(source, source >= begin)
            if st.state_width is not None:  # column Ws - 1 holds the input one token before the start
                column = jnp.clip(st.state_width - begin + source, 0, st.state_width - 1)
                value = value + self._load(self.state_ref.at[slot, self.cols, column], slot_ok & (source < begin))
            window.append(value)
        return window

    def output(self, window, current):
        """The output of the token whose input is `current`, after the inputs `window` (oldest first)."""
        stream = [*window, current]
        y = sum(self.taps[s] * stream[-1 - s] for s in range(self.st.width))
        y = y if self.bias is None else y + self.bias
        return silu(y, self.st.fast_silu) if self.st.silu else y

    def store(self, row, y, where=None):
        """`y` into the output's row `row` (nothing where `where` is False)."""
        mask = and_masks(None if where is None else jnp.full(self.cols.shape, where), self.col_ok)
        plgpu.store(self.out_ref.at[row, self.block], y.astype(self.out_ref.dtype), mask=mask)


def _window_kernel(*refs, st: TritonCausalConvStatic, block_t: int, block_c: int, step_rows: int, prefetch: bool):
    run = _Run(st, refs, block_c)
    keep = st.width - 1
    t0 = pl.program_id(0) * block_t
    seq = run.sequence_of(t0)
    end = run.start(seq + 1) if st.seq_len is not None else run.cu_ref[seq + 1]
    inside = (t0 + block_t <= st.tokens) & (t0 + block_t <= end)
    window = tuple(run.before(t0, seq))

    def unmasked_steps():
        count = block_t // step_rows
        load = lambda first: tuple(run.x_row(first + r, as_stored=True) for r in range(step_rows))

        def step(i, carry):
            window, ahead = carry
            first = t0 + i * step_rows
            own = ahead if prefetch else load(first)
            if prefetch:  # the next step's rows, in flight during this step's (the last step's own again)
                ahead = load(t0 + jnp.minimum(i + 1, count - 1) * step_rows)
            stream = [*window, *(row.astype(jnp.float32) for row in own)]
            for r in range(step_rows):
                run.store(first + r, run.output(stream[r : r + keep], stream[keep + r]))
            return tuple(stream[len(stream) - keep :]), ahead

        lax.fori_loop(0, count, step, (window, load(t0) if prefetch else ()))

    def row_by_row():
        last = st.tokens if st.seq_len is not None else run.cu_ref[st.num_seqs]

        def row_step(i, carry):
            seq, window = carry
            row = t0 + i
            if st.seq_len is not None:
                seq = run.sequence_of(row)
            else:  # past the bounds at or below the row (several where sequences are empty)
                behind_row = lambda seq: (seq < st.num_seqs - 1) & (run.cu_ref[seq + 1] <= row)
                seq = lax.while_loop(behind_row, lambda seq: seq + 1, seq)
            begins = (row == run.start(seq)) & (row < last)
            if keep:
                window = lax.cond(begins, lambda: tuple(run.before(row, seq)), lambda: window)
            current = run.x_row(row, row < st.tokens)
            y = jnp.where(row < last, run.output(window, current), 0.0)
            run.store(jnp.minimum(row, st.tokens - 1), y, row < st.tokens)
            return seq, (*window, current)[1:]

        lax.fori_loop(0, block_t, row_step, (seq, window))

    lax.cond(inside, unmasked_steps, row_by_row)


def window_forward(
    st: TritonCausalConvStatic, t: TritonCausalConvTiling, interpret: bool, cu, slots, x, weight, bias, state
):
    """`out [T, C]` in x's dtype, and the pool passed through untouched (aliased, as by `_kernel.forward`)."""
    args = kernel_inputs(cu, slots, x, weight, bias, state)
    out_shape = [jax.ShapeDtypeStruct(x.shape, x.dtype)]
    if state is not None:
        out_shape.append(jax.ShapeDtypeStruct(state.shape, state.dtype))
    kernel = functools.partial(
        _window_kernel, st=st, block_t=t.block_t, block_c=t.block_c, step_rows=t.step_rows, prefetch=t.prefetch
    )
    out = pl.pallas_call(
        kernel,
        out_shape=out_shape,
        grid=(pl.cdiv(st.tokens, t.block_t), pl.cdiv(st.channels, t.block_c)),
        input_output_aliases={len(args) - 1: 1} if state is not None else {},
        compiler_params=compiler_params(t),
        interpret=interpret,
        name="ejkernel_causal_conv1d_window",
    )(*args)
    return out[0], (out[1] if state is not None else None)
