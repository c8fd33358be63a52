"""Registers the XLA ragged gated delta rule (packed serving requests on a pool of recurrent states)."""

from ejkernel.kernels._xla.ragged_gated_delta_rule._interface import ragged_gated_delta_rule_xla
from ejkernel.registry import Backend, Platform, kernel_registry

kernel_registry.register("ragged_gated_delta_rule", Platform.XLA, Backend.ANY, priority=0)(ragged_gated_delta_rule_xla)
