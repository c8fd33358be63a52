"""The ragged gated delta rule in plain JAX: packed requests, each on its own slot of a state pool.

The computation is `ejkernel.kernels._common.linear_attention.ragged.ragged_delta_rule`, shared with the
other platforms (their gradient): a decode path (one `delta_step` per request) when every request has at most
one token, else the family's packed chunked form, picked by `lax.cond` on the traced lengths; new states
written back by `scatter_first`. Everything is plain autodiff-able JAX (the chunked form through its custom
VJP), so `jax.grad` of a surrounding model runs and differentiates through the op.
"""

from __future__ import annotations

from ejkernel.kernels._common.linear_attention.checks import config_chunk
from ejkernel.kernels._common.linear_attention.ragged import ragged_delta_rule, require_pool_arguments


def ragged_gated_delta_rule_xla(
    query,
    key,
    value,
    beta,
    decay=None,
    recurrent_state=None,
    query_start_loc=None,
    state_indices=None,
    *,
    chunk_size: int | None = None,
    use_qk_l2norm: bool = True,
    cfg=None,
):
    """`ragged_gated_delta_rule` in plain JAX: `(out [T,H,Dv] in query.dtype, new_state in recurrent_state.dtype)`.

    Arguments as the public op's (checked there; `query_start_loc=None`: a decode batch, one token a request);
    `cfg.chunk_size`, when given, wins over `chunk_size` (None: 64, `DEFAULT_CHUNK`).
    Under `jit`, request bounds are clamped into `[0, T]` and made non-decreasing, and requests whose
    slot is outside `[0, S)` are dropped (zero outputs, no write).
    """
    require_pool_arguments(recurrent_state, state_indices)
    chunk = config_chunk(cfg, chunk_size)
    return ragged_delta_rule(
        query,
        key,
        value,
        beta,
        decay,
        recurrent_state,
        query_start_loc,
        state_indices,
        chunk_size=chunk,
        use_qk_l2norm=use_qk_l2norm,
    )
