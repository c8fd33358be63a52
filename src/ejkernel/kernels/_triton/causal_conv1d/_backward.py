"""The causal convolution's backward as one Pallas-Triton kernel: dx, and per-run partial sums of dw and db.

It serves calls without a state (the training forms: dense batches, packed sequences); the backward of a call with
one is plain JAX (`_interface`). A program owns a run of `block_t` tokens x `block_c` channels and walks it row by
row, keeping in registers the last `W - 1` inputs (to recompute the pre-activation `pre[u] = b + Σ_s w_s x[u - s]`,
zeros before a sequence's start) and the last `W - 1` pre-activation gradients `dpre[u] = dout[u] · act'(pre[u])`.
Row u's dpre completes dx of row `t = u - (W - 1)`, `dx[t] = Σ_s w_s dpre[t + s]` over the rows of t's sequence; a
tail of `W - 1` rows past the run completes the run's last rows. dw and db accumulate over the run's own rows in
registers and are written per run (`[runs, C, W]` and `[runs, C]`, float32), for the caller to sum. x and dout are
read once, plus `W - 1` rows of halo on each side of a run, and dx is written once.

A run inside one sequence (every run of a dense batch whose length it divides) walks `step_rows` rows a step
without a sequence lookup; any other (it crosses sequence bounds, or holds padding tokens past `cu[N]`) walks one
row at a time, following the bounds and the sequence end of each row it completes, as the forward's window does.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from ejkernel.kernels._triton._helpers import and_masks

from ._parts import TritonCausalConvStatic, TritonCausalConvTiling, compiler_params, sequence_of, silu_grad

MIN_RUN = 16
"""The shortest run of a dense batch's backward; a sequence length with no power-of-two divisor this large takes
the plain-JAX backward (as a call with a state does)."""


def backward_run(st: TritonCausalConvStatic, block_t: int) -> int | None:
    """The run of the backward's programs (`block_t` a power of two), None for a call the kernel does not serve (a
    state; no tokens; a dense length with no power-of-two divisor of `MIN_RUN` or more). Dense: the largest power of
    two dividing the length, at most `block_t` (every run inside one sequence); packed: at most `block_t` and no
    longer than the sequences' mean length."""
    if st.state_width is not None or st.tokens == 0:
        return None
    if st.seq_len is None:
        return max(MIN_RUN, min(block_t, pl.next_power_of_2(pl.cdiv(st.tokens, st.num_seqs))))
    run = math.gcd(st.seq_len, block_t)
    return run if run >= MIN_RUN else None


def _backward_kernel(*refs, st: TritonCausalConvStatic, block_t: int, block_c: int, step_rows: int):
    cu_ref, x_ref, w_ref, *refs = refs
    b_ref = refs.pop(0) if st.has_bias else None
    dout_ref, dx_ref, dw_ref, db_ref = refs
    width, keep = st.width, st.width - 1
    run, c0 = pl.program_id(0), pl.program_id(1) * block_c
    cols = c0 + jnp.arange(block_c, dtype=jnp.int32)
    block = pl.ds(pl.multiple_of(c0, block_c), block_c)
    col_ok = None if st.channels % block_c == 0 else cols < st.channels

    def mask(where):
        """The channels that exist, where `where` (a scalar, or None) holds."""
        return and_masks(None if where is None else jnp.full(cols.shape, where), col_ok)

    def load(at, where=None):
        """A channel vector in float32, zeros where `where` is False or past the channels."""
        valid = mask(where)
        return plgpu.load(at, mask=valid, other=None if valid is None else 0.0).astype(jnp.float32)

    taps = [load(w_ref.at[cols, width - 1 - s]) for s in range(width)]  # taps[s]: the input s tokens back
    bias = load(b_ref.at[cols]) if b_ref is not None else None
    row = lambda ref, u, where=None: load(ref.at[jnp.clip(u, 0, st.tokens - 1), block], where)
    t0 = run * block_t
    seq = sequence_of(cu_ref, t0, st)
    start, end = cu_ref[seq], cu_ref[seq + 1]

    def pre_grad(inputs, dout):
        """`dpre` of the row whose input is `inputs[-1]` (after `inputs[:-1]`, oldest first)."""
        pre = sum(taps[s] * inputs[-1 - s] for s in range(width))
        pre = pre if bias is None else pre + bias
        return dout * silu_grad(pre, st.fast_silu) if st.silu else dout

    def emit(t, grads, where=None, kept=None):
        """dx of row t from the dpre of rows t .. t + W - 1 (`grads`, oldest first; `kept[s]`: whether row t + s
        is in t's sequence, None: all)."""
        terms = [taps[s] * grads[s] for s in range(width)]
        dx = sum(terms if kept is None else [jnp.where(k, term, 0.0) for k, term in zip(kept, terms, strict=True)])
        plgpu.store(dx_ref.at[jnp.clip(t, 0, st.tokens - 1), block], dx.astype(dx_ref.dtype), mask=mask(where))

    def store_sums(dw, db):
        for s in range(width):
            plgpu.store(dw_ref.at[run, cols, width - 1 - s], dw[s], mask=col_ok)
        plgpu.store(db_ref.at[run, cols], db, mask=col_ok)

    zeros = jnp.zeros((block_c,), jnp.float32)
    before = tuple(row(x_ref, t0 - back, t0 - back >= start) for back in range(keep, 0, -1))

    def inside_one_sequence():
        def step(i, carry):
            inputs, grads, dw, db = carry
            first = t0 + i * step_rows
            new_inputs = [row(x_ref, first + r) for r in range(step_rows)]
            douts = [row(dout_ref, first + r) for r in range(step_rows)]
            stream, grads, dw = [*inputs, *new_inputs], list(grads), list(dw)
            for r in range(step_rows):
                dpre = pre_grad(stream[r : r + width], douts[r])
                dw = [dw[s] + dpre * stream[keep + r - s] for s in range(width)]
                db = db + dpre
                grads.append(dpre)
                emit(first + r - keep, grads[-width:], where=(i > 0) | (r >= keep))  # (rows before the run: not ours)
            return tuple(stream[len(stream) - keep :]), tuple(grads[len(grads) - keep :]), tuple(dw), db

        carry = (before, (zeros,) * keep, (zeros,) * width, zeros)
        inputs, grads, dw, db = lax.fori_loop(0, block_t // step_rows, step, carry)
        stream, grads = list(inputs), list(grads)
        for r in range(keep):  # the rows past the run complete its last dx; they count in another run's dw and db
            u = t0 + block_t + r
            stream.append(row(x_ref, u, u < end))
            grads.append(pre_grad(stream[-width:], row(dout_ref, u, u < end)))
            emit(u - keep, grads[-width:])
        store_sums(dw, db)

    def row_by_row():
        def visit(u, carry, accumulate: bool):
            seq, inputs, grads, ends, dw, db = carry
            behind = lambda seq: (seq < st.num_seqs - 1) & (cu_ref[seq + 1] <= u)
            seq = lax.while_loop(behind, lambda seq: seq + 1, seq)  # (past empty sequences too)
            begin, stop = cu_ref[seq], cu_ref[seq + 1]
            valid = (u >= begin) & (u < stop)  # (False past the tokens' end)
            inputs = tuple(jnp.where(u == begin, 0.0, x) for x in inputs)  # a sequence starts: zero history
            stream = [*inputs, row(x_ref, u, valid)]
            dpre = pre_grad(stream, row(dout_ref, u, valid))
            if accumulate:
                dw = tuple(dw[s] + dpre * stream[-1 - s] for s in range(width))
                db = db + dpre
            grads, ends = (*grads, dpre), (*ends, jnp.where(valid, stop, 0))
            t = u - keep
            emit(t, grads, where=(t >= t0) & (t < st.tokens), kept=[t + s < ends[0] for s in range(width)])
            return seq, tuple(stream[1:]), grads[1:], ends[1:], dw, db

        carry = (seq, before, (zeros,) * keep, (jnp.int32(0),) * keep, (zeros,) * width, zeros)
        carry = lax.fori_loop(t0, t0 + block_t, functools.partial(visit, accumulate=True), carry)
        carry = lax.fori_loop(t0 + block_t, t0 + block_t + keep, functools.partial(visit, accumulate=False), carry)
        store_sums(*carry[4:])

    if st.seq_len is not None:  # a dense batch: every run inside one sequence (`backward_run`)
        inside_one_sequence()
    else:
        lax.cond(t0 + block_t <= end, inside_one_sequence, row_by_row)


def window_backward(
    st: TritonCausalConvStatic, t: TritonCausalConvTiling, block_t: int, interpret: bool, cu, x, weight, bias, dout
):
    """`(dx [T, C] in x's dtype, dw [C, W], db [C] or None in their dtypes)` of a call without a state, its
    sequences' bounds `cu`, in runs of `block_t` tokens (`backward_run(st, t.block_t)`); `t` gives the rest."""
    runs = pl.cdiv(st.tokens, block_t)
    args = [cu, x, weight] + ([bias] if bias is not None else []) + [dout]
    kernel = functools.partial(
        _backward_kernel, st=st, block_t=block_t, block_c=t.block_c, step_rows=min(t.step_rows, block_t)
    )
    dx, dw, db = pl.pallas_call(
        kernel,
        out_shape=[
            jax.ShapeDtypeStruct(x.shape, x.dtype),
            jax.ShapeDtypeStruct((runs, st.channels, st.width), jnp.float32),
            jax.ShapeDtypeStruct((runs, st.channels), jnp.float32),
        ],
        grid=(runs, pl.cdiv(st.channels, t.block_c)),
        compiler_params=compiler_params(t),
        interpret=interpret,
        name="ejkernel_causal_conv1d_backward",
    )(*args)
    db = None if bias is None else jnp.sum(db, axis=0).astype(bias.dtype)
    return dx, jnp.sum(dw, axis=0).astype(weight.dtype), db
