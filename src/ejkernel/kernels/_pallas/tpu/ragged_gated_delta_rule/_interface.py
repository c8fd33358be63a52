"""Compatibility path: upstream ejkernel's private decode entry, which EasyDeL imports at module level and calls
inside its `shard_map` whenever a mesh is set.

Upstream runs it as a Pallas TPU kernel only (and fails elsewhere); here it is the public op's decode batch
(`query_start_loc` None), reached by name (`ejkernel.registry.resolve`: a backend imports no public module), so a
client calling it gets the op's routing on every device: the Mosaic GPU or Triton decode step on a GPU, the plain-JAX
step (`_common.linear_attention.ragged.decode_tokens`) elsewhere.
"""

from ejkernel.kernels._common.linear_attention.ragged import PUBLIC_OP
from ejkernel.registry import resolve


def _decode_path(query, key, value, beta, decay, recurrent_state, state_indices, use_qk_l2norm):
    """One delta-rule step per token; returns `(out [T,H,Dv], new_state [S,H,Dk,Dv])`: output first.

    query, key `[T,H,Dk]`, value `[T,H,Dv]`, beta and decay `[T,H]`, `state_indices [T]` int32: token
    `i` reads and writes slot `state_indices[i]`; where tokens share a slot, the first (lowest index)
    writes it (EasyDeL zero-pads the indices, so padding tokens alias slot 0 and request 0 keeps its update).
    """
    op = resolve(PUBLIC_OP)
    return op(query, key, value, beta, decay, recurrent_state, None, state_indices, use_qk_l2norm=bool(use_qk_l2norm))
