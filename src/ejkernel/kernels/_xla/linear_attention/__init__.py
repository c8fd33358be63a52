"""Registers the XLA linear attention ops: the family's entries (`_common.linear_attention.entries`) with their
default engine, which runs every part in plain JAX."""

from ejkernel.kernels._common.linear_attention.entries import (
    gated_delta_rule,
    gla_attention,
    kernel_delta_attention,
    lightning_attention,
    recurrent_attention,
)
from ejkernel.registry import Backend, Platform, kernel_registry

kernel_registry.register("gla", Platform.XLA, Backend.ANY, priority=0)(gla_attention)
kernel_registry.register("lightning_attn", Platform.XLA, Backend.ANY, priority=0)(lightning_attention)
kernel_registry.register("recurrent", Platform.XLA, Backend.ANY, priority=0)(recurrent_attention)
kernel_registry.register("kernel_delta_attention", Platform.XLA, Backend.ANY, priority=0)(kernel_delta_attention)
kernel_registry.register("gated_delta_rule", Platform.XLA, Backend.ANY, priority=0)(gated_delta_rule)
