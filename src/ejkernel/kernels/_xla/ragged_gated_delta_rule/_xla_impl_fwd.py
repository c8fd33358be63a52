"""Compatibility path: upstream ejkernel's private chunked-prefill entry, which EasyDeL imports at module level and
calls inside its `shard_map` whenever a mesh is set.

It is the public op with upstream's argument and return order, reached by name (`ejkernel.registry.resolve`: a
backend imports no public module), so a client calling it gets the op's routing (Triton's chunked kernels on a GPU);
new code calls the public op.
"""

import jax.numpy as jnp

from ejkernel.kernels._common.linear_attention.ragged import PUBLIC_OP
from ejkernel.registry import resolve


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

    `compute_dtype` is upstream's matmul operand dtype, a precision hint: the op chooses its own (float32 in XLA,
    the inputs' dtype with float32 accumulation in Triton's chunk matmuls).
    """
    del compute_dtype
    op = resolve(PUBLIC_OP)
    out, new_state = op(
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
