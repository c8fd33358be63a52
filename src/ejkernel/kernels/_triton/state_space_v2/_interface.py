"""The Mamba-2 (SSD) scan through Pallas-Triton kernels: checks, tiling and the choice of kernels.

Semantics are those of `ejkernel.reference.state_space.state_space_v2_reference`. SSD is chunked linear
attention with a scalar decay per head: q = C, k = B (one per group, shared by the group's H/G heads),
v = dt · x, log gate a = A · dt, scale 1, with the recurrence's `[N, P]` state the transpose of SSD's
`[P, N]` (`ssd_inputs`). Two sets of kernels serve it:

- `_gla_scan`: the gated-recurrence kernels of the linear-attention family (`_triton.linear_attention._gla`
  through the family's `linear_attention` driver and Triton engine: token layout, products in the
  activations' dtype accumulating in float32, q and k read per group, the in-chunk products of a gate per
  head as whole-chunk matmuls), forward and backward; gradients reach x, dt, A, B, C through v, the gate
  and the kernels' own VJP (JAX's chain rule around them). dA sums a sequence's gate gradients, which
  can cancel to a thousandth of their size: the kernels take the gate gradient's in-chunk part in float32
  from terms that cancel exactly (`_head_grads_kernel`), which kept dA as close to a float32 oracle as XLA
  fed bf16 is (interpret mode, S=2048: 1e-2; an earlier kernel backward, 30% off on an H100);
- `_chunked_scan`: the forward-only kernels of `_chunked` (chunk 256, XLA's pass over chunk states).

`FORWARD` names the kernels of calls that are not differentiated, `TRAINING` those of differentiated
calls (the forward and backward of `jax.grad` / `jax.vjp`; "xla": XLA's chunked core and its VJP, which
trained at 11.9 ms at B=2 S=16384 H=32 P=64 N=128 bf16 on an H100). They are module switches so that
`exp/ssd_gpu.py` can time every pair on a GPU. The defaults are what a GPU has run and timed:
`_chunked` for plain calls (1.64 ms forward there, 1.9x XLA) and XLA for training; the GLA kernels
(written after the last GPU run: lowering-verified and checked in interpret mode only) take over once
`exp/ssd_gpu.py` shows them correct and faster. Expected: XLA's backward costs about three of its
forwards, and lightning attention (per-head gates, H=16 D=128) trained at 2.2x XLA on an H100 with the
earlier per-head kernels; the GLA forward moves about 1 GB at chunk 64 (a bf16 state per 64 tokens and
head, A) and passes its chunk states in one kernel, where `_chunked` runs an XLA loop of 64 steps.
The switches (and `GLA_TILING`) are read when a call is traced: set them before a function is jitted.
Calls of at most one token (decode steps) take the plain-JAX step.
"""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp
from jax.experimental import pallas as pl

from ejkernel.kernels._common.differentiation import trained_as
from ejkernel.kernels._common.state_space import check_v2, matmul_precision, run_scan, ssd_inputs, v2_step
from ejkernel.kernels._triton._helpers import resolve_interpret
from ejkernel.kernels._triton.linear_attention._gla import GlaTiling
from ejkernel.kernels._triton.linear_attention._interface import triton_engine
from ejkernel.kernels._xla.linear_attention import linear_attention
from ejkernel.kernels._xla.state_space_v2._interface import DEFAULT_CHUNK as XLA_CHUNK
from ejkernel.kernels._xla.state_space_v2._interface import ssd_as_linear_attention

from ._chunked import Tiling, chunked_forward

SUPPORTED_DTYPES = tuple(jnp.dtype(d) for d in (jnp.float32, jnp.bfloat16, jnp.float16))
DEFAULT = Tiling(chunk=256, block=64, num_warps=4, num_stages=2)  # `_chunked`'s
GLA_CHUNK = 64  # tokens per chunk of the GLA kernels where the config names none (a guess: see exp/ssd_gpu.py)
GLA_MAX_CHUNK = 128  # their per-head gradient kernel holds [C, C] float32 tiles: larger asks are clamped
GLA_TILING = GlaTiling()  # their tiles (`head_span`: heads of a group per program of the gradient kernel)
FORWARD = "chunked"  # the kernels of calls that are not differentiated: "gla" or "chunked"
TRAINING = "xla"  # the kernels of differentiated calls: "gla" or "xla"
WHO = "triton state_space_v2"


def _pad_to(a, axis: int, size: int):
    """`a` zero-padded along `axis` to `size`."""
    pad = size - a.shape[axis]
    return a if not pad else jnp.pad(a, [(0, pad) if i == axis % a.ndim else (0, 0) for i in range(a.ndim)])


def _kernel_dim(size: int) -> int:
    """A head dim as the GLA kernels take it: the next power of two, at least 16 (zeros fill the rest)."""
    return max(16, pl.next_power_of_2(size))


def _gla_scan(chunk: int, interpret: bool, dtype, x, A, B, C, dt, h0):
    """`(y [b, S, H, P], final state [b, H, P, N])`, both float32, on the GLA kernels (differentiable)."""
    q, k, v, g = ssd_inputs(x, A, B, C, dt, dtype)
    state, head_dim = B.shape[-1], x.shape[-1]
    dk, dv = _kernel_dim(state), _kernel_dim(head_dim)
    q, k, v = _pad_to(q, -1, dk), _pad_to(k, -1, dk), _pad_to(v, -1, dv)
    init = _pad_to(_pad_to(jnp.swapaxes(h0, -1, -2), -1, dv), -2, dk)
    y, h = linear_attention(
        q,
        k,
        v,
        scale=1.0,
        g=g,
        initial_state=init,
        chunk_size=chunk,
        engine=dataclasses.replace(triton_engine(None, interpret=interpret), gla=GLA_TILING),
    )
    return y[..., :head_dim].astype(jnp.float32), jnp.swapaxes(h[..., :state, :head_dim], -1, -2)


def _chunked_scan(t: Tiling, interpret: bool, dtype, x, A, B, C, dt, h0):
    """`(y, final state)`, both float32, from the forward-only `_chunked` kernels."""
    q, k, v, g = ssd_inputs(x, A, B, C, dt, dtype)
    y, h_last = chunked_forward(q, k, v, g, jnp.swapaxes(h0, -1, -2), heads=x.shape[2], tiling=t, interpret=interpret)
    return y, jnp.swapaxes(h_last, -1, -2)


def _xla_scan(precision, x, A, B, C, dt, h0):
    # XLA's own chunk: its per-head [C, C] scores outweigh its per-chunk states past C² ≈ N·P (at chunk
    # 256 its backward ran 3 ms slower than at 64, H100, fourteenth session).
    with matmul_precision(precision):
        return ssd_as_linear_attention(x, A, B, C, dt, h0, chunk=XLA_CHUNK)


def _ssd(t: Tiling, gla_chunk: int, interpret: bool, dtype, precision, x, A, B, C, dt, h0):
    """`(y, final state)` of the scan: `FORWARD`'s kernels where no derivative is taken, `TRAINING`'s where one is."""
    gla = functools.partial(_gla_scan, gla_chunk, interpret, dtype)
    forward = {"gla": gla, "chunked": functools.partial(_chunked_scan, t, interpret, dtype)}[FORWARD]
    training = {"gla": gla, "xla": functools.partial(_xla_scan, precision)}[TRAINING]
    if forward is training:
        return gla(x, A, B, C, dt, h0)
    return trained_as(training, forward)(x, A, B, C, dt, h0)


def gla_chunk(cfg) -> int:
    """Tokens per chunk of the GLA kernels: `chunk_size` (default `GLA_CHUNK`), at most `GLA_MAX_CHUNK`
    (the shared driver clamps it to the sequence)."""
    return min(getattr(cfg, "chunk_size", None) or GLA_CHUNK, GLA_MAX_CHUNK)


def tiling(cfg, seq: int) -> Tiling:
    """The `_chunked` kernels' tiling: `chunk_size` (tokens per chunk, default 256, clamped to the sequence)
    and, from `fwd_params`, `block_q` (rows per matmul tile), `num_warps`, `num_stages`."""
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

    Returns `(y [b, S, H·P], final state [b, H, P, N], conv_state)`. `cfg.chunk_size`: tokens per chunk
    (`gla_chunk`, `tiling`); `fwd_params` tile the `_chunked` kernels; `precision` sets the matmul precision of
    XLA's core where `TRAINING` is "xla"; `interpret=True` runs Pallas interpret mode (off a GPU, None
    is an error).
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
    if "gla" in (FORWARD, TRAINING) and max(head_dim, state) > 256:
        raise NotImplementedError(f"{WHO} takes head_dim and state_size up to 256, got {head_dim} and {state}")
    interpret = resolve_interpret(interpret, "triton state_space_v2")
    t, chunk = tiling(cfg, seq), gla_chunk(cfg)
    dtype = jnp.float32 if jnp.dtype(x.dtype) == jnp.float32 else x.dtype

    def long_scan(h0):
        return _ssd(t, chunk, interpret, dtype, precision, x, A.astype(jnp.float32), B, C, dt, h0)

    args = (x, A, B, C, D, dt, gate, initial_state, conv_state)
    epilogue = dict(act_fn=act_fn, rmsnorm_eps=rmsnorm_eps if use_gated_rmsnorm else None)
    return run_scan(long_scan, v2_step, *args, (batch, heads, head_dim, state), **epilogue)
