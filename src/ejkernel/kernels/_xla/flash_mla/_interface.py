"""Multi-head latent attention in plain JAX, in the weight-absorbed form over the XLA flash attention.

Each query head is folded through its `w_kc` (`_common.mla.absorbed_query`) and all heads attend, as one
multi-query group, to the latent rows themselves (with the shared RoPE key dims appended): the XLA flash
attention core does that with every masking option and its memory-linear custom VJP. Its output, a
weighted sum of latent rows per head, goes through `w_vc` once. Per-head keys and values are never
built, so memory stays linear in the context; gradients reach query, key_value, w_kc, w_vc, b_q, b_k,
bias and the sinks through the core's VJP and plain autodiff of the folds.
"""

from __future__ import annotations

from ejkernel.kernels._common.mla import absorbed_query, canonical_call, expand_values, latent_keys
from ejkernel.kernels._xla.flash_attention._interface import flash_attention_xla


def flash_mla_xla(query, key_value, w_kc, w_vc, b_q=None, b_k=None, cu_seqlens=None, *, cfg=None, **options):
    """`[B, Sq, Hq, Dv]` (semantics and options: `flash_mla_reference`); tiles from `cfg.fwd_params` / `bwd_params`."""
    call = canonical_call(query, key_value, w_kc, w_vc, b_q, b_k, cu_seqlens, **options)
    latent_out = flash_attention_xla(
        absorbed_query(query, w_kc, b_q, b_k, call.dims),
        latent_keys(key_value, b_k),
        key_value[:, :, None],
        options.get("bias"),
        options.get("softmax_aux"),
        fwd_params=getattr(cfg, "fwd_params", None),
        bwd_params=getattr(cfg, "bwd_params", None),
        **call.attention,
    )
    return expand_values(latent_out, w_vc, call.dims, query.dtype)
