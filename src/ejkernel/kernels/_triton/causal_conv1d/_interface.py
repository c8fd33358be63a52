"""The causal depthwise convolution through Pallas-Triton kernels: what it declines, the tiles, the custom VJP.

Semantics are those of `ejkernel.reference.causal_conv1d`. A dense batch `[B, S, C]` runs as B packed
sequences of S tokens (a free reshape) with slot b for row b's state. The forward is two kernels: the
convolution, then the state write into the pool, in place (`_kernel`). The backward of a call without a state (the
training forms) is a kernel of its own (`_backward`: dx, dw and db from x and dout in one pass; on an H200, 16384
tokens x 8192 channels, W 4, bf16, SiLU: 0.27 ms against 1.09 for XLA's autodiff, session 38); a call with a state
takes the VJP of the same call in plain JAX (`kernels/_common/causal_conv1d`), which recomputes what it needs from
the inputs. On a GPU, 16-bit inputs take SiLU's sigmoid through the hardware's approximate tanh (`_parts.silu`), within
their rounding.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from ejkernel.kernels._common.bounds import clamp_packed
from ejkernel.kernels._common.causal_conv1d import convolve
from ejkernel.kernels._triton._helpers import resolve_interpret

from ._backward import backward_run, window_backward
from ._kernel import forward, write_states
from ._parts import TritonCausalConvStatic, TritonCausalConvTiling
from ._window import window_forward

WHO = "triton causal_conv1d"
SUPPORTED_DTYPES = tuple(jnp.dtype(d) for d in (jnp.float32, jnp.bfloat16, jnp.float16))
MAX_WIDTH = 8
"""The kernels unroll the taps (each a row of registers per step); wider filters run on XLA."""
FORWARD_TILING = TritonCausalConvTiling(block_t=64, block_c=1024, num_warps=8, num_stages=1, step_rows=8)
"""The sliding window's default: among the fastest measured on an H200 (16384 tokens x 8192 channels, W 4, bf16,
SiLU through the approximate tanh: 0.88 of the device's copy bandwidth dense, 0.85 packed on a pool; session 38)."""
SHIFTED_TILING = TritonCausalConvTiling(block_t=32, block_c=256, num_warps=4, num_stages=1, design="shifted")
"""The shifted tiles' default, where `design="shifted"`."""
BACKWARD_TILING = TritonCausalConvTiling(block_t=256, block_c=1024, num_warps=8, num_stages=1, step_rows=8)
"""The backward kernel's default (its run the largest power of two dividing the sequence length, at most `block_t`):
long runs keep the halo rows and the per-run dw partial sums few."""


def _decline(x, weight, bias, conv_state, cu_seqlens) -> None:
    """NotImplementedError for the calls the kernels do not serve (`platform="auto"` then runs XLA's)."""
    for name, array in (("x", x), ("weight", weight), ("bias", bias), ("conv_state", conv_state)):
        if array is not None and jnp.dtype(array.dtype) not in SUPPORTED_DTYPES:
            raise NotImplementedError(f"{WHO} takes float32/bfloat16/float16 {name}, got {array.dtype}")
    if weight.shape[1] > MAX_WIDTH:
        raise NotImplementedError(f"{WHO} unrolls at most {MAX_WIDTH} taps, got width {weight.shape[1]}")
    if conv_state is not None and 0 in conv_state.shape:
        raise NotImplementedError(f"{WHO} takes a state pool with slots and columns, got {tuple(conv_state.shape)}")
    if cu_seqlens is not None and cu_seqlens.shape[0] < 2:
        raise NotImplementedError(f"{WHO} needs at least one sequence, got cu_seqlens of shape {cu_seqlens.shape}")


def forward_tiling(cfg, tokens: int, channels: int, num_seqs: int) -> TritonCausalConvTiling:
    """The forward's tiles: `fwd_params` (`block_k` tokens, `block_d` channels, `num_warps`, `num_stages`) and its
    design (`cfg.triton_tiling`: `forward`, `step_rows`, `prefetch`), defaults where unset, no larger than the
    problem. The window's default run is no longer than the sequences' mean length: a decode batch (a token a
    sequence) gets a program a token, each inside its sequence (the unmasked walk), not 64 tokens walked row by
    row across sequence bounds."""
    design = getattr(cfg, "triton_tiling", None)
    design_field = lambda name: None if design is None else getattr(design, name)
    default = SHIFTED_TILING if design_field("forward") == "shifted" else FORWARD_TILING
    default_t = default.block_t
    if default.design == "window":
        default_t = min(default_t, pl.next_power_of_2(pl.cdiv(tokens, max(num_seqs, 1))))
    params = getattr(cfg, "fwd_params", None)
    read = lambda name, fallback: getattr(params, name, None) or fallback
    block_t = min(read("block_k", default_t), pl.next_power_of_2(tokens))
    return TritonCausalConvTiling(
        block_t=block_t,
        block_c=min(read("block_d", default.block_c), pl.next_power_of_2(channels)),
        num_warps=read("num_warps", default.num_warps),
        num_stages=read("num_stages", default.num_stages),
        design=default.design,
        step_rows=min(design_field("step_rows") or default.step_rows, block_t),
        prefetch=bool(design_field("prefetch")),
    )


def backward_tiling(cfg, channels: int) -> TritonCausalConvTiling:
    """The backward kernel's tiles: `bwd_params` (`block_k` tokens at most, `block_d` channels, `num_warps`) and the
    window's `step_rows` (`cfg.triton_tiling`), `BACKWARD_TILING` where unset."""
    design, params = getattr(cfg, "triton_tiling", None), getattr(cfg, "bwd_params", None)
    read = lambda name, fallback: getattr(params, name, None) or fallback
    return TritonCausalConvTiling(
        block_t=pl.next_power_of_2(read("block_k", BACKWARD_TILING.block_t)),
        block_c=min(read("block_d", BACKWARD_TILING.block_c), pl.next_power_of_2(channels)),
        num_warps=read("num_warps", BACKWARD_TILING.num_warps),
        num_stages=1,
        step_rows=getattr(design, "step_rows", None) or BACKWARD_TILING.step_rows,
    )


def _run(st, tilings, interpret, cu, slots, x, weight, bias, state):
    tiling = tilings[0]
    kernel = window_forward if tiling.design == "window" else forward
    out, pool = kernel(st, tiling, interpret, cu, slots, x, weight, bias, state)
    if state is None:
        return out
    return out, write_states(st, tiling, interpret, cu, slots, x, pool)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _conv(st, tilings, interpret, cu, slots, x, weight, bias, state):
    return _run(st, tilings, interpret, cu, slots, x, weight, bias, state)


def _conv_fwd(st, tilings, interpret, cu, slots, x, weight, bias, state):
    result = _run(st, tilings, interpret, cu, slots, x, weight, bias, state)
    return result, (cu, slots, x, weight, bias, state)


def _writers(st: TritonCausalConvStatic, cu, slots):
    """`[N]` bool: the sequences that write their slot (non-empty, in the pool, the last to name it), as
    `write_states` picks them."""
    order = jnp.arange(st.num_seqs, dtype=jnp.int32)
    busy = (cu[1:] > cu[:-1]) & (slots >= 0) & (slots < st.num_slots)
    last = jnp.full((st.num_slots,), -1, jnp.int32).at[jnp.where(busy, slots, st.num_slots)].max(order, mode="drop")
    return busy & (last[jnp.clip(slots, 0, st.num_slots - 1)] == order)


def _plain(st: TritonCausalConvStatic, cu, slots, x, weight, bias, state):
    """The forward in plain JAX (`_common.causal_conv1d`) on the kernels' operands, with their result's structure:
    a dense batch as `[B, S, C]` (its shifts need no sequence lookup), the pool's writers as the kernels pick them."""
    activation = "silu" if st.silu else None
    if st.seq_len is not None:
        dense = x.reshape(st.num_seqs, st.seq_len, st.channels)
        result = convolve(dense, weight, bias, state, None, None, activation)
    else:
        writers = None if state is None or st.unique_slots else _writers(st, cu, slots)
        result = convolve(x, weight, bias, state, cu, slots, activation, writers)
    if state is None:
        return result.reshape(x.shape)
    return result[0].reshape(x.shape), result[1]


def _conv_bwd(st, tilings, interpret, residuals, cotangents):
    """The backward kernel where it serves the call (`_backward.backward_run`), else the VJP of the plain-JAX
    forward on the inputs; either recomputes what it needs."""
    cu, slots, x, weight, bias, state = residuals
    no_grad = lambda a: np.zeros(a.shape, jax.dtypes.float0)
    run = backward_run(st, tilings[1].block_t)
    if run is not None:
        grads = window_backward(st, tilings[1], run, interpret, cu, x, weight, bias, cotangents)
        return no_grad(cu), no_grad(slots), *grads, None
    _, pullback = jax.vjp(functools.partial(_plain, st, cu, slots), x, weight, bias, state)
    return no_grad(cu), no_grad(slots), *pullback(cotangents)


_conv.defvjp(_conv_fwd, _conv_bwd)


def causal_conv1d_triton(
    x,
    weight,
    bias=None,
    conv_state=None,
    cu_seqlens=None,
    state_indices=None,
    *,
    activation=None,
    cfg=None,
    interpret: bool | None = None,
):
    """Dense `x [B, S, C]` or packed `x [T, C]` (with `cu_seqlens [N+1]`), `weight [C, W]`, `bias [C]`; with
    `conv_state` (`[B, C, Ws]`, or a pool `[slots, C, Ws]` indexed by `state_indices [N]`) the result is
    `(out, new_state)`, else `out`. The arguments are the op's canonical ones, checked by the public
    function; `cfg.fwd_params` and `cfg.triton_tiling` tile the forward (`forward_tiling`), `cfg.bwd_params` (and
    `triton_tiling.step_rows`) the backward kernel (`backward_tiling`).
    `interpret`: Pallas interpret mode (None: compiled, on a GPU only)."""
    _decline(x, weight, bias, conv_state, cu_seqlens)
    interpret = resolve_interpret(interpret, WHO)
    channels, width = weight.shape
    if cu_seqlens is None:
        batch, seq_len = x.shape[0], x.shape[1]
        tokens = x.reshape(batch * seq_len, channels)
        cu = jnp.asarray(np.arange(batch + 1, dtype=np.int32) * seq_len)
        slots = jnp.arange(batch, dtype=jnp.int32)
    else:
        tokens, seq_len = x, None
        cu = jnp.asarray(clamp_packed(cu_seqlens, x.shape[0]), jnp.int32)
        num_seqs = cu.shape[0] - 1
        slots = jnp.arange(num_seqs, dtype=jnp.int32) if state_indices is None else state_indices.astype(jnp.int32)
    st = TritonCausalConvStatic(
        tokens=tokens.shape[0],
        channels=channels,
        width=width,
        num_seqs=cu.shape[0] - 1,
        seq_len=seq_len,
        state_width=None if conv_state is None else conv_state.shape[2],
        num_slots=0 if conv_state is None else conv_state.shape[0],
        silu=activation in ("silu", "swish"),
        fast_silu=not interpret and jnp.dtype(x.dtype) != jnp.float32,
        has_bias=bias is not None,
        unique_slots=cu_seqlens is None or state_indices is None,
    )
    tilings = forward_tiling(cfg, st.tokens, channels, st.num_seqs), backward_tiling(cfg, channels)
    result = _conv(st, tilings, interpret, cu, slots, tokens, weight, bias, conv_state)
    if conv_state is None:
        return result.reshape(x.shape)
    return result[0].reshape(x.shape), result[1]
