"""The Triton ragged gated delta rule (GPU): the decode step fused on the state pool in place, prefill and mixed
batches in the Triton gated delta rule's chunked form, packed and unpacked by kernels of their own."""

from ejkernel.kernels._triton.ragged_gated_delta_rule._interface import chunked_requests, ragged_gated_delta_rule_triton

__all__ = ["chunked_requests", "ragged_gated_delta_rule_triton"]
