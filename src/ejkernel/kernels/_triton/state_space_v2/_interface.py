"""The Mamba-2 (SSD) scan on Pallas-Triton: the GLA kernels of the linear-attention family.

Semantics are those of `ejkernel.reference.state_space.state_space_v2_reference`. SSD is chunked linear
attention with a scalar decay per head: q = C, k = B (one per group, shared by the group's H/G heads),
v = dt · x, log gate a = A · dt, scale 1, with the recurrence's `[N, P]` state the transpose of SSD's
`[P, N]` (`ssd_inputs`). It runs on the gated-recurrence kernels of `_triton.linear_attention._gla`
through the family's `linear_attention` driver and Triton engine (token layout, products in the
activations' dtype accumulating in float32, q and k read per group, the in-chunk products of a gate per
head as whole-chunk matmuls), forward and backward; gradients reach x, dt, A, B, C through v, the gate
and the kernels' own VJP (JAX's chain rule around them). dA sums a sequence's gate gradients, which can
cancel to a thousandth of their size: the kernels take the gate gradient's in-chunk part in float32 from
terms that cancel exactly (`_head_grads_kernel`).

Why these kernels, and the chunk (exp/ssd_gpu.py, H100, B=2 S=16384 H=32 P=64 N=128 G=1 bf16): the
forward took 1.133 ms at chunk 64 (1.464 at 32, 1.155 at 128), against XLA's 6.61 and 1.716 for the
forward-only kernels this module had before; forward+backward 3.71 ms at chunk 32 (5.32 at 64), against
12.03 for XLA's chunked core and its VJP (chunk 64). At chunk 128 the backward does not compile (its
per-head gradient kernel asks 264708 bytes of shared memory of the 232448 there). Every output and
gradient came within about 3e-3 of float32 XLA in bf16, 1e-6 in float32. The chunk is a tile choice
(results do not depend on it), so a call takes each measured optimum: `PLAIN_CHUNK` where no derivative
is taken, `TRAINING_CHUNK` where one is (`trained_as`: a differentiated call runs the chunk-32 kernels
forward and backward, never the chunk-64 forward). `GLA_TILING` (the kernels' tiles) is read when a call
is traced. Calls of at most one token (decode steps) take the plain-JAX step. A plain call without a gate
whose length is a multiple of the chunk (dims powers of two, `GLA_TILING.fuse_head_scores` on) runs
`_finished_forward`: its kernels take dt into the values, add the D skip and write y as the op returns it.
"""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp
from jax.experimental import pallas as pl

from ejkernel.checked_calls import arguments_checked
from ejkernel.kernels._common.attention import pad_axes
from ejkernel.kernels._common.differentiation import trained_as
from ejkernel.kernels._common.linear_attention.driver import linear_attention
from ejkernel.kernels._common.state_space import check_v2, finish_output, run_scan, ssd_inputs, v2_step
from ejkernel.kernels._triton._helpers import resolve_interpret
from ejkernel.kernels._triton.linear_attention._gla import TritonGlaTiling, head_gate_forward
from ejkernel.kernels._triton.linear_attention._interface import triton_engine

SUPPORTED_DTYPES = tuple(jnp.dtype(d) for d in (jnp.float32, jnp.bfloat16, jnp.float16))
# Tokens per chunk (H100, B=2 S=16384 H=32 P=64 N=128 G=1 bf16): plain calls 1.133 ms forward at 64 (1.464
# at 32, 1.155 at 128); differentiated calls 3.71 ms forward+backward at 32 (5.32 at 64; 128 does not fit
# the gradient kernel's shared memory). Each at most `cfg.chunk_size` where the config names one.
PLAIN_CHUNK = 64
TRAINING_CHUNK = 32
GLA_TILING = TritonGlaTiling()  # the kernels' tiles (`head_span`: heads of a group per program of the gradient kernel)
MAX_DIM = 256  # the largest head_dim and state_size the kernels take (each padded to a power of two)
WHO = "triton state_space_v2"


def _kernel_dim(size: int) -> int:
    """A head dim as the GLA kernels take it: the next power of two, at least 16 (zeros fill the rest)."""
    return max(16, pl.next_power_of_2(size))


def gla_scan(chunk: int, interpret: bool, dtype, x, A, B, C, dt, h0):
    """`(y [b, S, H, P], final state [b, H, P, N])`, both float32, on the GLA kernels (differentiable)."""
    q, k, v, g = ssd_inputs(x, A, B, C, dt, dtype)
    state, head_dim = B.shape[-1], x.shape[-1]
    dk, dv = _kernel_dim(state), _kernel_dim(head_dim)
    q, k, v = pad_axes(q, {3: dk - state}), pad_axes(k, {3: dk - state}), pad_axes(v, {3: dv - head_dim})
    init = pad_axes(jnp.swapaxes(h0, -1, -2), {2: dk - state, 3: dv - head_dim})
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


def _finished(scan, x, A, B, C, D, dt, h0):
    """`scan`'s `(y, state)` with `y` finished as the op returns it without a gate: plus the D skip, flattened
    to `[b, S, H·P]`, in x's dtype."""
    y, h = scan(x, A, B, C, dt, h0)
    return finish_output(y, x, D), h


def _finished_forward(chunk: int, interpret: bool, dtype, x, A, B, C, D, dt, h0):
    """`_finished(gla_scan)` of a plain call whose sequence is a multiple of `chunk` and dims powers of two
    (at least 16), in three kernels that take dt into the values and add the D skip themselves: neither
    dt ⊙ x nor the skip is a pass over memory of its own (H100, B=2 S=16384 H=32 P=64 N=128 bf16: those two
    passes took 0.22 of the 1.04 ms of kernel time)."""
    tiling = dataclasses.replace(GLA_TILING, interpret=interpret, precise=jnp.dtype(dtype) == jnp.float32)
    dt = dt.astype(jnp.float32)[..., None]
    y, h = head_gate_forward(
        tiling,
        chunk,
        C.astype(dtype),
        B.astype(dtype),
        x.astype(dtype),
        A[:, None] * dt,
        jnp.swapaxes(h0, -1, -2),
        dt,
        D.astype(jnp.float32),
    )
    return y.reshape(*x.shape[:2], -1).astype(x.dtype), jnp.swapaxes(h, -1, -2)


def chunks(cfg) -> tuple[int, int]:
    """Tokens per chunk of `(plain, differentiated)` calls: `PLAIN_CHUNK` and `TRAINING_CHUNK`, each at most
    `cfg.chunk_size` when it names one (the shared driver also clamps them to the sequence, at least 16)."""
    cap = getattr(cfg, "chunk_size", None)
    return min(PLAIN_CHUNK, cap or PLAIN_CHUNK), min(TRAINING_CHUNK, cap or TRAINING_CHUNK)


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

    Returns `(y [b, S, H·P], final state [b, H, P, N], conv_state)`. `cfg.chunk_size` caps the tokens per
    chunk (`chunks`); `fwd_params` and `bwd_params` tile nothing here. `precision` is checked and reaches
    nothing: the kernels multiply float32 inputs in float32, others in their dtype accumulating in float32.
    `interpret=True` runs Pallas interpret mode (off a GPU, None is an error).
    """
    if not arguments_checked("state_space_v2"):
        check_v2(
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
    (batch, _, heads, head_dim), state = x.shape, B.shape[3]
    for name, a in (("x", x), ("B", B), ("C", C), ("dt", dt)):
        if jnp.dtype(a.dtype) not in SUPPORTED_DTYPES:
            raise NotImplementedError(f"{WHO} takes float32/bfloat16/float16, got {name} {a.dtype}")
    if max(head_dim, state) > MAX_DIM:
        raise NotImplementedError(f"{WHO} takes head_dim and state_size up to {MAX_DIM}, got {head_dim} and {state}")
    interpret = resolve_interpret(interpret, WHO)
    dtype = jnp.float32 if jnp.dtype(x.dtype) == jnp.float32 else x.dtype
    plain_chunk, trained_chunk = chunks(cfg)
    args = (x, A, B, C, D, dt, gate, initial_state, conv_state)
    epilogue = dict(act_fn=act_fn, rmsnorm_eps=rmsnorm_eps if use_gated_rmsnorm else None)
    whole = x.shape[1] % plain_chunk == 0 and (head_dim, state) == (_kernel_dim(head_dim), _kernel_dim(state))
    if gate is None and whole and GLA_TILING.fuse_head_scores:  # plain calls: `_finished_forward`
        trained = functools.partial(_finished, functools.partial(gla_scan, trained_chunk, interpret, dtype))
        scan = trained_as(trained, functools.partial(_finished_forward, plain_chunk, interpret, dtype))
        long_scan = lambda h0: scan(x, A.astype(jnp.float32), B, C, D, dt, h0)
        return run_scan(long_scan, v2_step, *args, (batch, heads, head_dim, state), finished=True, **epilogue)
    scan = functools.partial(gla_scan, trained_chunk, interpret, dtype)
    if plain_chunk != trained_chunk:  # `trained_chunk` where a derivative is taken, `plain_chunk` elsewhere
        scan = trained_as(scan, functools.partial(gla_scan, plain_chunk, interpret, dtype))
    long_scan = lambda h0: scan(x, A.astype(jnp.float32), B, C, dt, h0)
    return run_scan(long_scan, v2_step, *args, (batch, heads, head_dim, state), **epilogue)
