"""Multi-head latent attention in plain JAX, in the weight-absorbed form over the XLA flash attention.

Each query head is folded through its `w_kc` and all heads attend, as one multi-query group, to the
latent rows themselves (with the shared RoPE key dims appended): `_common.mla.absorbed_attention` over
the XLA flash attention core, which brings every masking option and its memory-linear custom VJP. Its
output, a weighted sum of latent rows per head, goes through `w_vc` once. Per-head keys and values are
never built, so memory stays linear in the context; gradients reach query, key_value, w_kc, w_vc, b_q,
b_k, bias and the sinks through the core's VJP and plain autodiff of the folds.
"""

from __future__ import annotations

from ejkernel.kernels._common.flash_attention.entry import flash_attention_xla
from ejkernel.kernels._common.mla import absorbed_attention


def flash_mla_xla(query, key_value, w_kc, w_vc, b_q=None, b_k=None, cu_seqlens=None, *, cfg=None, **options):
    """`[B, Sq, Hq, Dv]` (semantics and options: `flash_mla_reference`); tiles from `cfg.fwd_params` / `bwd_params`."""
    return absorbed_attention(
        flash_attention_xla, query, key_value, w_kc, w_vc, b_q, b_k, cu_seqlens, cfg=cfg, **options
    )
