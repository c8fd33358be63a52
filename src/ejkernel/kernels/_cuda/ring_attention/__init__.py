"""Registers the cuDNN ring attention (cuDNN fused attention per step; GPU only).

Highest priority where it accepts the call: on 2 H200s it matched one-GPU XLA flash attention in the
GPU suite and ran 1.56x the one-GPU throughput at S=65536 (BENCHMARKS.md), ahead of the Triton ring.
"""

from ejkernel.kernels._cuda.ring_attention._interface import ring_attention_cudnn
from ejkernel.registry import Backend, Platform, kernel_registry

kernel_registry.register("ring_attention", Platform.CUDA, Backend.GPU, priority=30)(ring_attention_cudnn)
