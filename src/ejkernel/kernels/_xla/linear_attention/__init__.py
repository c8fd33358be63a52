"""Registers the XLA linear attention ops; exports `chunked_linear_attention`, the family's chunked core."""

from ejkernel.kernels._xla.linear_attention._interface import (
    chunked_linear_attention,
    gated_delta_rule_xla,
    gla_attention_xla,
    kernel_delta_attention_xla,
    lightning_attention_xla,
    linear_attention,
    recurrent_attention_xla,
)
from ejkernel.registry import Backend, Platform, kernel_registry

kernel_registry.register("gla", Platform.XLA, Backend.ANY, priority=0)(gla_attention_xla)
kernel_registry.register("lightning_attn", Platform.XLA, Backend.ANY, priority=0)(lightning_attention_xla)
kernel_registry.register("recurrent", Platform.XLA, Backend.ANY, priority=0)(recurrent_attention_xla)
kernel_registry.register("kernel_delta_attention", Platform.XLA, Backend.ANY, priority=0)(kernel_delta_attention_xla)
kernel_registry.register("gated_delta_rule", Platform.XLA, Backend.ANY, priority=0)(gated_delta_rule_xla)

__all__ = ["chunked_linear_attention", "linear_attention"]
