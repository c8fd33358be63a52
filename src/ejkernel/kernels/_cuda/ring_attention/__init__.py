"""Registers the cuDNN ring attention (cuDNN fused attention per step; GPU only).

Registered below the XLA ring (priority -10) until the GPU suite has checked it on real devices:
`platform="cuda"` asks for it; raise the priority to make automatic selection prefer it.
"""

from ejkernel.kernels._cuda.ring_attention._interface import ring_attention_cudnn
from ejkernel.registry import Backend, Platform, kernel_registry

kernel_registry.register("ring_attention", Platform.CUDA, Backend.GPU, priority=-10)(ring_attention_cudnn)
