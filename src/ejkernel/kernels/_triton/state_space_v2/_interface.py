"""The Mamba-2 (SSD) scan through Pallas-Triton kernels: checks, tiling and the custom VJP.

Semantics are those of `ejkernel.reference.state_space.state_space_v2_reference`. The forward is one
run of the chunked scalar-decay linear attention of `_chunked` (q = C, k = B, v = dt · x, g = A · dt):
products in the activations' dtype (bfloat16 / float16 on tensor cores; float32 in full precision),
accumulating in float32. A differentiated call runs the XLA implementation alone, forward and backward
(the shared chunked core and its VJP, at XLA's chunk size; `trained_as`): with the kernel forward
beside a recomputed XLA backward, training ran 16.6 ms against XLA's 11.9 (H100, B=2 S=16384 H=32
P=64 N=128). A backward of three more kernel runs took the gate gradient as a difference of two large
sums, which bfloat16 products put 30% off (dA, 2k tokens, H100), and in float32 it ran 5x slower than
XLA's. Calls of at most one token (decode steps) take the plain-JAX step.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax.experimental import pallas as pl

from ejkernel.kernels._common.differentiation import trained_as
from ejkernel.kernels._common.state_space import check_v2, matmul_precision, run_scan, ssd_inputs, v2_step
from ejkernel.kernels._triton._helpers import resolve_interpret
from ejkernel.kernels._xla.state_space_v2._interface import DEFAULT_CHUNK as XLA_CHUNK
from ejkernel.kernels._xla.state_space_v2._interface import ssd_as_linear_attention

from ._chunked import Tiling, chunked_forward

SUPPORTED_DTYPES = tuple(jnp.dtype(d) for d in (jnp.float32, jnp.bfloat16, jnp.float16))
DEFAULT = Tiling(chunk=256, block=64, num_warps=4, num_stages=2)
WHO = "triton state_space_v2"


def _runner(t: Tiling, interpret: bool, heads: int):
    return functools.partial(chunked_forward, heads=heads, tiling=t, interpret=interpret)


def _ssd(t: Tiling, interpret: bool, dtype, precision, x, A, B, C, dt, h0):
    """`(y, final state)` of the chunked kernels; XLA's chunked core where differentiated."""

    def forward(x, A, B, C, dt, h0):
        q, k, v, g = ssd_inputs(x, A, B, C, dt, dtype)
        y, h_last = _runner(t, interpret, x.shape[2])(q, k, v, g, jnp.swapaxes(h0, -1, -2))
        return y, jnp.swapaxes(h_last, -1, -2)

    def reference(*args):
        # XLA's own chunk, not the kernels': its per-head [C, C] scores outweigh its per-chunk states past
        # C² ≈ N·P (at chunk 256 its backward ran 3 ms slower than at 64, H100, fourteenth session).
        with matmul_precision(precision):
            return ssd_as_linear_attention(*args, chunk=XLA_CHUNK)

    return trained_as(reference, forward)(x, A, B, C, dt, h0)


def tiling(cfg, seq: int) -> Tiling:
    """`chunk_size` (tokens per chunk, clamped to the sequence) and, from `fwd_params`, `block_q` (rows
    per matmul tile), `num_warps`, `num_stages`."""
    chunk = min(getattr(cfg, "chunk_size", None) or DEFAULT.chunk, max(16, pl.next_power_of_2(seq)))
    params = getattr(cfg, "fwd_params", None)
    get = lambda name, default: getattr(params, name, None) or default
    block = max(16, min(get("block_q", DEFAULT.block), chunk))
    return Tiling(chunk, block, get("num_warps", DEFAULT.num_warps), get("num_stages", DEFAULT.num_stages))


def state_space_v2_triton(
    x,
    A,
    B,
    C,
    D,
    dt,
    gate=None,
    initial_state=None,
    conv_state=None,
    *,
    n_groups: int = 1,
    act_fn=None,
    use_gated_rmsnorm: bool = False,
    rmsnorm_eps: float = 1e-5,
    precision=None,
    cfg=None,
    interpret: bool | None = None,
):
    """Mamba-2 SSD scan (`ejkernel.reference.state_space.state_space_v2_reference`) on Pallas-Triton.

    Returns `(y [b, S, H·P], final state [b, H, P, N], conv_state)`. Tiling of the forward kernels from
    `cfg` (`chunk_size`, default 256; `fwd_params`: `block_q` rows per tile, `num_warps`, `num_stages`);
    `precision` sets the matmul precision of the (XLA) backward; `interpret=True` runs Pallas interpret
    mode (off a GPU, None is an error).
    """
    batch, seq, heads, head_dim, _, state = check_v2(
        x,
        A,
        B,
        C,
        D,
        dt,
        gate,
        initial_state,
        conv_state,
        n_groups=n_groups,
        act_fn=act_fn,
        use_gated_rmsnorm=use_gated_rmsnorm,
        rmsnorm_eps=rmsnorm_eps,
        precision=precision,
    )
    for name, a in (("x", x), ("B", B), ("C", C), ("dt", dt)):
        if jnp.dtype(a.dtype) not in SUPPORTED_DTYPES:
            raise NotImplementedError(f"{WHO} takes float32/bfloat16/float16, got {name} {a.dtype}")
    interpret = resolve_interpret(interpret, "triton state_space_v2")
    t = tiling(cfg, seq)
    dtype = jnp.float32 if jnp.dtype(x.dtype) == jnp.float32 else x.dtype

    def long_scan(h0):
        return _ssd(t, interpret, dtype, precision, x, A.astype(jnp.float32), B, C, dt, h0)

    args = (x, A, B, C, D, dt, gate, initial_state, conv_state)
    epilogue = dict(act_fn=act_fn, rmsnorm_eps=rmsnorm_eps if use_gated_rmsnorm else None)
    return run_scan(long_scan, v2_step, *args, (batch, heads, head_dim, state), **epilogue)
