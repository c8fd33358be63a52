"""The public index: every operation's function, `Kernel` class and config."""

import ejkernel.kernels  # noqa: F401  (registers every implementation)
from ejkernel.modules.operations.attention import Attention, AttentionConfig, attention
from ejkernel.modules.operations.blocksparse_attention import (
    BlockSparseAttention,
    BlockSparseAttentionConfig,
    blocksparse_attention,
)
from ejkernel.modules.operations.flash_attention import FlashAttention, FlashAttentionConfig, flash_attention
from ejkernel.modules.operations.flash_mla import FlashMLA, FlashMLAConfig, flash_mla
from ejkernel.modules.operations.grouped_matmul import GroupedMatmul, GroupedMatmulConfig, grouped_matmul
from ejkernel.modules.operations.mean_pooling import MeanPooling, MeanPoolingConfig, mean_pooling
from ejkernel.modules.operations.native_sparse_attention import (
    NativeSparseAttention,
    NativeSparseAttentionConfig,
    native_sparse_attention,
)
from ejkernel.modules.operations.ring_attention import RingAttention, RingAttentionConfig, ring_attention
from ejkernel.modules.operations.scaled_dot_product_attention import (
    ScaledDotProductAttention,
    ScaledDotProductAttentionConfig,
    scaled_dot_product_attention,
)
from ejkernel.ops import create_default_executor

__all__ = [
    "Attention",
    "AttentionConfig",
    "BlockSparseAttention",
    "BlockSparseAttentionConfig",
    "FlashAttention",
    "FlashAttentionConfig",
    "FlashMLA",
    "FlashMLAConfig",
    "GroupedMatmul",
    "GroupedMatmulConfig",
    "MeanPooling",
    "MeanPoolingConfig",
    "NativeSparseAttention",
    "NativeSparseAttentionConfig",
    "RingAttention",
    "RingAttentionConfig",
    "ScaledDotProductAttention",
    "ScaledDotProductAttentionConfig",
    "attention",
    "blocksparse_attention",
    "create_default_executor",
    "flash_attention",
    "flash_mla",
    "grouped_matmul",
    "mean_pooling",
    "native_sparse_attention",
    "ring_attention",
    "scaled_dot_product_attention",
]
