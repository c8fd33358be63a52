"""Registers the Triton linear attention ops (GPU).

Priorities from one H100 run (BENCHMARKS.md, B=2, S=16384, H=16, D=128, bf16, forward+backward): the
delta rules' kernels beat XLA (24 ms against 31), the float32 chunk-layout GLA kernels of then did not
(106 ms against 49), so `platform="auto"` takes Triton for the delta rules and XLA for gla / lightning /
recurrent; `platform="triton"` still reaches them. The GLA kernels have since been rewritten (`_gla`:
token layout, bf16 matmuls) and not yet timed on a GPU (`exp/gla_gpu.py`): their priority waits for that.
"""

from ejkernel.kernels._triton.linear_attention._interface import (
    gated_delta_rule_triton,
    gla_attention_triton,
    kernel_delta_attention_triton,
    lightning_attention_triton,
    recurrent_attention_triton,
)
from ejkernel.registry import Backend, Platform, kernel_registry

for _name, _fn, _priority in (
    ("gla", gla_attention_triton, -10),
    ("lightning_attn", lightning_attention_triton, -10),
    ("recurrent", recurrent_attention_triton, -10),
    ("kernel_delta_attention", kernel_delta_attention_triton, 10),
    ("gated_delta_rule", gated_delta_rule_triton, 10),
):
    kernel_registry.register(_name, Platform.TRITON, Backend.GPU, priority=_priority)(_fn)
