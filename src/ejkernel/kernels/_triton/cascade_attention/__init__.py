"""Cascade attention through the serving ops' Pallas-Triton kernel: the prefix pass (the batch's queries as one
sequence, split-K over the prefix) and the own pages' decode pass, joined by their log-sum-exps."""

import functools

from ejkernel.kernels._common.paged_attention.cascade import cascade_attention_on
from ejkernel.kernels._triton.paged_attention import paged_attention_triton_core


def cascade_attention_triton(
    *args, softmax_scale: float, logits_soft_cap: float | None = None, cfg=None, interpret: bool | None = None
):
    """`[N, H, D]` in query's dtype; arguments as `ejkernel.modules.cascade_attention`'s, canonical. Declines
    (NotImplementedError) what the kernel cannot serve (dtype, head dim over 256), before tracing it."""
    del cfg  # the op's config has no tiling yet
    core = functools.partial(paged_attention_triton_core, interpret=interpret)
    return cascade_attention_on(core, *args, softmax_scale=softmax_scale, logits_soft_cap=logits_soft_cap)


__all__ = ["cascade_attention_triton"]
