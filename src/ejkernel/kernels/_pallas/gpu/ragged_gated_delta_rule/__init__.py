"""The Mosaic GPU (Hopper) ragged gated delta rule: decode steps on the state pool in place (calls
with a longer request on Triton's chunked kernels)."""

from ejkernel.kernels._pallas.gpu.ragged_gated_delta_rule._interface import ragged_gated_delta_rule_mosaic_gpu

__all__ = ["ragged_gated_delta_rule_mosaic_gpu"]
