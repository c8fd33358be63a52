"""The Triton causal depthwise 1-D convolution."""

from ejkernel.kernels._triton.causal_conv1d._interface import causal_conv1d_triton

__all__ = ["causal_conv1d_triton"]
