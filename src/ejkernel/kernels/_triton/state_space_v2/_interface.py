"""The Mamba-2 (SSD) scan through Pallas-Triton kernels: checks, tiling and the custom VJP.

Semantics are those of `ejkernel.reference.state_space.state_space_v2_reference`. The forward is one
run of the chunked scalar-decay linear attention of `_chunked` (q = C, k = B, v = dt · x, g = A · dt);
the backward is three more (`ssd_backward`), so the two kernels there are all the GPU code. Products
run in the activations' dtype (bfloat16 / float16 on tensor cores; float32 in full precision),
accumulating in float32. Calls of at most one token (decode steps) take the plain-JAX step.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from ejkernel.kernels._common.state_space import check_v2, run_scan, ssd_backward, ssd_inputs, v2_step
from ejkernel.kernels._triton._helpers import resolve_interpret

from ._chunked import Tiling, chunked_forward

SUPPORTED_DTYPES = tuple(jnp.dtype(d) for d in (jnp.float32, jnp.bfloat16, jnp.float16))
DEFAULT = Tiling(chunk=256, block=64, num_warps=4, num_stages=2)
WHO = "triton state_space_v2"


def _runner(t: Tiling, t_bwd: Tiling, interpret: bool, heads: int, backward: bool):
    return functools.partial(chunked_forward, heads=heads, tiling=t_bwd if backward else t, interpret=interpret)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _ssd(t: Tiling, t_bwd: Tiling, interpret: bool, dtype, x, A, B, C, dt, h0):
    return _ssd_fwd(t, t_bwd, interpret, dtype, x, A, B, C, dt, h0)[0]


def _ssd_fwd(t, t_bwd, interpret, dtype, x, A, B, C, dt, h0):
    q, k, v, g = ssd_inputs(x, A, B, C, dt, dtype)
    run = _runner(t, t_bwd, interpret, x.shape[2], backward=False)
    y, h_last = run(q, k, v, g, jnp.swapaxes(h0, -1, -2))
    h_last = jnp.swapaxes(h_last, -1, -2)
    return (y, h_last), (x, A, B, C, dt, h0)


def _ssd_bwd(t, t_bwd, interpret, dtype, residuals, cotangents):
    x, A, B, C, dt, h0 = residuals
    run = _runner(t, t_bwd, interpret, x.shape[2], backward=True)
    grads = ssd_backward(run, x, A, B, C, dt, h0, *cotangents, dtype)
    return tuple(g.astype(a.dtype) for g, a in zip(grads, (x, A, B, C, dt, h0), strict=True))


_ssd.defvjp(_ssd_fwd, _ssd_bwd)


def tilings(cfg, seq: int) -> tuple[Tiling, Tiling]:
    """Forward and backward tilings: `chunk_size` (tokens per chunk, clamped to the sequence), and from
    `fwd_params` / `bwd_params` (the latter falling back to the former) `block_q` (rows per matmul
    tile), `num_warps`, `num_stages`."""
    chunk = min(getattr(cfg, "chunk_size", None) or DEFAULT.chunk, max(16, pl.next_power_of_2(seq)))

    def make(params):
        get = lambda name, default: getattr(params, name, None) or default
        block = max(16, min(get("block_q", DEFAULT.block), chunk))
        return Tiling(chunk, block, get("num_warps", DEFAULT.num_warps), get("num_stages", DEFAULT.num_stages))

    fwd = getattr(cfg, "fwd_params", None)
    return make(fwd), make(getattr(cfg, "bwd_params", None) or fwd)


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

    Returns `(y [b, S, H·P], final state [b, H, P, N], conv_state)`. Tiling from `cfg` (`chunk_size`,
    default 256; `fwd_params` / `bwd_params`: `block_q` rows per tile, `num_warps`, `num_stages`);
    `precision` is checked and otherwise left to the activations' dtype; `interpret` defaults to True
    off a GPU.
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
    t, t_bwd = tilings(cfg, seq)
    dtype = jnp.float32 if jnp.dtype(x.dtype) == jnp.float32 else x.dtype

    def long_scan(h0):
        return _ssd(t, t_bwd, interpret, dtype, x, A.astype(jnp.float32), B, C, dt, h0)

    args = (x, A, B, C, D, dt, gate, initial_state, conv_state)
    epilogue = dict(act_fn=act_fn, rmsnorm_eps=rmsnorm_eps if use_gated_rmsnorm else None)
    return run_scan(long_scan, v2_step, *args, (batch, heads, head_dim, state), **epilogue)
