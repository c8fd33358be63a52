"""The XLA causal depthwise 1-D convolution."""

from ejkernel.kernels._xla.causal_conv1d._interface import causal_conv1d_xla

__all__ = ["causal_conv1d_xla"]
