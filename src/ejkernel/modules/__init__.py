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
from ejkernel.modules.operations.gated_delta_rule import GatedDeltaRule, GatedDeltaRuleConfig, gated_delta_rule
from ejkernel.modules.operations.gla_attention import GLAttention, GLAttentionConfig, gla_attention
from ejkernel.modules.operations.grouped_matmul import GroupedMatmul, GroupedMatmulConfig, grouped_matmul
from ejkernel.modules.operations.kernel_delta_attention import (
    KernelDeltaAttention,
    KernelDeltaAttentionConfig,
    kernel_delta_attention,
)
from ejkernel.modules.operations.lightning_attention import (
    LightningAttention,
    LightningAttentionConfig,
    lightning_attention,
)
from ejkernel.modules.operations.mean_pooling import MeanPooling, MeanPoolingConfig, mean_pooling
from ejkernel.modules.operations.native_sparse_attention import (
    NativeSparseAttention,
    NativeSparseAttentionConfig,
    native_sparse_attention,
)
from ejkernel.modules.operations.recurrent_attention import (
    RecurrentAttention,
    RecurrentAttentionConfig,
    recurrent_attention,
)
from ejkernel.modules.operations.ring_attention import RingAttention, RingAttentionConfig, ring_attention
from ejkernel.modules.operations.scaled_dot_product_attention import (
    ScaledDotProductAttention,
    ScaledDotProductAttentionConfig,
    scaled_dot_product_attention,
)
from ejkernel.modules.operations.state_space_v1 import StateSpaceV1, StateSpaceV1Config, state_space_v1
from ejkernel.modules.operations.state_space_v2 import StateSpaceV2, StateSpaceV2Config, state_space_v2
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
    "GLAttention",
    "GLAttentionConfig",
    "GatedDeltaRule",
    "GatedDeltaRuleConfig",
    "GroupedMatmul",
    "GroupedMatmulConfig",
    "KernelDeltaAttention",
    "KernelDeltaAttentionConfig",
    "LightningAttention",
    "LightningAttentionConfig",
    "MeanPooling",
    "MeanPoolingConfig",
    "NativeSparseAttention",
    "NativeSparseAttentionConfig",
    "RecurrentAttention",
    "RecurrentAttentionConfig",
    "RingAttention",
    "RingAttentionConfig",
    "ScaledDotProductAttention",
    "ScaledDotProductAttentionConfig",
    "StateSpaceV1",
    "StateSpaceV1Config",
    "StateSpaceV2",
    "StateSpaceV2Config",
    "attention",
    "blocksparse_attention",
    "create_default_executor",
    "flash_attention",
    "flash_mla",
    "gated_delta_rule",
    "gla_attention",
    "grouped_matmul",
    "kernel_delta_attention",
    "lightning_attention",
    "mean_pooling",
    "native_sparse_attention",
    "recurrent_attention",
    "ring_attention",
    "scaled_dot_product_attention",
    "state_space_v1",
    "state_space_v2",
]
