"""`jax.nn.dot_product_attention`'s XLA path as the portable scaled dot-product attention (`sdpa_xla`).

Rows that see no key give zeros, not jax.nn's mean of V (`_common.scaled_dot_product_attention`).
"""

import functools

import jax

from ejkernel.kernels._common.scaled_dot_product_attention import zero_rows_without_keys


@functools.wraps(jax.nn.dot_product_attention)
def sdpa_xla(query, key, value, bias=None, *, mask=None, cfg=None, **options):
    out = jax.nn.dot_product_attention(query, key, value, bias, mask, implementation="xla", **options)
    return zero_rows_without_keys(out, query, key, mask=mask, **options)
