"""The XLA Mamba-2 (SSD) scan: chunked linear attention with a scalar decay per head.

SSD is the linear-attention recurrence `h_t = exp(g_t) h_{t-1} + k_t v_tᵀ`, `o_t = q_tᵀ h_t` with
q = C, k = B, v = dt · x, g = A · dt and scale 1 (its `[N, P]` state is the transpose of SSD's
`[P, N]`), so it runs on the family's shared chunked core (`chunked_linear_attention`: intra-chunk
masked products, inter-chunk state passing, a custom VJP keeping one state per chunk). B and C of
group `h // (H // G)` serve head h, read per group: no per-head copy of them is formed.
"""

from __future__ import annotations

import jax.numpy as jnp

from ejkernel.checked_calls import arguments_checked
from ejkernel.kernels._common.linear_attention.driver import chunked_linear_attention
from ejkernel.kernels._common.state_space import check_v2, matmul_precision, run_scan, ssd_inputs, v2_step

DEFAULT_CHUNK = 64


def ssd_as_linear_attention(x, A, B, C, dt, h0, *, chunk: int):
    """`(y [b, S, H, P], final state [b, H, P, N])`, both float32, with `y_t = h_t C_t` (no D skip, no gate)."""
    q, k, v, g = ssd_inputs(x, A.astype(jnp.float32), B, C, dt, jnp.float32)
    y, h = chunked_linear_attention(
        q,
        k,
        v,
        g=g,
        scale=1.0,
        initial_state=jnp.swapaxes(h0, -1, -2),
        chunk_size=chunk,
    )
    return y, jnp.swapaxes(h, -1, -2)


def state_space_v2_xla(
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
):
    """Mamba-2 SSD scan (see `ejkernel.reference.state_space.state_space_v2_reference`).

    Returns `(y [b, S, H·P], final state [b, H, P, N], conv_state)`. Chunks of `cfg.chunk_size` tokens
    (a power of two, default 64); `precision` sets the matmul precision of the chunked products. A
    length-1 call (with `initial_state`: a decode step) is one plain-JAX step, reading the state once.
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
    chunk = getattr(cfg, "chunk_size", None) or DEFAULT_CHUNK

    def long_scan(h0):
        with matmul_precision(precision):
            return ssd_as_linear_attention(x, A, B, C, dt, h0, chunk=chunk)

    args = (x, A, B, C, D, dt, gate, initial_state, conv_state)
    epilogue = dict(act_fn=act_fn, rmsnorm_eps=rmsnorm_eps if use_gated_rmsnorm else None)
    return run_scan(long_scan, v2_step, *args, (batch, heads, head_dim, state), **epilogue)
