"""What moved between the JAX versions the package supports (`jax>=0.11.2,<0.13`), in one place.

Kernels call these instead of testing `jax.__version__`: each looks at the API itself, so a patch
release that moves it back needs no change here.
"""

from __future__ import annotations

import functools
import inspect

import jax.numpy as jnp


@functools.cache
def cudnn_fused_attention():
    """JAX's private cuDNN attention module (`jax._src.cudnn.fused_attention_stablehlo`)."""
    from jax._src.cudnn import fused_attention_stablehlo

    return fused_attention_stablehlo


@functools.cache
def cudnn_score_mod_options() -> dict:
    """The arguments of cuDNN's flex-attention score modifier, empty, for the private forward and backward
    implementations: JAX 0.12 made `score_mod_args` and `score_mod` required there; 0.11 has neither."""
    parameters = inspect.signature(cudnn_fused_attention()._dot_product_attention_fwd_impl).parameters
    return dict(score_mod_args=(), score_mod=None) if "score_mod" in parameters else {}


def _cudnn_options(causal: bool) -> dict:
    """The static options of one cuDNN call: no dropout, bias or window; BTNH layout; causal or no mask."""
    cudnn = cudnn_fused_attention()
    return dict(
        seed=0,
        dropout_rate=0.0,
        variadic_args=(False, False),  # (has bias, has dbias)
        mask_type=cudnn.MaskType.CAUSAL if causal else cudnn.MaskType.NO_MASK,
        layout=cudnn.AttentionLayout.BTNH.value,
        sliding_window_length=None,
        **cudnn_score_mod_options(),
    )


def cudnn_forward(q, k, v, scale: float, causal: bool):
    """(out [B, T, H, D] in q.dtype, lse [B, H, T] float32) of one call of cuDNN's fused attention (GPU only;
    bfloat16 / float16, head dim <= 256; causal: the top-left aligned mask)."""
    none = jnp.zeros(0, q.dtype)
    return cudnn_fused_attention()._dot_product_attention_fwd_impl(
        q, k, v, none, none, none, none, none, none, none, scale=scale, is_training=True, **_cudnn_options(causal)
    )


def cudnn_backward(q, k, v, out, lse, d_out, scale: float, causal: bool):
    """(dq, dk, dv) of one cuDNN fused attention call, P = exp(S - lse) recomputed from the given out / lse (which
    may be another computation's: ring attention hands each block the whole ring's)."""
    none = jnp.zeros(0, q.dtype)
    return cudnn_fused_attention()._dot_product_attention_bwd_impl(
        q, k, v, none, none, none, none, none, none, none, lse, out, d_out, scale=scale, **_cudnn_options(causal)
    )[:3]
