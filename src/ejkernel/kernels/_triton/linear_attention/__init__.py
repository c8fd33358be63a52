"""Registers the Triton linear attention ops (GPU).

`platform="auto"` takes only kernels a GPU has checked and timed (BENCHMARKS.md, H100, B=2, S=16384,
H=16, D=128, bf16): the delta rules' kernels, forward+backward in 24 ms against XLA's 31, go before XLA.
The GLA kernels (`_gla`: token layout, bf16 matmuls) ran GLA forward in 3.1 ms against 10.2 and
forward+backward in 9.1 (chunk 32) against 25.8, but have changed since (the Mamba-2 head layout, whole-
chunk kernels for a gate per head): gla / lightning / recurrent stay after XLA until `exp/gla_gpu.py`
and `exp/ssd_gpu.py` have run them again; `platform="triton"` reaches them.
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
