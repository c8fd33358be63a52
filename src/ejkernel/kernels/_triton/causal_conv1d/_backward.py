"""The dense causal convolution's backward as one Pallas-Triton kernel: dx, and per-run partial sums of dw and db.

It serves dense batches without an initial state whose length the run divides (the training form; every other
call's backward is plain JAX, `_interface`). A program owns a run of `block_t` tokens x `block_c` channels of one
sequence and walks it `step_rows` rows a step, keeping in registers the last `W - 1` inputs (to recompute the
pre-activation `pre[u] = b + Σ_s w_s x[u - s]`, zeros before the sequence) and the last `W - 1` pre-activation
gradients `dpre[u] = dout[u] · act'(pre[u])`. Row u's dpre completes dx of row `t = u - (W - 1)`,
`dx[t] = Σ_s w_s dpre[t + s]`; a tail of `W - 1` rows past the run (zero past the sequence) completes the run's last
rows. dw and db accumulate over the run's own rows in registers and are written per run (`[runs, C, W]` and
`[runs, C]`, float32), for the caller to sum. x and dout are read once, plus `W - 1` rows of halo on each side of a
run, and dx is written once.
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

from ._parts import TritonCausalConvStatic, TritonCausalConvTiling, compiler_params, silu_grad

MIN_RUN = 16
"""The shortest run the kernel walks; a sequence length with no power-of-two divisor this large (or a call with an
initial state, or packed) takes the plain-JAX backward."""


def backward_run(st: TritonCausalConvStatic, block_t: int) -> int | None:
    """The run of the backward's programs: the largest power of two dividing the sequence length, at most `block_t`;
    None for a call the kernel does not serve (packed, an initial state, no such run of `MIN_RUN` tokens)."""
    if st.seq_len is None or st.state_width is not None:
        return None
    run = math.gcd(st.seq_len, block_t)  # (block_t a power of two)
    return run if run >= MIN_RUN else None


def _backward_kernel(*refs, st: TritonCausalConvStatic, block_t: int, block_c: int, step_rows: int):
    x_ref, w_ref, *refs = refs
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
    t0 = run * block_t
    start = lax.div(t0, jnp.int32(st.seq_len)) * st.seq_len
    end = start + st.seq_len
    row = lambda ref, u, where=None: load(ref.at[jnp.clip(u, 0, st.tokens - 1), block], where)

    def pre_grad(inputs, dout):
        """`dpre` of the row whose input is `inputs[-1]` (after `inputs[:-1]`, oldest first)."""
        pre = sum(taps[s] * inputs[-1 - s] for s in range(width))
        pre = pre if bias is None else pre + bias
        return dout * silu_grad(pre, st.fast_silu) if st.silu else dout

    def emit(t, grads, where=None):
        """dx of row t from the dpre of rows t .. t + W - 1 (`grads`, oldest first)."""
        dx = sum(taps[s] * grads[s] for s in range(width))
        plgpu.store(dx_ref.at[jnp.clip(t, 0, st.tokens - 1), block], dx.astype(dx_ref.dtype), mask=mask(where))

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

    zeros = jnp.zeros((block_c,), jnp.float32)
    inputs = tuple(row(x_ref, t0 - back, t0 - back >= start) for back in range(keep, 0, -1))
    carry = (inputs, (zeros,) * keep, (zeros,) * width, zeros)
    inputs, grads, dw, db = lax.fori_loop(0, block_t // step_rows, step, carry)
    stream, grads = list(inputs), list(grads)
    for r in range(keep):  # the rows past the run complete its last dx; they count in another run's dw and db
        u = t0 + block_t + r
        stream.append(row(x_ref, u, u < end))
        grads.append(pre_grad(stream[-width:], row(dout_ref, u, u < end)))
        emit(u - keep, grads[-width:])
    for s in range(width):
        plgpu.store(dw_ref.at[run, cols, width - 1 - s], dw[s], mask=col_ok)
    plgpu.store(db_ref.at[run, cols], db, mask=col_ok)


def window_backward(st: TritonCausalConvStatic, t: TritonCausalConvTiling, interpret: bool, x, weight, bias, dout):
    """`(dx [T, C] in x's dtype, dw [C, W], db [C] or None in their dtypes)` of a dense call without an initial state
    (`backward_run(st, t.block_t)` is its run: not None)."""
    block_t = backward_run(st, t.block_t)
    runs = st.tokens // block_t
    args = [x, weight] + ([bias] if bias is not None else []) + [dout]
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
