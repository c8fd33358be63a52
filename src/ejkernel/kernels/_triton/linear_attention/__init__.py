"""The Triton linear attention ops (GPU).

The op modules rank them first on a GPU, as `platform="auto"` takes only kernels a GPU has checked and timed
(BENCHMARKS.md, H100, B=2, S=16384, H=16, D=128, bf16), and all five have been: GLA forward 3.2 ms against
XLA's 10.2 and forward+backward 9.2 (chunk 32) against 24.4, lightning forward+backward 3.3 against 9.2, the
delta rules 24 against 31.
"""

from ejkernel.kernels._triton.linear_attention._interface import (
    gated_delta_rule_triton,
    gla_attention_triton,
    kernel_delta_attention_triton,
    lightning_attention_triton,
    recurrent_attention_triton,
)

__all__ = [
    "gated_delta_rule_triton",
    "gla_attention_triton",
    "kernel_delta_attention_triton",
    "lightning_attention_triton",
    "recurrent_attention_triton",
]
