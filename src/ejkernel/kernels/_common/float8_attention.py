"""What the float8 flash attention implementations share: the dtypes, the descale checks, dequantisation and the
inference-only wrapper.

A float8 call carries `descales = (q_descale [H], k_descale [Hkv], v_descale [Hkv])`, float32 per head (the
public function broadcasts scalars): the tensor a float8 array stands for is `code * descale` of its head.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

FLOAT8_DTYPES = (jnp.dtype(jnp.float8_e4m3fn), jnp.dtype(jnp.float8_e5m2))
OUTPUT_DTYPE = jnp.dtype(jnp.bfloat16)  # what a float8 call returns
DESCALE_NAMES = ("q_descale", "k_descale", "v_descale")


def is_float8(dtype) -> bool:
    return jnp.dtype(dtype) in FLOAT8_DTYPES


def check_descales(who: str, query, key, descales) -> tuple:
    """`descales` fit a float8 call of `query`/`key` (three float32 per-head vectors); returns them.

    Descales with 16/32-bit inputs, or float8 inputs without them, are a TypeError (one line): the public
    function never builds either, so only a direct call of an implementation gets here.
    """
    if not is_float8(query.dtype):
        if descales is not None:
            raise TypeError(f"{who}: descales are for float8 query/key/value, got {query.dtype}")
        return None
    if descales is None or len(descales) != 3:
        raise TypeError(f"{who}: float8 query/key/value need descales=(q [heads], k [kv_heads], v [kv_heads])")
    heads = (query.shape[2], key.shape[2], key.shape[2])
    for name, scale, count in zip(DESCALE_NAMES, descales, heads, strict=True):
        if getattr(scale, "shape", None) != (count,) or jnp.dtype(scale.dtype) != jnp.float32:
            raise TypeError(f"{who}: {name} must be float32 [{count}], got {getattr(scale, 'shape', scale)}")
    return tuple(descales)


def dequantize(x, descale):
    """`[B, S, H, D]` float8 codes times their head's descale (`[H]` float32) -> float32."""
    return x.astype(jnp.float32) * descale[None, None, :, None]


def inference_only(fn):
    """`fn` (arrays -> output), differentiable in nothing: taking a derivative raises one TypeError line.

    float8 attention has no backward (its inputs are quantised codes); a custom VJP whose forward rule
    raises says so where `jax.grad`, `jax.vjp` or a training step reaches it, at trace time.
    """

    @jax.custom_vjp
    def run(*arrays):
        return fn(*arrays)

    def forward_rule(*arrays):
        raise TypeError(
            "flash_attention: float8 inputs are inference only (no gradient); dequantise to bfloat16 to differentiate"
        )

    run.defvjp(forward_rule, lambda residuals, g: None)
    return run
