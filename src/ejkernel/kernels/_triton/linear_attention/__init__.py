"""Registers the Triton linear attention ops (GPU)."""

from ejkernel.kernels._triton.linear_attention._interface import (
    gated_delta_rule_triton,
    gla_attention_triton,
    kernel_delta_attention_triton,
    lightning_attention_triton,
    recurrent_attention_triton,
)
from ejkernel.registry import Backend, Platform, kernel_registry

for _name, _fn in (
    ("gla", gla_attention_triton),
    ("lightning_attn", lightning_attention_triton),
    ("recurrent", recurrent_attention_triton),
    ("kernel_delta_attention", kernel_delta_attention_triton),
    ("gated_delta_rule", gated_delta_rule_triton),
):
    kernel_registry.register(_name, Platform.TRITON, Backend.GPU, priority=10)(_fn)
