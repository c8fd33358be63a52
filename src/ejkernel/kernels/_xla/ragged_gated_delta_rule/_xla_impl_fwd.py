"""Compatibility path: upstream ejkernel's private chunked-prefill entry, which EasyDeL imports at module level.

It is the XLA implementation of `ragged_gated_delta_rule` (`_interface.py`) with upstream's argument and
return order; new code calls the public op.
"""

import jax.numpy as jnp

from ejkernel.kernels._xla.ragged_gated_delta_rule._interface import ragged_gated_delta_rule_xla


def _ragged_gdr_chunked_prefill(
    query,
    key,
    value,
    beta,
    decay,
    recurrent_state,
    query_start_loc,
    state_indices,
    chunk_size,
    use_qk_l2norm,
    compute_dtype=jnp.bfloat16,
):
    """The ragged gated delta rule for any mix of request lengths; returns `(new_state, out)`: state first.

    `compute_dtype` is upstream's matmul operand dtype, a precision hint: every product here runs in float32.
    """
    del compute_dtype
    out, new_state = ragged_gated_delta_rule_xla(
        query,
        key,
        value,
        beta,
        decay,
        recurrent_state,
        query_start_loc,
        state_indices,
        chunk_size=int(chunk_size),
        use_qk_l2norm=bool(use_qk_l2norm),
    )
    return new_state, out
