"""Length, offset and index arguments under `jax.jit`: each op applies the rule its docstring states (its
output is the reference's on the clamped values, never NaN), and `EJKERNEL_CHECKS=1` raises the eager error.

Rules: packed `cu_seqlens` (mean_pooling, flash_mla; the linear-attention family with the last bound set to
T): each bound clamped into [previous bound, T], the first to 0. flash_attention's `cum_seqlens_q/k`: each
row's length clamped into [0, S]; a `block_tables` entry outside the caches reads no keys. grouped_matmul:
sizes clamped to >= 0 with their running sum to M; an out-of-range `group_offset` owns no rows.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ejkernel.kernels._triton.grouped_matmul._interface import grouped_matmul_triton
from ejkernel.kernels._triton.mean_pooling._interface import mean_pooling_triton
from ejkernel.modules import (
    flash_attention,
    flash_mla,
    gated_delta_rule,
    gla_attention,
    grouped_matmul,
    mean_pooling,
    native_sparse_attention,
)
from ejkernel.modules.operations._common import require_lengths
from ejkernel.reference.flash_attention import flash_attention_reference
from ejkernel.reference.flash_mla import flash_mla_reference
from ejkernel.reference.grouped_matmul import grouped_matmul_reference
from ejkernel.reference.linear_attention import delta_rule_reference, gla_reference
from ejkernel.reference.mean_pooling import mean_pooling_reference
from ejkernel.reference.native_sparse_attention import native_sparse_attention_reference
from harness import assert_close, check_forward_and_grads, randn

T = 24
# (bad bounds, the clamped bounds of a packed axis of T tokens whose last bound may fall short of T)
PACKED = [
    ([0, 10, 30, 40], [0, 10, 24, 24]),  # past T: cut at T, the next sequence empty
    ([0, 15, 7, 20], [0, 15, 15, 20]),  # decreasing: held at the previous bound
    ([4, 9, 12, 24], [0, 9, 12, 24]),  # not from 0
    ([-5, -2, 6, 18], [0, 0, 6, 18]),  # negative
]


def _array(values):
    return jnp.asarray(values, jnp.int32)


@pytest.mark.parametrize("impl", ["xla", "triton"])
def test_mean_pooling_packed_bounds(impl):
    x = randn((T, 3, 5))
    pool = mean_pooling if impl == "xla" else functools.partial(mean_pooling_triton, interpret=True)
    jitted = jax.jit(pool)
    for bad, clamped in PACKED:
        out = jitted(x, _array(bad))
        assert_close(out, mean_pooling_reference(x, _array(clamped)))
    bad, clamped = PACKED[0]
    fn = lambda x: jitted(x, _array(bad))
    check_forward_and_grads(fn, lambda x: mean_pooling_reference(x, _array(clamped)), [x], (0,), jnp.float32)


def test_linear_attention_packed_bounds_end_at_the_last_token():
    """The family's bounds must end at T exactly: the last one is set to T."""
    q, k, v = (randn((1, T, 2, 16)) for _ in range(3))
    state = randn((3, 2, 16, 16), scale=0.1)
    g = -jax.nn.softplus(randn((1, T, 2, 16)))
    jitted = jax.jit(lambda cu: gla_attention(q, k, v, g, None, state, cu, return_state=True))
    for bad, clamped in PACKED:
        out, final = jitted(_array(bad))
        ref_out, ref_final = gla_reference(q, k, v, g, None, state, _array([*clamped[:-1], T]))
        assert_close(out, ref_out, tol=1e-4)
        assert_close(final, ref_final, tol=1e-4)


@pytest.mark.long
def test_native_sparse_packed_bounds_end_at_the_last_token():
    """NSA's bounds must end at T exactly, as the linear-attention family's: the last one is set to T. (Two of the
    cases: the eager reference takes some 9 s a case.)"""
    q, k, v = randn((1, T, 4, 16)), randn((1, T, 2, 16)), randn((1, T, 2, 16))
    g_cmp, g_slc = jax.nn.sigmoid(randn((2, 1, T, 4)))
    jitted = jax.jit(lambda cu: native_sparse_attention(q, k, v, g_cmp, g_slc, None, 2, cu, block_size=4))
    for bad, clamped in PACKED[:2]:
        reference = native_sparse_attention_reference(
            q, k, v, g_cmp, g_slc, None, 2, _array([*clamped[:-1], T]), block_size=4
        )
        assert_close(jitted(_array(bad)), reference, tol=1e-4)


def test_gated_delta_rule_takes_any_segment_ids():
    q, k, v = (randn((2, 16, 2, 16)) for _ in range(3))
    beta = jax.nn.sigmoid(randn((2, 16, 2)))
    seg = jnp.asarray(np.random.default_rng(0).integers(-3, 3, (2, 16)) * 2**29, jnp.int32)  # huge and negative
    out = jax.jit(lambda s: gated_delta_rule(q, k, v, beta, None, s))(seg)
    assert_close(out, delta_rule_reference(q, k, v, beta, None, None, seg)[0], tol=1e-4)


def test_flash_attention_lengths_and_page_tables():
    batch, q_len, heads, dim, blocks, block = 2, 16, 2, 8, 6, 4
    q = randn((batch, q_len, heads, dim))
    k_cache, v_cache = randn((blocks, block, heads, dim)), randn((blocks, block, heads, dim))
    jitted = jax.jit(lambda cq, ck, tables: flash_attention(q, k_cache, v_cache, None, cq, ck, None, tables))
    cases = [  # (cum_seqlens_q, clamped lengths), (cum_seqlens_k, clamped lengths), block tables
        (([0, 20, 30], [16, 10]), ([0, 16, 32], [16, 16]), [[0, -1, 2, 9], [5, 4, -7, 1]]),
        (([0, 5, 9], [5, 4]), ([3, 5, 30], [2, 16]), [[3, 1, 2, 0], [2, 2, 2, 2]]),
        (([0, 8, 3], [8, 0]), ([0, -4, 12], [0, 16]), [[6, 1, 2, 3], [2, 0, 2, 1]]),
    ]
    for (cq, q_lens), (ck, k_lens), tables in cases:
        tables = _array(tables)
        out = jitted(_array(cq), _array(ck), tables)
        pages = jnp.clip(tables, 0, blocks - 1)
        key, value = (c[pages].reshape(batch, -1, heads, dim) for c in (k_cache, v_cache))
        valid_keys = (jnp.arange(key.shape[1]) < _array(k_lens)[:, None]) & jnp.repeat(tables == pages, block, 1)
        q_seg = jnp.where(jnp.arange(q_len) < _array(q_lens)[:, None], 0, -1)
        ref = flash_attention_reference(
            q, key, value, q_segment_ids=q_seg, kv_segment_ids=jnp.where(valid_keys, 0, -1), softmax_scale=dim**-0.5
        )
        assert_close(out, ref)


def test_flash_mla_packed_bounds():
    batch, seq, heads, rank, nope = 1, T, 2, 16, 8
    query, key_value = randn((batch, seq, heads, nope)), randn((batch, seq, rank))
    w_kc, w_vc = randn((rank, 1, nope)), randn((rank, 1, 8))
    jitted = jax.jit(lambda cu: flash_mla(query, key_value, w_kc, w_vc, None, None, cu))
    for bad, clamped in PACKED:
        out = jitted(_array(bad))
        assert_close(out, flash_mla_reference(query, key_value, w_kc, w_vc, None, None, _array(clamped)))


M = 24
# (bad sizes, offset, the sizes and offset they come to) for an rhs holding 2 of 4 groups
GROUPS = [
    ([5, -3, 40, 2], 1, [5, 0, 19, 0], 1),  # negative size: 0; the running sum cut at M
    ([30, 2, 1, 1], 0, [24, 0, 0, 0], 0),
    ([5, 3, 4, 2], 3, [0, 0, 0, 0], 0),  # offset past G - L: no rows owned
    ([5, 3, 4, 2], -1, [0, 0, 0, 0], 0),
]


@pytest.mark.parametrize("impl", ["xla", "triton"])
def test_grouped_matmul_sizes_and_offset(impl):
    lhs, rhs, existing = randn((M, 16)), randn((2, 16, 32)), randn((M, 32))
    if impl == "xla":
        jitted = jax.jit(lambda lhs, rhs, sizes, offset, existing: grouped_matmul(lhs, rhs, sizes, offset, existing))
    else:
        jitted = jax.jit(functools.partial(grouped_matmul_triton, interpret=True))
    for sizes, offset, clamped, clamped_offset in GROUPS:
        out = jitted(lhs, rhs, _array(sizes), jnp.int32(offset), existing)
        assert_close(out, grouped_matmul_reference(lhs, rhs, _array(clamped), clamped_offset, existing))
    sizes, offset, clamped, clamped_offset = GROUPS[0]
    fn = lambda lhs, rhs: jitted(lhs, rhs, _array(sizes), jnp.int32(offset), existing)
    ref = lambda lhs, rhs: grouped_matmul_reference(lhs, rhs, _array(clamped), clamped_offset, existing)
    check_forward_and_grads(fn, ref, [lhs, rhs], (0, 1), jnp.float32)


def _bad_calls():
    """(name, call(bad value), bad value): each op with one bad value of one argument."""
    x, q = randn((T, 5)), randn((1, T, 2, 16))
    pages = randn((3, 8, 2, 16))
    mla = (randn((1, T, 2, 8)), randn((1, T, 16)), randn((16, 1, 8)), randn((16, 1, 8)))
    lhs, rhs = randn((M, 16)), randn((2, 16, 32))
    return [
        ("mean_pooling cu_seqlens", lambda cu: mean_pooling(x, cu), _array([0, 9, 30])),
        ("gla_attention cu_seqlens", lambda cu: gla_attention(q, q, q, None, None, None, cu), _array([0, 9, 20])),
        ("flash_attention cum_seqlens_q", lambda cu: flash_attention(q, q, q, None, cu), _array([0, 30])),
        (
            "flash_attention block_tables",
            lambda tables: flash_attention(q, pages, pages, None, None, None, None, tables),
            _array([[0, 2, -1]]),
        ),
        ("flash_mla cu_seqlens", lambda cu: flash_mla(*mla, None, None, cu), _array([0, 9, 4])),
        (
            "native_sparse_attention cu_seqlens",
            lambda cu: native_sparse_attention(q, q, q, q[..., 0], q[..., 0], None, 2, cu, block_size=4),
            _array([0, 9, 20]),
        ),
        ("grouped_matmul group_sizes", lambda sizes: grouped_matmul(lhs, rhs, sizes, 1), _array([5, -1, 3])),
        ("grouped_matmul group_offset", lambda offset: grouped_matmul(lhs, rhs, _array([5, 1, 3]), offset), 2),
        ("require_lengths", lambda lengths: require_lengths("kv_lengths", lengths, 2, 8), _array([3, 9])),
    ]


def test_checked_mode_raises_the_eager_error_under_jit(monkeypatch):
    monkeypatch.setenv("EJKERNEL_CHECKS", "1")
    for name, call, bad in _bad_calls():
        with pytest.raises(ValueError) as eager:
            call(bad)
        with pytest.raises(Exception, match=re.escape(str(eager.value))):
            jax.block_until_ready(jax.jit(call)(jnp.asarray(bad)))
        assert "is outside" in str(eager.value), name
