"""cuDNN's fused attention (through `jax.nn.dot_product_attention`) as scaled dot-product attention (`sdpa_cudnn`)."""

import functools

import jax
import jax.numpy as jnp

from ejkernel.kernels._common.scaled_dot_product_attention import zero_rows_without_keys


@functools.wraps(jax.nn.dot_product_attention)
def sdpa_cudnn(query, key, value, bias=None, *, mask=None, cfg=None, **options):
    if jax.default_backend() != "gpu":
        raise NotImplementedError("cuDNN attention runs on CUDA GPUs only")
    if query.dtype not in (jnp.bfloat16, jnp.float16):
        raise NotImplementedError(f"cuDNN attention needs bfloat16/float16, got {query.dtype}")
    if mask is not None:
        raise NotImplementedError("cuDNN route takes no dense mask")
    window = options.get("local_window_size")
    if window is not None and not options.get("is_causal"):
        if window[1] != 0:
            raise NotImplementedError("cuDNN supports a right-side window only together with causal=True")
        # A window (left, 0) keeps keys j <= i already: the same mask as causal with that window, the only form
        # in which cuDNN applies a window (given without causal, it attends otherwise than the XLA route).
        options = {**options, "is_causal": True}
    out = jax.nn.dot_product_attention(query, key, value, bias, mask, implementation="cudnn", **options)
    return zero_rows_without_keys(out, query, key, **options)  # the XLA route's rule: rows with no key give 0
