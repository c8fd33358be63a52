"""XLA flash attention against the float32 reference: forward and every gradient.

Compilation dominates this file's time on CPU, so most tests share one set of shapes (one compile of
every small helper op) and random tensors are cut from fixed-size draws of `randn` (one compile of
the generator for the whole file). Every tensor is still drawn with a fresh key.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ejkernel.kernels._common.attention_call import AttentionCall
from ejkernel.kernels._xla.flash_attention import flash_attention as flash_attention_xla  # keyword form
from ejkernel.ops.config import BwdParams, FwdParams
from ejkernel.reference.flash_attention import flash_attention_reference
from harness import assert_close, check_forward_and_grads, randn

# Small blocks so that every call walks several (partial) tiles; the backward tiles differently.
BLOCKS = {"fwd_params": FwdParams(block_q=32, block_k=64), "bwd_params": BwdParams(block_q=64, block_k=32)}
# The shared shapes: neither length is a multiple of either block size; grouped-query heads.
B, SQ, SK, H, HKV, D = 2, 70, 90, 4, 2, 16
_POOL = 1 << 16


def rand(shape, dtype=jnp.float32, scale=1.0):
    """Fresh standard-normal tensor (from `randn` draws of one fixed size)."""
    n = math.prod(shape)
    draws = [np.asarray(randn((_POOL,))) for _ in range(-(-n // _POOL))]
    return jnp.asarray(scale * np.concatenate(draws)[:n].reshape(shape), dtype)


def _inputs(batch=B, q_len=SQ, k_len=SK, heads=H, kv_heads=HKV, dim=D, dtype=jnp.float32, dv=None):
    q = rand((batch, q_len, heads, dim), dtype)
    k = rand((batch, k_len, kv_heads, dim), dtype)
    v = rand((batch, k_len, kv_heads, dv or dim), dtype)
    return q, k, v


def _segments(length, cuts, pad=0, batch=B):
    """Segment ids with boundaries at `cuts`, `pad` trailing padding positions (-1); rows differ."""
    ids = np.zeros((batch, length), np.int32)
    for c in cuts:
        ids[:, c:] += 1
    ids[1:, : length // 3] += 7
    if pad:
        ids[:, length - pad :] = -1
    return jnp.asarray(ids)


def _check(q, k, v, bias=None, aux=None, dtype=jnp.float32, **kw):
    """XLA (jitted, small blocks) vs the reference: forward and the VJP of every float input."""
    args = [q, k, v] + [x for x in (bias, aux) if x is not None]
    has_bias, has_aux = bias is not None, aux is not None
    kw.setdefault("softmax_scale", q.shape[-1] ** -0.5)

    def unpack(*a):
        return a[0], a[1], a[2], (a[3] if has_bias else None), (a[3 + has_bias] if has_aux else None)

    def fn(*a):
        return flash_attention_xla(*unpack(*a), **kw, **BLOCKS)

    def ref(*a):
        return flash_attention_reference(*unpack(*a), **kw)

    check_forward_and_grads(jax.jit(fn), jax.jit(ref), args, tuple(range(len(args))), dtype)


@pytest.mark.parametrize(
    ("q_len", "k_len", "heads", "kv_heads", "dtype"),
    [
        (1, 257, 2, 2, jnp.float32),  # MHA, a single query row
        (257, 63, 4, 2, jnp.bfloat16),  # GQA
        (63, 1, 4, 1, jnp.float32),  # MQA, a single key
    ],
)
def test_lengths_and_heads(q_len, k_len, heads, kv_heads, dtype):
    q, k, v = _inputs(2, q_len, k_len, heads, kv_heads, 16, dtype, dv=32 if kv_heads == 1 else None)
    aux = rand((heads,), dtype)  # sinks: a row with one key would otherwise have a constant softmax
    _check(q, k, v, None, aux, dtype=dtype, causal=min(q_len, k_len) > 1)


@pytest.mark.parametrize("feature", ["causal", "window", "soft_cap", "bias", "shared_sinks", "segments", "mask"])
def test_feature_alone(feature):
    q, k, v = _inputs()
    bias = aux = None
    kw = {}
    if feature == "causal":
        kw["causal"] = True
    elif feature == "window":
        kw["sliding_window"] = (17, 5)
    elif feature == "soft_cap":
        q = q * 4.0
        kw["logits_soft_cap"] = 2.5
    elif feature == "bias":
        bias = rand((B, H, SQ, SK))
    elif feature == "shared_sinks":
        aux = rand((3,))
    elif feature == "segments":
        kw["q_segment_ids"] = _segments(SQ, (20, 45), pad=4)
        kw["kv_segment_ids"] = _segments(SK, (30, 60), pad=6)
    elif feature == "mask":
        kw["attention_mask"] = jax.random.bernoulli(jax.random.PRNGKey(3), 0.7, (B, 1, SQ, SK))
    _check(q, k, v, bias, aux, **kw)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_combination(dtype):
    """causal + window + soft cap + per-head sinks + segments (with padding) + GQA + a head-shared bias."""
    q, k, v = _inputs(dtype=dtype)
    q = q * 3.0
    bias = rand((1, H, SQ, SK), dtype)
    aux = rand((H,), dtype)
    kw = {
        "causal": True,
        "sliding_window": (40, 0),
        "logits_soft_cap": 4.0,
        "q_segment_ids": _segments(SQ, (30, 50), pad=5),
        "kv_segment_ids": _segments(SK, (30, 50), pad=15),
    }
    _check(q, k, v, bias, aux, dtype=dtype, **kw)


def test_dropout_matches_reference():
    q, k, v = _inputs()
    aux = rand((H,))
    _check(q, k, v, None, aux, causal=True, dropout_prob=0.25, dropout_seed=jnp.uint32(1234))


def test_dropout_deterministic_and_seeded():
    q, k, v = _inputs()

    @jax.jit
    def f(seed):
        return flash_attention_xla(q, k, v, softmax_scale=0.25, dropout_prob=0.5, dropout_seed=seed, **BLOCKS)

    a, b, c = f(jnp.uint32(5)), f(jnp.uint32(5)), f(jnp.uint32(6))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not np.allclose(np.asarray(a), np.asarray(c))
    plain = flash_attention_xla(q, k, v, softmax_scale=0.25, **BLOCKS)
    assert not np.allclose(np.asarray(a), np.asarray(plain))


def test_fully_masked_rows_from_segments():
    """Padding rows and a segment without keys, with sinks: zero rows, zero and finite gradients."""
    q, k, v = _inputs()
    q_seg = _segments(SQ, (30,), pad=9).at[:, 5:8].set(-1).at[:, 10:12].set(42)  # 42: no such key
    kv_seg = _segments(SK, (25,))
    aux = rand((H,))
    kw = {"softmax_scale": 0.25, "q_segment_ids": q_seg, "kv_segment_ids": kv_seg, "causal": True}
    _check(q, k, v, None, aux, **kw)

    def loss(q, k, v, aux):
        out = flash_attention_xla(q, k, v, None, aux, **kw, **BLOCKS)
        return jnp.sum(out * jnp.cos(jnp.arange(out.size, dtype=jnp.float32)).reshape(out.shape)), out

    grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True))
    (_, out), (dq, dk, dv, daux) = grad(q, k, v, aux)
    empty = np.asarray(q_seg < 0) | np.asarray(q_seg == 42)
    assert np.all(np.asarray(out)[empty] == 0.0)
    assert np.all(np.asarray(dq)[empty] == 0.0)
    for g in (dq, dk, dv, daux):
        assert np.all(np.isfinite(np.asarray(g)))

    # Removing the empty rows' queries changes nothing else: they contribute nothing to dk, dv, daux.
    q2 = jnp.where(jnp.asarray(empty)[:, :, None, None], 100.0, q)
    (_, out2), (_, dk2, dv2, daux2) = grad(q2, k, v, aux)
    np.testing.assert_array_equal(np.asarray(out2), np.asarray(out))
    for g, g2 in ((dk, dk2), (dv, dv2), (daux, daux2)):
        np.testing.assert_allclose(np.asarray(g2), np.asarray(g), rtol=1e-6, atol=1e-6)


def test_window_leaves_rows_empty():
    """Rows past the last key's window see nothing (and there are no sinks: log-sum-exp is -inf)."""
    k_len = 50
    q, k, v = _inputs(k_len=k_len)
    bias = rand((1, 1, SQ, k_len))  # broadcast over batch and heads: dbias sums back
    kw = {"causal": True, "sliding_window": (3, 0)}  # rows k_len + 3 .. see no key
    _check(q, k, v, bias, **kw)
    out = flash_attention_xla(q, k, v, bias, softmax_scale=0.25, **kw, **BLOCKS)
    assert np.all(np.asarray(out)[:, k_len + 3 :] == 0.0)
    assert np.all(np.any(np.asarray(out)[:, : k_len + 3] != 0.0, axis=-1))


def _unnormalized_reference(q, k, v, aux, *, softmax_scale, causal):
    """sum_j exp(s_ij - m_i) v_j, m_i the row max including the sinks (held constant)."""
    idx = jnp.arange(q.shape[2]) // (q.shape[2] // k.shape[2])
    s = jnp.einsum("bihd,bjhd->bhij", q, k[:, :, idx], precision="highest") * softmax_scale
    allowed = jnp.tril(jnp.ones(s.shape[-2:], bool)) if causal else jnp.ones(s.shape[-2:], bool)
    m = jnp.maximum(jnp.max(jnp.where(allowed, s, -jnp.inf), axis=-1), aux[None, :, None])
    m = jax.lax.stop_gradient(m)[..., None]
    e = jnp.exp(jnp.where(allowed, s - m, -jnp.inf))
    return jnp.einsum("bhij,bjhd->bihd", e, v[:, :, idx], precision="highest")


def test_unnormalized_output():
    q, k, v = _inputs(dtype=jnp.bfloat16)
    aux = rand((H,))
    kw = {"softmax_scale": 0.25, "causal": True}

    def fn(q, k, v):
        return flash_attention_xla(q, k, v, None, aux, normalize_output=False, **kw, **BLOCKS)

    def ref(q, k, v):
        return _unnormalized_reference(q, k, v, aux, **kw)

    check_forward_and_grads(jax.jit(fn), jax.jit(ref), [q, k, v], (0, 1, 2), jnp.bfloat16)


def test_vmap_checkpoint():
    """jit(vmap(checkpoint(...))) over an extra leading axis, with dropout, bias and sinks."""
    q, k, v = (x.reshape(B, 1, *x.shape[1:]) for x in _inputs())
    bias = rand((B, 1, H, SQ, SK))
    aux = rand((H,))
    kw = {"softmax_scale": 0.3, "causal": True, "dropout_prob": 0.1, "dropout_seed": jnp.uint32(9)}

    def fn(q, k, v, b, a):
        inner = jax.checkpoint(lambda q, k, v, b: flash_attention_xla(q, k, v, b, a, **kw, **BLOCKS))
        return jax.vmap(inner)(q, k, v, b)

    def ref(q, k, v, b, a):
        return jax.vmap(lambda q, k, v, b: flash_attention_reference(q, k, v, b, a, **kw))(q, k, v, b)

    check_forward_and_grads(jax.jit(fn), jax.jit(ref), [q, k, v, bias, aux], (0, 1, 2, 3, 4), jnp.float32)


def test_default_blocks_single_tile():
    """No fwd/bwd params: the default blocks clamp to the (short) lengths."""
    q, k, v = _inputs()
    fn = jax.jit(lambda q, k, v: flash_attention_xla(q, k, v, softmax_scale=0.25, causal=True))
    ref = jax.jit(lambda q, k, v: flash_attention_reference(q, k, v, softmax_scale=0.25, causal=True))
    assert_close(fn(q, k, v), ref(q, k, v))


def test_bad_arguments():
    q, k, v = _inputs()
    with pytest.raises(ValueError, match="multiple"):
        flash_attention_xla(q[:, :, :3], k, v, softmax_scale=1.0)
    with pytest.raises(ValueError, match="seed"):  # a call built field by field is checked too
        flash_attention_xla(q, k, v, None, None, AttentionCall(softmax_scale=1.0, dropout_prob=0.1))
    with pytest.raises(ValueError, match="together"):
        flash_attention_xla(q, k, v, softmax_scale=1.0, q_segment_ids=jnp.zeros((B, SQ), jnp.int32))
    with pytest.raises(ValueError, match="bias"):
        flash_attention_xla(q, k, v, jnp.zeros((1, 3, SQ, SK)), softmax_scale=1.0)
