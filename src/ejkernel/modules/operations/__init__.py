"""Every operation's public function, `Kernel` class and config.

`from ejkernel.modules.operations import flash_attention` gives the function, as upstream code
expects; the modules of the same names stay importable by their full path
(`from ejkernel.modules.operations.flash_attention import FlashAttention`).
"""

from ejkernel.modules.operations.attention import Attention, AttentionConfig, attention
from ejkernel.modules.operations.flash_attention import FlashAttention, FlashAttentionConfig, flash_attention
from ejkernel.modules.operations.mean_pooling import MeanPooling, MeanPoolingConfig, mean_pooling
from ejkernel.modules.operations.ring_attention import RingAttention, RingAttentionConfig, ring_attention
from ejkernel.modules.operations.scaled_dot_product_attention import (
    ScaledDotProductAttention,
    ScaledDotProductAttentionConfig,
    scaled_dot_product_attention,
)

__all__ = [
    "Attention",
    "AttentionConfig",
    "FlashAttention",
    "FlashAttentionConfig",
    "MeanPooling",
    "MeanPoolingConfig",
    "RingAttention",
    "RingAttentionConfig",
    "ScaledDotProductAttention",
    "ScaledDotProductAttentionConfig",
    "attention",
    "flash_attention",
    "mean_pooling",
    "ring_attention",
    "scaled_dot_product_attention",
]
