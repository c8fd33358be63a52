"""The XLA ragged gated delta rule (packed serving requests on a pool of recurrent states)."""

from ejkernel.kernels._xla.ragged_gated_delta_rule._interface import ragged_gated_delta_rule_xla

__all__ = ["ragged_gated_delta_rule_xla"]
