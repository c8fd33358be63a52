"""The causal depthwise convolution through Pallas-Triton kernels: what it declines, the tiles, the custom VJP.

Semantics are those of `ejkernel.reference.causal_conv1d`. A dense batch `[B, S, C]` runs as B packed
sequences of S tokens (a free reshape) with slot b for row b's state. The forward is two kernels: the
convolution, then the state write into the pool, in place (`_kernel`). The backward's kernel gives dx, the
weight and bias gradients as per-chunk partial sums and the output gradients of each sequence's first
`W - 1` tokens; here, in XLA, the partial sums are added and the history's gradient is assembled (`[N, C, Ws]`,
small), with the pool's: the cotangent of a slot that a sequence wrote does not reach the old pool, that of
an untouched slot passes through, and each sequence's history gradient is added to its slot.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from ejkernel.kernels._common.bounds import clamp_packed
from ejkernel.kernels._triton._helpers import resolve_interpret

from ._kernel import backward, forward, write_states
from ._parts import TritonCausalConvStatic, TritonCausalConvTiling
from ._window import window_forward

WHO = "triton causal_conv1d"
SUPPORTED_DTYPES = tuple(jnp.dtype(d) for d in (jnp.float32, jnp.bfloat16, jnp.float16))
MAX_WIDTH = 8
"""The kernels unroll the taps (the backward W² loads of x); wider filters run on XLA."""
FORWARD_TILING = TritonCausalConvTiling(block_t=64, block_c=1024, num_warps=4, num_stages=1, design="window")
SHIFTED_TILING = TritonCausalConvTiling(block_t=32, block_c=256, num_warps=4, num_stages=1, design="shifted")
"""The forward's tiles: the sliding window's runs by default, the shifted tiles where `design="shifted"`."""
BACKWARD_TILING = TritonCausalConvTiling(block_t=16, block_c=128, num_warps=4, num_stages=2)


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


def tilings(cfg, tokens: int, channels: int) -> tuple[TritonCausalConvTiling, TritonCausalConvTiling]:
    """The forward's and the backward's tiles: `fwd_params` / `bwd_params` (`block_k` tokens, `block_d`
    channels, `num_warps`, `num_stages`) and the forward's design (`cfg.triton_tiling`: `forward`,
    `step_rows`, `prefetch`), defaults where unset, no larger than the problem."""
    design = getattr(cfg, "triton_tiling", None)
    design_field = lambda name: None if design is None else getattr(design, name)
    shifted = design_field("forward") == "shifted"

    def pick(params, default: TritonCausalConvTiling) -> TritonCausalConvTiling:
        read = lambda name, fallback: getattr(params, name, None) or fallback
        block_t = min(read("block_k", default.block_t), pl.next_power_of_2(tokens))
        return TritonCausalConvTiling(
            block_t=block_t,
            block_c=min(read("block_d", default.block_c), pl.next_power_of_2(channels)),
            num_warps=read("num_warps", default.num_warps),
            num_stages=read("num_stages", default.num_stages),
            design=default.design,
            step_rows=min(design_field("step_rows") or default.step_rows, block_t),
            prefetch=bool(design_field("prefetch")),
        )

    forward_default = SHIFTED_TILING if shifted else FORWARD_TILING
    return pick(getattr(cfg, "fwd_params", None), forward_default), pick(
        getattr(cfg, "bwd_params", None), BACKWARD_TILING
    )


def _run(st, tiling, interpret, cu, slots, x, weight, bias, state):
    kernel = window_forward if tiling.design == "window" else forward
    out, pool = kernel(st, tiling, interpret, cu, slots, x, weight, bias, state)
    if state is None:
        return out
    return out, write_states(st, tiling, interpret, cu, slots, x, pool)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _conv(st, fwd_tiling, bwd_tiling, interpret, cu, slots, x, weight, bias, state):
    return _run(st, fwd_tiling, interpret, cu, slots, x, weight, bias, state)


def _conv_fwd(st, fwd_tiling, bwd_tiling, interpret, cu, slots, x, weight, bias, state):
    result = _run(st, fwd_tiling, interpret, cu, slots, x, weight, bias, state)
    return result, (cu, slots, x, weight, bias, state)


def _writers(st: TritonCausalConvStatic, lengths, slots):
    """`[N]` bool: the sequences that write their slot (non-empty, in the pool, the last to name it)."""
    busy = (lengths > 0) & (slots >= 0) & (slots < st.num_slots)
    if st.unique_slots:
        return busy
    order = jnp.arange(st.num_seqs, dtype=jnp.int32)
    last = jnp.full((st.num_slots,), -1, jnp.int32).at[jnp.where(busy, slots, st.num_slots)].max(order, mode="drop")
    return busy & (last[jnp.clip(slots, 0, st.num_slots - 1)] == order)


def _history_grad(st: TritonCausalConvStatic, weight, lengths, first_grads, dnew):
    """`[N, C, Ws]` float32: the gradient reaching each sequence's history, through its first W - 1 tokens'
    taps (`first_grads [N, W - 1, C]`, their output gradients) and through the entries the new state kept."""
    kept, width = st.state_width, st.width
    columns = [jnp.zeros((st.num_seqs, st.channels), jnp.float32) for _ in range(kept)]
    if first_grads is not None:
        exists = jnp.arange(width - 1)[None, :, None] < lengths[:, None, None]
        first_grads = jnp.where(exists, first_grads, 0.0)
        w = weight.astype(jnp.float32)
        for s in range(1, width):  # token `local` reads history column Ws - s + local through tap W - 1 - s
            for local in range(s):
                columns[kept - s + local] += w[:, width - 1 - s] * first_grads[:, local]
    dnew = dnew.astype(jnp.float32)
    for column in range(kept):  # new-state entry k is history column L + k where L + k < Ws
        for k in range(column + 1):
            columns[column] += jnp.where((lengths + k == column)[:, None], dnew[:, :, k], 0.0)
    return jnp.stack(columns, axis=2)


def _conv_bwd(st, fwd_tiling, bwd_tiling, interpret, residuals, cotangents):
    cu, slots, x, weight, bias, state = residuals
    dout, dpool = cotangents if state is not None else (cotangents, None)
    dnew = writer = lengths = None
    if state is not None:
        lengths = cu[1:] - cu[:-1]
        writer = _writers(st, lengths, slots)
        dnew = jnp.where(writer[:, None, None], dpool[jnp.clip(slots, 0, st.num_slots - 1)], 0)
    dx, dw, db, first_grads = backward(st, bwd_tiling, interpret, cu, slots, x, weight, bias, state, dout, dnew)
    dweight = dw.sum(0).T.astype(weight.dtype)
    dbias = None if bias is None else db.sum(0).astype(bias.dtype)
    dstate = None
    if state is not None:
        history = _history_grad(st, weight, lengths, first_grads, dnew)
        read = (lengths > 0) & (slots >= 0) & (slots < st.num_slots)
        written = jnp.zeros((st.num_slots,), bool).at[jnp.where(writer, slots, st.num_slots)].set(True, mode="drop")
        dstate = jnp.where(written[:, None, None], 0.0, dpool.astype(jnp.float32))
        dstate = dstate.at[jnp.where(read, slots, st.num_slots)].add(history, mode="drop").astype(state.dtype)
    no_grad = lambda a: np.zeros(a.shape, jax.dtypes.float0)
    return no_grad(cu), no_grad(slots), dx, dweight, dbias, dstate


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
    function; `cfg.fwd_params` / `cfg.bwd_params` tile the kernels (`block_k` tokens, `block_d` channels).
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
        has_bias=bias is not None,
        unique_slots=cu_seqlens is None or state_indices is None,
    )
    fwd_tiling, bwd_tiling = tilings(cfg, st.tokens, channels)
    result = _conv(st, fwd_tiling, bwd_tiling, interpret, cu, slots, tokens, weight, bias, conv_state)
    if conv_state is None:
        return result.reshape(x.shape)
    return result[0].reshape(x.shape), result[1]
