"""Registers `jax.nn.dot_product_attention`'s XLA path as the portable scaled dot-product attention."""

import functools

import jax

from ejkernel.registry import Backend, Platform, kernel_registry


@functools.wraps(jax.nn.dot_product_attention)
def sdpa_xla(query, key, value, bias=None, *, mask=None, cfg=None, **options):
    return jax.nn.dot_product_attention(query, key, value, bias, mask, implementation="xla", **options)


kernel_registry.register("scaled_dot_product_attention", Platform.XLA, Backend.ANY, priority=0)(sdpa_xla)
