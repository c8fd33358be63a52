"""float8 flash attention (inference only) on CPU: the XLA path against the reference of the dequantised
inputs, derivatives refused, bad descales and mixed dtypes refused in one line."""

import jax
import jax.numpy as jnp
import pytest

from ejkernel import kernel_registry
from ejkernel.kernels._common.attention_call import AttentionCall
from ejkernel.modules import FlashAttention, FlashAttentionConfig, flash_attention
from ejkernel.reference.flash_attention import dequantized_flash_attention_reference
from harness import assert_close, randn

E4M3 = jnp.float8_e4m3fn

# (batch, q_len, kv_len, heads, kv_heads, dim, float8 dtype, options, descales: "per-head" or "scalar")
CASES = {
    "causal-gqa-per-head-descales": (2, 70, 90, 4, 2, 32, E4M3, {"causal": True}, "per-head"),
    "e5m2-window-sinks-scalar-descales": (
        1,
        64,
        64,
        2,
        1,
        16,
        jnp.float8_e5m2,
        {"sliding_window": (20, 3), "softmax_aux": True},
        "scalar",
    ),
}


def float8_inputs(batch, q_len, kv_len, heads, kv_heads, dim, dtype=E4M3):
    """Codes of random normals times 4 (so that e4m3's subnormals and large values both occur)."""
    q = randn((batch, q_len, heads, dim), scale=4.0).astype(dtype)
    k = randn((batch, kv_len, kv_heads, dim), scale=4.0).astype(dtype)
    v = randn((batch, kv_len, kv_heads, dim), scale=4.0).astype(dtype)
    return q, k, v


def descales(kind: str, heads: int, kv_heads: int) -> dict:
    if kind == "scalar":
        return {"q_descale": 0.3, "k_descale": jnp.float32(0.2), "v_descale": 1.5}
    factors = [0.05 + jax.random.uniform(jax.random.PRNGKey(n), (h,)) / 4 for n, h in enumerate((heads, kv_heads))]
    return {"q_descale": factors[0], "k_descale": factors[1], "v_descale": factors[1][::-1] * 4}


@pytest.mark.parametrize("case", CASES)
def test_xla_matches_reference_of_dequantized_inputs(case):
    batch, q_len, kv_len, heads, kv_heads, dim, dtype, options, kind = CASES[case]
    q, k, v = float8_inputs(batch, q_len, kv_len, heads, kv_heads, dim, dtype)
    scales = descales(kind, heads, kv_heads)
    options = dict(options)
    sinks = randn((heads,)) if options.pop("softmax_aux", False) else None
    out = jax.jit(lambda q, k, v, s: flash_attention(q, k, v, None, None, None, sinks, platform="xla", **s, **options))(
        q, k, v, scales
    )
    window = options.pop("sliding_window", None)
    expected = dequantized_flash_attention_reference(
        q, k, v, None, sinks, softmax_scale=dim**-0.5, sliding_window=window, **scales, **options
    )
    assert out.dtype == jnp.bfloat16
    assert_close(out, expected, tol=5e-3)


def test_derivatives_of_float8_calls_raise():
    q, k, v = float8_inputs(1, 16, 16, 2, 2, 16)
    loss = lambda q: flash_attention(q, k, v, q_descale=0.5).astype(jnp.float32).sum()
    with pytest.raises(TypeError, match="float8 inputs are inference only"):
        jax.grad(loss)(q)


def test_bad_inputs_are_one_line_errors():
    q, k, v = float8_inputs(1, 16, 16, 4, 2, 16)
    with pytest.raises(ValueError, match=r"^k_descale must be a scalar or a \[kv_heads=2\] array, got shape \(4,\)$"):
        flash_attention(q, k, v, k_descale=jnp.ones(4))
    with pytest.raises(TypeError, match="q_descale must be a floating-point array"):
        flash_attention(q, k, v, q_descale=jnp.ones(4, jnp.int32))
    with pytest.raises(TypeError, match=r"^query, key and value must share a dtype, got float8_e4m3fn, bfloat16"):
        flash_attention(q, k.astype(jnp.bfloat16), v)
    x = q.astype(jnp.bfloat16)
    with pytest.raises(TypeError, match=r"^v_descale is for float8 query/key/value, got bfloat16$"):
        flash_attention(x, x[:, :, :2], x[:, :, :2], v_descale=2.0)


@pytest.mark.parametrize("platform, backend", [("triton", "gpu"), ("cuda", "gpu"), ("pallas", "tpu")])
def test_other_platforms_decline_float8(platform, backend):
    """`auto` on a GPU tries cuDNN and Triton before XLA: both decline float8 before tracing anything."""
    q, k, v = float8_inputs(1, 16, 16, 2, 2, 16)
    (impl,) = kernel_registry.candidates("flash_attention", platform, backend)
    call = {"call": AttentionCall.of(q), "descales": (jnp.ones(2), jnp.ones(2), jnp.ones(2))}
    with pytest.raises(NotImplementedError, match="float8 query/key/value is supported by the xla and pallas/gpu"):
        FlashAttention().call_impl(impl, (q, k, v, None, None), call, FlashAttentionConfig())
