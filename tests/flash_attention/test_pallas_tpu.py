"""Pallas Mosaic TPU flash attention against the float32 reference, in TPU interpret mode on CPU.

Small blocks (32) with lengths that are not block multiples, so each case runs several blocks,
partial blocks and the block-skipping paths, while grids stay small (TPU interpret mode costs about
10 ms per grid step); forward and every gradient (q, k, v, bias, sinks). Interpret mode fills
uninitialised buffers with NaN, so a tile the kernels forget to write fails `assert_close`.
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_cases import run_attention_case, segments
from ejkernel import Backend, Platform, kernel_registry
from ejkernel.kernels._common.attention_call import AttentionCall
from ejkernel.kernels._pallas.tpu.flash_attention import flash_attention as tpu  # the keyword form
from ejkernel.kernels._pallas.tpu.flash_attention._fwd import (
    TpuFlashStatic,
    block_state,
    kv_block_range,
    q_block_range,
)
from ejkernel.kernels._pallas.tpu.flash_attention._interface import flash_attention_tpu
from ejkernel.ops.config import BwdParams, FwdParams

run_case = functools.partial(run_attention_case, tpu, heads=2, kv_heads=1)


@pytest.mark.parametrize(
    "q_len, kv_len, heads, kv_heads, causal",
    [
        (100, 63, 2, 1, False),  # ragged lengths, MQA
        (1, 100, 2, 1, False),  # a single query row
        (63, 100, 4, 2, True),  # causal GQA, more keys than queries (top-left aligned)
    ],
)
def test_shapes(q_len, kv_len, heads, kv_heads, causal):
    run_case(q_len=q_len, kv_len=kv_len, heads=heads, kv_heads=kv_heads, causal=causal)


def test_sliding_window_both_sides():  # (causal windows: `test_all_features_together`)
    run_case(q_len=100, kv_len=100, sliding_window=(16, 8))


def test_soft_cap_with_fewer_keys_than_a_block():
    run_case(logits_soft_cap=2.0, causal=True, batch=2, q_len=63, kv_len=17)


def test_bias_per_batch_and_head():
    run_case(batch=2, q_len=63, kv_len=63, bias_shape=(2, 2, 63, 63), sliding_window=(20, 20))


def test_attention_mask_with_right_window():
    mask = jax.random.bernoulli(jax.random.PRNGKey(7), 0.6, (1, 2, 100, 63))
    run_case(mask=mask, sliding_window=(0, 33))


def test_dropout_matches_reference():
    """Same seed, same kept entries as the reference, forward and backward."""
    run_case(q_len=63, kv_len=100, dropout_prob=0.3, dropout_seed=jnp.asarray(1234, jnp.uint32), causal=True)


def test_fully_masked_rows_with_sinks_are_zero():
    """Rows with no allowed key (negative q segment, or no matching key) give 0 and finite grads,
    sinks or not."""
    q_seg = segments(1, 64, key=2).at[:, 20].set(-1).at[:, 40:48].set(7)  # segment 7 has no keys
    kv_seg = jnp.where(jnp.arange(64) < 33, q_seg, 0)
    fn, args = run_case(q_len=64, kv_len=64, segments=(q_seg, kv_seg), num_sinks=2, sliding_window=(32, 32))
    out = fn(*args)
    for row in (20, 40, 47):
        assert bool(jnp.all(out[0, row] == 0.0)), row


def test_all_features_together():
    """Causal + window + soft cap + sinks + segments (with padding) + bias + GQA in one call."""
    segs = segments(1, 100, pad=5, key=4)
    run_case(
        q_len=100,
        kv_len=100,
        heads=4,
        kv_heads=2,
        causal=True,
        sliding_window=(48, 0),
        logits_soft_cap=3.0,
        num_sinks=4,
        segments=(segs, segs),
        bias_shape=(1, 4, 100, 100),
        params=dict(fwd_params=FwdParams(block_q=32, block_k=64), bwd_params=BwdParams(block_q=64, block_k=32)),
    )


def test_bfloat16_head_dims_differ():
    run_case(dtype=jnp.bfloat16, head_dim=64, value_dim=32, causal=True, num_sinks=2)


def test_default_tiles():
    run_case(q_len=40, kv_len=70, params={}, causal=True)


def test_tile_bookkeeping_matches_masks():
    """Brute force over every tile of small padded shapes: a tile is run iff it holds an allowed pair,
    runs unmasked only if every pair is allowed, and the clamped index maps span exactly the first
    to the last tile that holds one (so skipped steps never fetch a block that is not used)."""
    windows = (None, (5, 3), (0, 40), (12, -4), (0, 0))
    for causal, window, q_len, kv_len, (bq, bk) in itertools.product(
        (False, True), windows, (9, 40), (17, 40), ((8, 8), (8, 16), (16, 8))
    ):
        st = TpuFlashStatic(
            softmax_scale=1.0,
            causal=causal,
            window=window,
            soft_cap=None,
            dropout_prob=0.0,
            q_len=q_len,
            kv_len=kv_len,
            num_heads=1,
            num_kv_heads=1,
            block_q=bq,
            block_k=bk,
            bwd_block_q=bq,
            bwd_block_k=bk,
            interpret=False,
        )
        q_pad, kv_pad = -(-q_len // 32) * 32, -(-kv_len // 32) * 32  # some blocks hold padding only
        i, j = np.arange(q_pad)[:, None], np.arange(kv_pad)[None, :]
        by_position = np.broadcast_to(j < kv_len, (q_pad, kv_pad))
        if causal:
            by_position = by_position & (j <= i)
        if window is not None:
            by_position = by_position & (j >= i - window[0]) & (j <= i + window[1])
        n_q, n_k = q_pad // bq, kv_pad // bk
        # [q block, k block]: holds an allowed pair (padding rows of a block that has real rows count too)
        used = by_position.reshape(n_q, bq, n_k, bk).any(axis=(1, 3)) & (np.arange(n_q) * bq < q_len)[:, None]
        where = (causal, window, q_len, kv_len, bq, bk)
        for qb, kb in itertools.product(range(n_q), range(n_k)):
            visible, interior = block_state(st, qb * bq, bq, kb * bk, bk, q_len_padded=q_pad, kv_len_padded=kv_pad)
            assert bool(visible) == bool(used[qb, kb]), (*where, qb, kb)
            if bool(visible) and bool(interior):
                assert by_position[qb * bq : (qb + 1) * bq, kb * bk : (kb + 1) * bk].all(), (*where, qb, kb)
        for qb in np.flatnonzero(used.any(axis=1)):
            lo, hi = kv_block_range(st, int(qb) * bq, bq, bk, n_k)
            assert (int(lo), int(hi)) == tuple(np.flatnonzero(used[qb])[[0, -1]]), (*where, qb)
        for kb in np.flatnonzero(used.any(axis=0)):
            lo, hi = q_block_range(st, int(kb) * bk, bk, bq, n_q)
            assert (int(lo), int(hi)) == tuple(np.flatnonzero(used[:, kb])[[0, -1]]), (*where, kb)


def test_registered_for_tpu_only():
    assert kernel_registry.get("flash_attention", Platform.PALLAS, Backend.TPU).__wrapped__ is flash_attention_tpu
    if jax.default_backend() != "tpu":
        assert all(i.fn is not flash_attention_tpu for i in kernel_registry.candidates("flash_attention"))


def test_refuses_what_it_cannot_serve():
    q = jnp.zeros((1, 8, 2, 32), jnp.float32)
    with pytest.raises(NotImplementedError):  # mixed dtypes
        tpu(q, q, q.astype(jnp.bfloat16), softmax_scale=1.0)
    half = q.astype(jnp.float16)
    with pytest.raises(NotImplementedError):  # no float16 on TPU
        tpu(half, half, half, softmax_scale=1.0)
    big = jnp.zeros((1, 8, 2, 512), jnp.float32)
    with pytest.raises(NotImplementedError):
        tpu(big, big, big, softmax_scale=1.0)
    with pytest.raises(NotImplementedError):
        tpu(q, q, q, softmax_scale=1.0, fwd_params=FwdParams(block_q=4))
    long = jnp.zeros((1, 1000, 1, 32), jnp.float32)
    with pytest.raises(NotImplementedError):  # compiled for a TPU, 32-wide key tiles break the lane tiling
        tpu(long, long, long, softmax_scale=1.0, fwd_params=FwdParams(32, 32), interpret=False)
    with pytest.raises(NotImplementedError):
        tpu(q, q, q, softmax_scale=1.0, bias=jnp.zeros((1, 2, 8, 8), jnp.float16))
    with pytest.raises(ValueError):
        tpu(q, jnp.zeros((1, 8, 3, 32)), jnp.zeros((1, 8, 3, 32)), softmax_scale=1.0)
    with pytest.raises(ValueError):  # a call built field by field: a rate without a seed
        flash_attention_tpu(q, q, q, None, None, AttentionCall(softmax_scale=1.0, dropout_prob=0.1))
