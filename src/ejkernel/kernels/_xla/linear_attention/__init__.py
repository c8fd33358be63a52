"""The XLA linear attention ops: the family's entries (`_common.linear_attention.entries`) with their default
engine, which runs every part in plain JAX."""

from ejkernel.kernels._common.linear_attention.entries import (
    gated_delta_rule,
    gla_attention,
    kernel_delta_attention,
    lightning_attention,
    recurrent_attention,
)

__all__ = ["gated_delta_rule", "gla_attention", "kernel_delta_attention", "lightning_attention", "recurrent_attention"]
