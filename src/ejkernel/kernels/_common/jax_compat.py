"""What moved between the JAX versions the package supports (`jax>=0.11.2,<0.13`), in one place.

Kernels call these instead of testing `jax.__version__`: each looks at the API itself, so a patch
release that moves it back needs no change here.
"""

from __future__ import annotations

import functools
import inspect


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
