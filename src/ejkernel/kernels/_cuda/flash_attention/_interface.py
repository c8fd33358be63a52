"""Flash attention through cuDNN (`jax.nn.dot_product_attention(implementation="cudnn")`).

cuDNN's fused kernel is the fastest attention a JAX user has on Hopper for the features it knows:
causal, a left sliding window, grouped-query heads. Everything else (sinks, soft cap, dropout, segment
ids, dense masks, bias, other dtypes or head sizes) is declined with `NotImplementedError`, so
automatic selection moves on to our own kernels.
"""

import jax
import jax.numpy as jnp

from ejkernel.kernels._common.attention import decline_call
from ejkernel.kernels._common.attention_call import AttentionCall


def flash_attention_cudnn(
    query,
    key,
    value,
    bias,
    softmax_aux,
    call: AttentionCall,
    *,
    fwd_params=None,
    bwd_params=None,
):
    """The canonical call (options in `call`) on cuDNN, for what cuDNN serves; the tilings are not used."""
    decline_call(
        "cuDNN route",
        call,
        serves=("causal", "sliding_window"),
        bias=bias is not None,
        softmax_aux=softmax_aux is not None,
    )
    causal, sliding_window = call.causal, call.sliding_window
    if query.dtype not in (jnp.bfloat16, jnp.float16):
        raise NotImplementedError(f"cuDNN attention needs bfloat16/float16, got {query.dtype}")
    head_dim = query.shape[-1]
    if head_dim > 256 or head_dim % 8 or value.shape[-1] != head_dim:
        raise NotImplementedError(f"cuDNN attention needs equal q/k/v head dims <= 256, multiple of 8, got {head_dim}")
    if sliding_window is not None:
        left, right = sliding_window
        if not causal and right != 0:
            raise NotImplementedError("cuDNN supports a right-side window only together with causal=True")
        if query.shape[1] != key.shape[1]:
            raise NotImplementedError("cuDNN sliding window with different query and key lengths")
        window = (left, 0)
    else:
        window = None
    if jax.default_backend() != "gpu":
        raise NotImplementedError("cuDNN attention runs on CUDA GPUs only")
    return jax.nn.dot_product_attention(
        query,
        key,
        value,
        scale=call.softmax_scale,
        is_causal=causal or (window is not None),
        local_window_size=window,
        implementation="cudnn",
    )
