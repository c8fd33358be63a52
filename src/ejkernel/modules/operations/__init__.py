"""Every operation's public function, `Kernel` class and config: the one list of the ops.

`from ejkernel.modules.operations import flash_attention` gives the function, as upstream code
expects; the modules of the same names stay importable by their full path
(`from ejkernel.modules.operations.flash_attention import FlashAttention`).
"""

from ejkernel.modules.operations.attention import Attention, AttentionConfig, attention
from ejkernel.modules.operations.blocksparse_attention import (
    BlockSparseAttention,
    BlockSparseAttentionConfig,
    blocksparse_attention,
)
from ejkernel.modules.operations.cascade_attention import (
    CascadeAttention,
    CascadeAttentionConfig,
    cascade_attention,
)
from ejkernel.modules.operations.causal_conv1d import (
    CausalConv1d,
    CausalConv1dConfig,
    CausalConv1dTritonTiling,
    causal_conv1d,
    ragged_causal_conv1d,
)
from ejkernel.modules.operations.flash_attention import FlashAttention, FlashAttentionConfig, flash_attention
from ejkernel.modules.operations.flash_mla import FlashMLA, FlashMLAConfig, flash_mla
from ejkernel.modules.operations.gated_delta_rule import GatedDeltaRule, GatedDeltaRuleConfig, gated_delta_rule
from ejkernel.modules.operations.gla_attention import (
    GLAttention,
    GLAttentionConfig,
    GLAttentionTritonTiling,
    gla_attention,
)
from ejkernel.modules.operations.grouped_matmul import (
    GroupedMatmul,
    GroupedMatmulConfig,
    GroupedMatmulMosaicFp8Tiling,
    grouped_matmul,
)
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
from ejkernel.modules.operations.merge_attention_states import (
    MergeAttentionStates,
    MergeAttentionStatesConfig,
    merge_attention_states,
)
from ejkernel.modules.operations.multi_latent_ragged_page_attention import (
    MultiLatentRaggedPageAttention,
    MultiLatentRaggedPageAttentionConfig,
    MultiLatentRaggedPageAttentionMosaicTiling,
    MultiLatentRaggedPageAttentionTritonTiling,
    MultiLatentRaggedPageAttentionV2,
    MultiLatentRaggedPageAttentionV2Config,
    multi_latent_ragged_page_attention,
    multi_latent_ragged_page_attention_v2,
)
from ejkernel.modules.operations.native_sparse_attention import (
    NativeSparseAttention,
    NativeSparseAttentionConfig,
    native_sparse_attention,
)
from ejkernel.modules.operations.page_attention import PageAttention, PageAttentionConfig, page_attention
from ejkernel.modules.operations.prefill_page_attention import (
    PrefillPageAttention,
    PrefillPageAttentionConfig,
    prefill_page_attention,
)
from ejkernel.modules.operations.quantized_matmul import (
    QuantizedMatmul,
    QuantizedMatmulConfig,
    QuantizedMatmulMosaicTiling,
    quantized_matmul,
)
from ejkernel.modules.operations.ragged_decode_attention import (
    RaggedDecodeAttention,
    RaggedDecodeAttentionConfig,
    ragged_decode_attention,
)
from ejkernel.modules.operations.ragged_gated_delta_rule import (
    RaggedGatedDeltaRule,
    RaggedGatedDeltaRuleConfig,
    ragged_gated_delta_rule,
)
from ejkernel.modules.operations.ragged_page_attention_v2 import (
    RaggedPageAttentionV2,
    RaggedPageAttentionV2Config,
    ragged_page_attention_v2,
)
from ejkernel.modules.operations.ragged_page_attention_v3 import (
    RaggedPageAttentionV3,
    RaggedPageAttentionV3Config,
    ragged_page_attention_v3,
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
from ejkernel.modules.operations.unified_attention import UnifiedAttention, UnifiedAttentionConfig, unified_attention

# Upstream's other names for two ops.
gdr_attention, kda_attention = gated_delta_rule, kernel_delta_attention

# Upstream spells these two with a lower-case v; the same class objects, so isinstance holds either way.
RaggedPageAttentionv2, RaggedPageAttentionv2Config = RaggedPageAttentionV2, RaggedPageAttentionV2Config
RaggedPageAttentionv3, RaggedPageAttentionv3Config = RaggedPageAttentionV3, RaggedPageAttentionV3Config

__all__ = [
    "Attention",
    "AttentionConfig",
    "BlockSparseAttention",
    "BlockSparseAttentionConfig",
    "CascadeAttention",
    "CascadeAttentionConfig",
    "CausalConv1d",
    "CausalConv1dConfig",
    "CausalConv1dTritonTiling",
    "FlashAttention",
    "FlashAttentionConfig",
    "FlashMLA",
    "FlashMLAConfig",
    "GLAttention",
    "GLAttentionConfig",
    "GLAttentionTritonTiling",
    "GatedDeltaRule",
    "GatedDeltaRuleConfig",
    "GroupedMatmul",
    "GroupedMatmulConfig",
    "GroupedMatmulMosaicFp8Tiling",
    "KernelDeltaAttention",
    "KernelDeltaAttentionConfig",
    "LightningAttention",
    "LightningAttentionConfig",
    "MeanPooling",
    "MeanPoolingConfig",
    "MergeAttentionStates",
    "MergeAttentionStatesConfig",
    "MultiLatentRaggedPageAttention",
    "MultiLatentRaggedPageAttentionConfig",
    "MultiLatentRaggedPageAttentionMosaicTiling",
    "MultiLatentRaggedPageAttentionTritonTiling",
    "MultiLatentRaggedPageAttentionV2",
    "MultiLatentRaggedPageAttentionV2Config",
    "NativeSparseAttention",
    "NativeSparseAttentionConfig",
    "PageAttention",
    "PageAttentionConfig",
    "PrefillPageAttention",
    "PrefillPageAttentionConfig",
    "QuantizedMatmul",
    "QuantizedMatmulConfig",
    "QuantizedMatmulMosaicTiling",
    "RaggedDecodeAttention",
    "RaggedDecodeAttentionConfig",
    "RaggedGatedDeltaRule",
    "RaggedGatedDeltaRuleConfig",
    "RaggedPageAttentionV2",
    "RaggedPageAttentionV2Config",
    "RaggedPageAttentionV3",
    "RaggedPageAttentionV3Config",
    "RaggedPageAttentionv2",
    "RaggedPageAttentionv2Config",
    "RaggedPageAttentionv3",
    "RaggedPageAttentionv3Config",
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
    "UnifiedAttention",
    "UnifiedAttentionConfig",
    "attention",
    "blocksparse_attention",
    "cascade_attention",
    "causal_conv1d",
    "flash_attention",
    "flash_mla",
    "gated_delta_rule",
    "gdr_attention",
    "gla_attention",
    "grouped_matmul",
    "kda_attention",
    "kernel_delta_attention",
    "lightning_attention",
    "mean_pooling",
    "merge_attention_states",
    "multi_latent_ragged_page_attention",
    "multi_latent_ragged_page_attention_v2",
    "native_sparse_attention",
    "page_attention",
    "prefill_page_attention",
    "quantized_matmul",
    "ragged_causal_conv1d",
    "ragged_decode_attention",
    "ragged_gated_delta_rule",
    "ragged_page_attention_v2",
    "ragged_page_attention_v3",
    "recurrent_attention",
    "ring_attention",
    "scaled_dot_product_attention",
    "state_space_v1",
    "state_space_v2",
    "unified_attention",
]
