"""What the GLA kernels share: their tiling, the `pallas_call` wrapper, index and mask helpers, and the
in-chunk decay routes used by both the forward and the backward kernels (`_gla` tells the story)."""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

SUB = 16  # tokens per row block of the intra-chunk product (the smallest matmul edge)
# A row block whose log gates span at most this takes its own keys by matmuls of `q ⊙ e^{g − r}` and
# `k ⊙ e^{r − g}` (r: the gate at its first row): every factor stays within e^{±60}, far from float32's and
# bfloat16's e^{±87}. Wider spans (gates that fall faster than ~4 per token) take the exact loop.
SEPARABLE_SPAN = 60.0
F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class TritonGlaTiling:
    """Tiles and warps of the GLA kernels (each clipped to the head dims).

    `state_k` x `state_v`: the state tile one program of the sequential passes carries; `block_v`: value
    columns per program of the output kernel; `block_k`: key channels per program of the gradient
    kernel (below Dk, dv is summed over programs in XLA); `head_span`: state heads per program of the
    per-head gradient kernel where they share q and k (Mamba-2: their dq and dk summed in the kernel;
    a power of two). The `head_` fields stand for `block_k` and the warps in the kernels of a gate per head.
    H100, GLA forward+backward at B=2 S=16384 H=16 D=128 bf16, the gradient kernel: 3.04 ms at
    `block_k` 64 and 4 warps, 3.86 at 128 and 8; the scores kernel: 0.40 ms at 2 warps, 0.55 at 4.
    `state_unroll`: chunks each loop step of GLA's sequential passes takes (`chunk_loop`), the next steps' loads
    issued while this one's run. H200 (`exp/s58_unroll.py`), at unroll 1, 2, 4: GLA (B=2 S=16384 H=16 D=128 bf16)
    forward 1.745, 1.735, 1.595 ms, forward+backward 5.663, 5.597, 5.464; Mamba-2 (B=2 S=16384 H=32 P=64 N=128)
    forward 0.781, 0.735, 0.725, forward+backward 3.594, 3.502, 3.543. The delta rule's passes keep one chunk a
    step: its training lost (6.27, 6.54, 6.86 ms) and its one pass exceeds shared memory at 4. `precise`: float32
    inputs, float32 matmuls. `fuse_head_scores`: with a gate per head, a call that is not differentiated makes each
    chunk's scores inside the output kernel (`_head_outputs_kernel`) instead of writing `A` to memory and reading it
    back (H100, Mamba-2 forward at B=2 S=16384 H=32 P=64 N=128: 1.066 against 1.122 ms).
    """

    state_k: int = 64
    state_v: int = 64
    block_v: int = 128
    block_k: int = 64
    head_span: int = 8
    state_warps: int = 4
    scores_warps: int = 2
    output_warps: int = 4
    grads_warps: int = 4
    head_block_k: int = 128
    head_scores_warps: int = 4
    head_grads_warps: int = 8
    num_stages: int = 2
    state_unroll: int = 4
    interpret: bool = False
    precise: bool = True
    fuse_head_scores: bool = True

    def fit(self, dk: int, dv: int) -> TritonGlaTiling:
        return dataclasses.replace(
            self,
            state_k=min(self.state_k, dk),
            state_v=min(self.state_v, dv),
            block_v=min(self.block_v, dv),
            block_k=min(self.block_k, dk),
            head_block_k=min(self.head_block_k, dk),
        )

    def mm(self, dtype):
        """The dtype of matmul operands: the inputs' own, or float32 when precise."""
        return F32 if self.precise else jnp.dtype(dtype)

    def state_dtype(self, dtype):
        """Chunk states in memory: bfloat16 for bfloat16 inputs (the matmuls read them so), else float32."""
        return jnp.dtype(dtype) if not self.precise and jnp.dtype(dtype) == jnp.bfloat16 else F32


def call_pallas(
    kernel, t: TritonGlaTiling, warps: int, grid, in_specs, out_specs, out_shape, name: str, *, stages=None, **static
):
    """`pallas_call` of `kernel(**static)` on `warps` warps and `stages` software-pipelining stages (None:
    `t.num_stages`); specs None: whole arrays (the sequential passes index chunks themselves)."""
    specs = {} if in_specs is None else dict(in_specs=in_specs, out_specs=out_specs)
    return pl.pallas_call(
        functools.partial(kernel, **static),
        grid=grid,
        **specs,
        out_shape=out_shape,
        compiler_params=plgpu.CompilerParams(num_warps=warps, num_stages=stages or t.num_stages),
        interpret=t.interpret,
        name=name,
    )


def chunk_loop(count, step, init, unroll: int):
    """`lax.fori_loop(0, count, step, init)` (`count` static or traced) with `unroll` calls of `step` a loop step,
    the rest after: Pallas-Triton's loops take no `unroll`, and a longer body gives the software pipeliner more
    loads to issue ahead in a sequential pass."""
    if unroll == 1:
        return lax.fori_loop(0, count, step, init)

    def body(j, carry):
        for i in range(unroll):
            carry = step(j * unroll + i, carry)
        return carry

    whole = count // unroll
    return lax.fori_loop(whole * unroll, count, step, lax.fori_loop(0, whole, body, init))


def tile_slice(i, size: int):
    return pl.ds(pl.multiple_of(i * size, size), size)


def iota(shape, axis: int):
    return lax.broadcasted_iota(jnp.int32, shape, axis)


def masked_exp(x, keep):
    """`e^x` where `keep`, else 0 (the exponent masked first: no overflow where it is dropped)."""
    return jnp.where(keep, jnp.exp(jnp.where(keep, x, 0.0)), 0.0)


def everywhere(cond, shape):
    return jnp.full(shape, cond)


def group_ratio(heads: int, x) -> int:
    """How many state heads share each head of `x` (`[B, T, Hx, D]`, Hx a divisor of the state heads)."""
    return heads // x.shape[2]


def group_of(head, ratio: int):
    """The head of an input shared by groups of `ratio` state heads that state head `head` reads."""
    return head if ratio == 1 else lax.div(head, jnp.int32(ratio))


def gate_columns(g_ref, keys):
    """The gate columns of a tile of key channels: the same ones, or the head's only one."""
    return keys if g_ref.shape[-1] > 1 else pl.ds(0, 1)


def separable(g):
    """Whether a row block's log gates `g [SUB, D]` span at most SEPARABLE_SPAN (a scalar predicate)."""
    top = jnp.max(jnp.max(g, axis=1), axis=0)
    return top - jnp.min(jnp.min(g, axis=1), axis=0) <= SEPARABLE_SPAN


def own_keys(g_ref, first: int, body, carry):
    """`body(j, decay, carry)` for the keys j = SUB − 1, ..., 0 of the row block at `first`, in a loop, with
    `decay [SUB, D]` = `e^{g_t − g_j}` for its rows t >= j (0 above). Built key by key, `decay_j =
    e^{g_{j+1} − g_j} ⊙ decay_{j+1}` (1 on row j): one exponential per key and channel, each of one
    token's gate (every factor <= 1 for decaying gates)."""
    row = iota((SUB, 1), 0)

    def step(i, state):
        decay, g_next, carry = state
        j = SUB - 1 - i
        g_j = g_ref[first + j, :][None, :]
        decay = jnp.where(row == j, 1.0, decay * jnp.exp(g_next - g_j))
        return decay, g_j, body(j, decay, carry)

    start = (jnp.zeros((SUB, g_ref.shape[-1]), F32), g_ref[first + SUB - 1, :][None, :], carry)
    return lax.fori_loop(0, SUB, step, start)[2]


# ---- the in-chunk kernels of a gate per head ----
#
# With one gate per head, `A = (q kᵀ) ⊙ D` with `D[t, s] = e^{g_t − g_s}` (s <= t): the decays form a
# `[C, C]` matrix of their own, every exponent <= 0 for decaying gates, and each product is one matmul
# over whole row blocks. The gates enter twice, as a column (`g`, `[C, 1]`) and as a row (`g_rows`: the
# cumulative gates transposed, `[B, H, T]`).


def pair_decays(g_col, g_row, first: int = 0):
    """`D [R, C]` for the rows `first + r` of a chunk: `e^{g_t − g_s}` where s <= t, else 0."""
    rows, cols = g_col.shape[0], g_row.shape[-1]
    keep = first + iota((rows, 1), 0) >= iota((1, cols), 1)
    return masked_exp(g_col - g_row, keep)


def tiles_sum(x):
    """Partial sums `[tiles, ...]` over the tiles of key channels, added up."""
    return x[0] if x.shape[0] == 1 else jnp.sum(x, axis=0)
