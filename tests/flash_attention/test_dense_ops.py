"""`attention` (returns weights) and `scaled_dot_product_attention` against the reference."""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from ejkernel.modules import attention, scaled_dot_product_attention
from ejkernel.reference.flash_attention import flash_attention_reference
from ejkernel.types import MaskInfo
from harness import assert_close, check_forward_and_grads, randn

B, S, H, HKV, D = 2, 24, 4, 2, 16


def qkv(dtype=jnp.float32):
    return randn((B, S, H, D), dtype), randn((B, S, HKV, D), dtype), randn((B, S, HKV, D), dtype)


def test_attention_output_weights_and_grads():
    q, k, v = qkv()
    sinks, bias = randn((H,)), randn((1, H, S, S))
    kw = dict(causal=True, sliding_window=(5, 0), logits_soft_cap=4.0)
    fn = lambda q, k, v: attention(q, k, v, bias, None, sinks, dtype=jnp.float32, **kw)[0]
    ref = lambda q, k, v: flash_attention_reference(
        q, k, v, bias, sinks, softmax_scale=D**-0.5, causal=True, sliding_window=(5, 0), logits_soft_cap=4.0
    )
    check_forward_and_grads(fn, ref, [q, k, v], (0, 1, 2), jnp.float32)
    out, weights = attention(q, k, v, bias, None, sinks, dtype=jnp.float32, **kw)
    assert weights.shape == (B, H, S, S)
    grouped_v = jnp.repeat(v, H // HKV, axis=2)
    assert_close(jnp.einsum("bhqk,bkhd->bqhd", weights, grouped_v), out)


def test_attention_mask_info_and_dropout():
    q, k, v = qkv()
    seg = jnp.array([[0] * 10 + [1] * 14, [0] * 20 + [-1] * 4])
    out, _ = attention(q, k, v, mask_info=MaskInfo.from_segments(seg), dtype=jnp.float32)
    expected = flash_attention_reference(q, k, v, softmax_scale=D**-0.5, q_segment_ids=seg, kv_segment_ids=seg)
    assert_close(out, expected)
    assert bool(jnp.all(out[1, 20:] == 0))
    kept, _ = attention(q, k, v, None, jax.random.PRNGKey(0), dropout_prob=0.5, deterministic=False, dtype=jnp.float32)
    assert not bool(jnp.allclose(kept, attention(q, k, v, dtype=jnp.float32)[0]))
    with pytest.raises(ValueError, match="dropout_rng"):
        attention(q, k, v, dropout_prob=0.5, deterministic=False)


@pytest.mark.lowest
def test_sdpa_matches_reference_with_lengths_window_and_mask_info():
    q, k, v = qkv()
    lengths = jnp.array([S, 17], jnp.int32)
    out = scaled_dot_product_attention(q, k, v, None, lengths, lengths, causal=True, sliding_window=(4, 0))
    seg = jnp.where(jnp.arange(S)[None] < lengths[:, None], 0, -1)
    expected = flash_attention_reference(
        q, k, v, softmax_scale=D**-0.5, q_segment_ids=seg, kv_segment_ids=seg, causal=True, sliding_window=(4, 0)
    )
    assert_close(out, expected)  # padded query rows see no key: zeros, as in the reference
    mask = MaskInfo.from_segments(jnp.array([[0] * 12 + [1] * 12] * B))
    got = scaled_dot_product_attention(q, k, v, init_bias=lambda: jnp.zeros((S, S)), mask_info=mask)
    assert_close(
        got,
        flash_attention_reference(q, k, v, softmax_scale=D**-0.5, attention_mask=mask.get_or_compute_attention_mask()),
    )


def test_sdpa_rows_without_keys_are_zeros():
    q, k, v = qkv()
    out = scaled_dot_product_attention(q, k, v, None, None, jnp.array([0, 9], jnp.int32))
    assert bool(jnp.all(out[0] == 0)) and bool(jnp.all(jnp.isfinite(out)))


WRONG_MASK = MaskInfo.from_segments(jnp.zeros((B, S + 2), jnp.int32))
BAD_INPUTS = [
    (lambda q, k, v: scaled_dot_product_attention(q, k, v, None, jnp.array([-1, 5], jnp.int32)), "cum_seqlens_q[0]"),
    (lambda q, k, v: scaled_dot_product_attention(q, k, v, None, None, jnp.array([3, 50])), "cum_seqlens_k[1]"),
    (lambda q, k, v: scaled_dot_product_attention(q, k, v, None, jnp.array([3], jnp.int32)), "cum_seqlens_q"),
    (lambda q, k, v: scaled_dot_product_attention(q, k, v[..., :8]), "value's head dim"),
    (lambda q, k, v: scaled_dot_product_attention(q, k, v, mask_info=WRONG_MASK), "mask_info"),
    (lambda q, k, v: attention(q, k, v, mask_info=WRONG_MASK), "mask_info"),
    (lambda q, k, v: attention(q, k, v, dtype=jnp.int32), "dtype"),
    (lambda q, k, v: attention(q, k, v, softmax_dtype=jnp.int32), "softmax_dtype"),
    (lambda q, k, v: attention(q, k, v, None, None, jnp.zeros((0,))), "softmax_aux"),
]


@pytest.mark.lowest
@pytest.mark.parametrize(("call", "words"), BAD_INPUTS)
def test_bad_inputs_name_the_argument(call, words):
    with pytest.raises((ValueError, TypeError)) as info:
        call(*qkv())
    assert words in str(info.value), str(info.value)[:500]


@pytest.mark.gpu
def test_sdpa_cuda_matches_xla():
    q, k, v = qkv(jnp.bfloat16)
    q, k, v = (jnp.tile(x, (1, 32, 1, 8)) for x in (q, k, v))  # [2, 768, 4|2, 128]
    out = scaled_dot_product_attention(q, k, v, causal=True, platform="cuda")
    assert_close(out, scaled_dot_product_attention(q, k, v, causal=True, platform="xla"), jnp.bfloat16)


def test_sdpa_sharded_over_batch_and_heads_equals_unsharded():
    mesh = jax.make_mesh((2, 2), ("data", "model"))
    q, k, v = qkv()
    mask = MaskInfo.from_segments(jnp.array([[0] * 12 + [1] * 12, [0] * 20 + [-1] * 4]))
    spec = P("data", None, "model", None)
    out = scaled_dot_product_attention(q, k, v, mask_info=mask, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec)
    assert_close(out, scaled_dot_product_attention(q, k, v, mask_info=mask))


def test_sdpa_refuses_a_split_query_sequence_with_query_lengths():
    """Query lengths compare positions, which restart at 0 on each shard of a split query sequence."""
    mesh = jax.make_mesh((2,), ("sp",))
    q, k, v = qkv()
    lengths = jnp.array([S, 7], jnp.int32)
    specs = dict(mesh=mesh, in_specs=(P(None, "sp"), P(), P(), P()), out_specs=P(None, "sp"))
    with pytest.raises(ValueError, match="query's axis 1"):
        scaled_dot_product_attention(q, k, v, None, lengths, **specs)
    assert_close(scaled_dot_product_attention(q, k, v, **specs), scaled_dot_product_attention(q, k, v))
