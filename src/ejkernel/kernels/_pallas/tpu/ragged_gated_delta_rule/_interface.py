"""Compatibility path: upstream ejkernel's private decode entry, which EasyDeL imports at module level.

Upstream runs it as a Pallas TPU kernel only (and fails elsewhere); here it is the plain-JAX decode step
the XLA implementation shares (`ejkernel.kernels._common.linear_attention.ragged`), so it runs on every backend.
"""

from ejkernel.kernels._common.linear_attention.ragged import decode_tokens


def _decode_path(query, key, value, beta, decay, recurrent_state, state_indices, use_qk_l2norm):
    """One delta-rule step per token; returns `(out [T,H,Dv], new_state [S,H,Dk,Dv])`: output first.

    query, key `[T,H,Dk]`, value `[T,H,Dv]`, beta and decay `[T,H]`, `state_indices [T]` int32: token
    `i` reads and writes slot `state_indices[i]`; where tokens share a slot, the first (lowest index)
    writes it (EasyDeL zero-pads the indices, so padding tokens alias slot 0 and request 0 keeps its update).
    """
    return decode_tokens(query, key, value, beta, decay, recurrent_state, state_indices, bool(use_qk_l2norm))
