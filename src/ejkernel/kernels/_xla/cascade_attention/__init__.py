"""Cascade attention in plain JAX: the shared paged core's two passes (the prefix once for the batch, each
sequence's own pages) joined by their log-sum-exps (`_common.paged_attention.cascade`)."""

from ejkernel.kernels._common.paged_attention.cascade import cascade_attention_on
from ejkernel.kernels._common.paged_attention.jax_core import paged_attention_core


def cascade_attention_xla(*args, softmax_scale: float, logits_soft_cap: float | None = None, cfg=None):
    """`[N, H, D]` in query's dtype; arguments as `ejkernel.modules.cascade_attention`'s, canonical."""
    del cfg  # the op's config has no tiling yet
    return cascade_attention_on(
        paged_attention_core, *args, softmax_scale=softmax_scale, logits_soft_cap=logits_soft_cap
    )


__all__ = ["cascade_attention_xla"]
