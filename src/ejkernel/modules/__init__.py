"""The public index: every operation's function, `Kernel` class and config."""

import ejkernel.kernels  # noqa: F401  (registers every implementation)
from ejkernel.modules.operations.flash_attention import FlashAttention, FlashAttentionConfig, flash_attention
from ejkernel.modules.operations.mean_pooling import MeanPooling, MeanPoolingConfig, mean_pooling
from ejkernel.ops import create_default_executor

__all__ = [
    "FlashAttention",
    "FlashAttentionConfig",
    "MeanPooling",
    "MeanPoolingConfig",
    "create_default_executor",
    "flash_attention",
    "mean_pooling",
]
