"""What the causal convolution's kernel files share: a call's trace-time description, the tiling, the kernels'
operands, SiLU."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax import lax
from jax.experimental.pallas import triton as plgpu


@dataclasses.dataclass(frozen=True)
class TritonCausalConvStatic:
    """A call as the kernels see it (hashable: it keys the custom VJP).

    Attributes:
        tokens: T, the packed tokens (B * S for a dense batch).
        channels: C.
        width: W, the taps.
        num_seqs: N, the sequences.
        seq_len: S when every sequence has S tokens (a dense batch): positions by division; None: by search.
        state_width: Ws of the state pool; None: no pool (zero history, no new state).
        num_slots: The pool's slots (0 without a pool).
        silu: Whether SiLU follows the convolution.
        fast_silu: Whether SiLU's sigmoid goes through the hardware's approximate tanh (`silu`).
        has_bias: Whether a bias is added.
        unique_slots: Whether the sequences' slots are known to differ (no last-writer search).
    """

    tokens: int
    channels: int
    width: int
    num_seqs: int
    seq_len: int | None
    state_width: int | None
    num_slots: int
    silu: bool
    fast_silu: bool
    has_bias: bool
    unique_slots: bool


@dataclasses.dataclass(frozen=True)
class TritonCausalConvTiling:
    """A kernel's tile (`block_t` tokens x `block_c` channels) and launch settings.

    Attributes:
        block_t: Tokens per program (the sliding window's run).
        block_c: Channels per program.
        num_warps: Warps per program.
        num_stages: Software-pipelining stages.
        design: The forward's design: `"window"` (`_window`: a run walked row by row, each input row read
            once) or `"shifted"` (`_kernel.forward`: each tap's input loaded as the tile shifted back). The state
            write reads neither.
        step_rows: Rows per step of the window's walk (a divisor of `block_t`): loads in flight together.
        prefetch: Whether each step of the window's walk loads the next step's rows (in flight during its own).
    """

    block_t: int
    block_c: int
    num_warps: int
    num_stages: int
    design: str = "window"
    step_rows: int = 8
    prefetch: bool = False


def silu(y, fast: bool):
    """`y · σ(y)`. `fast`: `σ(y) = (1 + tanh(y/2)) / 2` through the hardware's approximate tanh (relative error about
    2⁻¹¹, below 16-bit rounding), one special-function instruction where `1 / (1 + e⁻ʸ)` takes two: on an H200 those
    bounded the forward (16384 tokens x 8192 channels, bf16: 0.182 ms against 0.150 through the tanh, 0.155 with no
    SiLU at all)."""
    return y * _sigmoid(y, fast)


def silu_grad(y, fast: bool):
    """`d silu / dy = σ(y) (1 + y (1 - σ(y)))`, σ as `silu`'s."""
    sig = _sigmoid(y, fast)
    return sig * (1.0 + y * (1.0 - sig))


def _sigmoid(y, fast: bool):
    if fast:
        return 0.5 + 0.5 * plgpu.approx_tanh(0.5 * y)
    return 1.0 / (1.0 + jnp.exp(-y))


def sequence_of(cu_ref, row, st: TritonCausalConvStatic):
    """The sequence holding token `row`, a scalar (the last whose start is at or before it), clamped into `[0, N)`:
    by division in a dense batch, else a binary search of the bounds `cu_ref`."""
    if st.seq_len is not None:
        return jnp.minimum(lax.div(row, jnp.int32(st.seq_len)), st.num_seqs - 1)
    lo, hi = jnp.int32(0), jnp.int32(st.num_seqs)  # seq = how many of cu[1..N] are at or below the row
    for _ in range(st.num_seqs.bit_length()):
        mid = lax.div(lo + hi, jnp.int32(2))
        active = lo < hi
        right = cu_ref[jnp.minimum(mid + 1, st.num_seqs)] <= row
        lo, hi = jnp.where(active & right, mid + 1, lo), jnp.where(active & ~right, mid, hi)
    return jnp.minimum(lo, st.num_seqs - 1)


def unpack_refs(refs, st: TritonCausalConvStatic):
    """`(cu, slots, x, weight, bias or None, state or None, the remaining refs)` of a kernel's refs."""
    cu_ref, slots_ref, x_ref, w_ref, *rest = refs
    b_ref = rest.pop(0) if st.has_bias else None
    state_ref = rest.pop(0) if st.state_width is not None else None
    return cu_ref, slots_ref, x_ref, w_ref, b_ref, state_ref, rest


def kernel_inputs(cu, slots, x, weight, bias, state):
    """The kernels' array operands: those given, in this order (`unpack_refs` reads them back)."""
    return [a for a in (cu, slots, x, weight, bias, state) if a is not None]


def compiler_params(t: TritonCausalConvTiling):
    """A tiling's launch settings."""
    return plgpu.CompilerParams(num_warps=t.num_warps, num_stages=t.num_stages)
