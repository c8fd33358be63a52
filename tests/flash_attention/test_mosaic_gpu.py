"""Mosaic GPU flash attention on CPU: its kernels lower to Mosaic GPU for CUDA; off Hopper it declines.

The kernels themselves run only on a Hopper GPU (`test_gpu.py`); lowering them for CUDA here
catches shape, layout and barrier-bookkeeping errors of every code path without one.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from ejkernel.benchmarks.flash_attention import kernels_called
from ejkernel.kernels._common.attention_call import AttentionCall
from ejkernel.kernels._pallas.gpu.flash_attention._interface import (
    exp2_unless_empty,
    flash_attention_mosaic_gpu,
    mosaic_attention,
    plan,
)
from ejkernel.kernels._pallas.gpu.flash_attention._tiling import (
    ROWS,
    MosaicGpuFlashStatic,
    allowed,
    key_ranges,
    query_ranges,
)
from ejkernel.ops import BwdParams, FwdParams

# (query shape, key/value shape, options, sinks, (fwd block_k, dQ block_k, dK/dV block_q, stages) or None,
#  kernels: 3 = forward, dQ, dK/dV; 2 = forward and the fused backward)
CASES = {
    "plain": ((1, 256, 2, 128), (1, 256, 2, 128), {}, False, None, 3),
    "gqa-causal-odd-lengths-sinks": ((2, 300, 4, 64), (2, 200, 2, 64), {"causal": True}, True, None, 2),
    "window-both-sides": ((1, 512, 4, 128), (1, 512, 1, 128), {"sliding_window": (100, 20)}, False, None, 3),
    "soft-cap-causal": ((1, 384, 4, 128), (1, 384, 2, 128), {"causal": True, "soft_cap": 5.0}, True, None, 2),
    "soft-cap-small-tiles": ((1, 256, 2, 128), (1, 256, 2, 128), {"soft_cap": 30.0}, False, (64, 64, 64, 3), 3),
    "soft-cap-window-d64": (
        (1, 300, 2, 64),
        (1, 500, 1, 64),
        {"sliding_window": (64, 9), "soft_cap": 30.0},
        False,
        None,
        2,
    ),
    "big-tiles": ((1, 512, 2, 64), (1, 512, 2, 64), {"causal": True}, False, (256, 128, 128, 3), 3),
    "soft-cap-d64-default-wide-tiles": ((1, 300, 2, 64), (1, 600, 2, 64), {"soft_cap": 30.0}, False, None, 2),
    # a cap too large for the bounded forward: the running max, with the row sums tile rescaled
    "unbounded-cap-d64-sinks": ((2, 300, 4, 64), (2, 300, 2, 64), {"causal": True, "soft_cap": 80.0}, True, None, 2),
    # short causal calls at head dim 64 run two query tiles per CTA (see `test_which_calls_pair_query_tiles`)
    "paired-causal-d64-sinks": ((2, 1024, 4, 64), (2, 1024, 2, 64), {"causal": True}, True, None, 2),
    "paired-cap-d64-sq-ne-sk": ((1, 768, 4, 64), (1, 1000, 2, 64), {"causal": True, "soft_cap": 30.0}, True, None, 2),
    # head dim 128 without soft cap runs the overlapped forward: free-running ("plain") or taking
    # turns ("window-both-sides", and here with rows that own no key tile)
    "overlap-empty-rows-small-tiles": (
        (1, 700, 2, 128),
        (1, 200, 2, 128),
        {"sliding_window": (30, 0)},
        False,
        (64, 64, 64, 2),
        3,
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_forward_and_backward_lower_for_cuda(case):
    q_shape, kv_shape, options, sinks, tiles, kernels = CASES[case]
    params = {}
    if tiles:
        params = {
            "fwd_params": FwdParams(block_k=tiles[0], num_stages=tiles[3]),
            "bwd_params": BwdParams(block_k=tiles[1], block_q=tiles[2], num_stages=tiles[3]),
        }
    options = {"causal": False, "sliding_window": None, **options}

    def loss(q, k, v, aux):
        out = mosaic_attention(q, k, v, aux, softmax_scale=0.1, **options, **params)
        return jnp.sum(out.astype(jnp.float32))

    argnums = (0, 1, 2, 3) if sinks else (0, 1, 2)
    shapes = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in (q_shape, kv_shape, kv_shape)]
    aux = jax.ShapeDtypeStruct((q_shape[2],), jnp.float32) if sinks else None
    module = export.export(jax.jit(jax.value_and_grad(loss, argnums)), platforms=["cuda"])(*shapes, aux).mlir_module()
    assert module.count("@mosaic_gpu") == kernels
    assert kernels_called(module) == "pallas"  # how the flash_attention bench tells what auto ran


def _planned(q_len: int, head_dim: int, options: dict) -> MosaicGpuFlashStatic:
    """The `MosaicGpuFlashStatic` that `plan` chooses for a bf16 self-attention call of two heads."""
    q = jax.ShapeDtypeStruct((1, q_len, 2, head_dim), jnp.bfloat16)
    options = {"causal": False, "sliding_window": None, "fwd_params": None, **options}
    return plan(q, q, q, None, softmax_scale=0.1, bwd_params=None, **options)[0]


@pytest.mark.parametrize(
    "q_len, head_dim, options, paired",
    [
        (1024, 64, {"causal": True}, True),
        (768, 64, {"causal": True, "soft_cap": 30.0}, True),
        (2048, 64, {"causal": True}, True),
        (8192, 64, {"causal": True}, False),  # long CTAs: the pairing measured slower
        (640, 64, {"causal": True}, False),  # an odd number of 128-row tiles
        (1024, 64, {"causal": True, "sliding_window": (100, 0)}, False),  # windowed CTAs do equal work
        (1024, 64, {}, False),
        (1024, 128, {"causal": True}, False),
        (1024, 64, {"causal": True, "fwd_params": FwdParams(block_k=256, num_stages=3)}, False),  # no room
    ],
)
def test_which_calls_pair_query_tiles(q_len, head_dim, options, paired):
    assert _planned(q_len, head_dim, options).q_tiles_per_cta == (2 if paired else 1)


@pytest.mark.parametrize(
    "head_dim, options, prescaled",
    [
        (128, {"soft_cap": 30.0}, True),
        (64, {"soft_cap": 30.0, "causal": True}, True),
        (64, {"soft_cap": 30.0}, False),  # non-causal at head dim 64: measured no faster
        (128, {"soft_cap": 80.0}, False),  # too large a cap for the bounded forward, which the prescale serves
        (128, {}, False),
    ],
)
def test_which_calls_prescale_q(head_dim, options, prescaled):
    assert _planned(1024, head_dim, options).q_prescaled == prescaled


def test_exp2_on_fma_units_matches_exp2():
    """The cubic exp2 the forward runs on part of each soft-capped tile (eager ops: see `exp2_fma`)."""
    from ejkernel.kernels._pallas.gpu.flash_attention._parts import exp2_fma

    x = np.concatenate([np.linspace(-125.0, 127.0, 20011), -np.abs(np.random.default_rng(0).normal(0, 9, 4096))])
    with jax.disable_jit():
        got = np.asarray(exp2_fma(jnp.asarray(x, jnp.float32)), np.float64)
    np.testing.assert_allclose(got, np.exp2(x), rtol=8e-5)
    with jax.disable_jit():
        within = np.asarray(exp2_fma(jnp.asarray(x[:20011], jnp.float32), in_range=True), np.float64)
    np.testing.assert_allclose(within, np.exp2(x[:20011]), rtol=8e-5)
    with jax.disable_jit():
        assert 0 < float(exp2_fma(jnp.float32(-jnp.inf))) < 2.0**-125


def test_declines_what_it_cannot_serve():
    q = jnp.ones((1, 128, 2, 128), jnp.bfloat16)
    with pytest.raises(NotImplementedError, match="dropout"):
        flash_attention_mosaic_gpu(q, q, q, None, None, AttentionCall.of(q, dropout_prob=0.1, dropout_seed=1))
    with pytest.raises(NotImplementedError, match="Hopper"):
        flash_attention_mosaic_gpu(q, q, q, None, None, AttentionCall(softmax_scale=1.0))
    with pytest.raises(NotImplementedError, match="head dims"):
        mosaic_attention(q[..., :96], q[..., :96], q[..., :96], softmax_scale=1.0, causal=False, sliding_window=None)
    with pytest.raises(NotImplementedError, match="float32"):
        x = q.astype(jnp.float32)
        mosaic_attention(x, x, x, softmax_scale=1.0, causal=False, sliding_window=None)


def allowed_or_all(st, rows, cols):
    """The kernels' mask predicate at absolute positions, all True where it needs no mask."""
    ok = allowed(st, cols - rows, cols, 0, 0)
    return True if ok is None else ok


def _tile_sets(ranges, n):
    lo, hi, full_lo, full_hi = (int(x) for x in ranges)
    assert 0 <= lo <= full_lo <= full_hi <= hi <= n
    return set(range(lo, hi)), set(range(full_lo, full_hi))


@pytest.mark.parametrize("seed", range(4))
def test_tile_ranges_cover_every_allowed_pair_and_full_tiles_need_no_mask(seed):
    """The kernels' tile bounds, checked against `allowed` pair by pair on random masks and lengths."""
    rng = np.random.default_rng(seed)
    for _ in range(12):
        q_len, kv_len = (int(x) for x in rng.integers(1, 400, 2))
        window = None if rng.random() < 0.3 else tuple(int(x) for x in rng.choice([0, 1, 37, 64, 100, 1000], 2))
        block = int(rng.choice([64, 128, 256]))
        tiles = dict(block_k=block, stages=2, block_k_dq=64, block_q_dkv=64, stages_bwd=2)
        causal = bool(rng.random() < 0.5)
        st = MosaicGpuFlashStatic(
            **tiles,
            softmax_scale=1.0,
            soft_cap=None,
            causal=causal,
            window=window,
            q_len=q_len,
            kv_len=kv_len,
            num_heads=1,
            num_kv_heads=1,
        )
        q_pad, kv_pad = -(-q_len // 128) * 128, -(-kv_len // max(128, block)) * max(128, block)
        rows, cols = np.arange(q_pad)[:, None], np.arange(kv_pad)[None, :]
        ok = np.broadcast_to(np.asarray(allowed_or_all(st, rows, cols)), (q_pad, kv_pad))
        want = (cols < kv_len) & ((cols <= rows) if causal else True)
        if window is not None:
            want = want & (cols >= rows - window[0]) & (cols <= rows + window[1])
        assert kv_pad == st.kv_len_padded and (ok == want).all()
        key_tile = np.arange(kv_pad) // block
        for row0 in range(0, q_pad, ROWS):  # forward / dQ: key tiles of 64 query rows
            needed, full = _tile_sets(key_ranges(st, jnp.int32(row0), ROWS, block, kv_pad // block), kv_pad // block)
            band = ok[row0 : row0 + ROWS]
            assert set(key_tile[band.any(axis=0)]) <= needed
            assert all(band[:, key_tile == t].all() for t in full)
        # the dK/dV kernel never masks padded keys (their gradients are dropped)
        ok_keys = np.broadcast_to(
            np.asarray(allowed_or_all(dataclasses.replace(st, kv_len=kv_pad), rows, cols)), ok.shape
        )
        q_tile = np.arange(q_pad) // 64
        for col0 in range(0, kv_pad, ROWS):  # dK/dV: query tiles of 64 key rows
            needed, full = _tile_sets(query_ranges(st, jnp.int32(col0), ROWS, 64, q_pad // 64), q_pad // 64)
            band = ok_keys[:, col0 : col0 + ROWS]
            assert set(q_tile[band.any(axis=1)]) <= needed
            assert all(band[q_tile == t].all() for t in full)


def test_empty_rows_with_minus_inf_sinks_stay_finite():
    lse = jnp.array([-jnp.inf, 2.0])
    with_sinks = jnp.logaddexp2(lse, -jnp.inf)
    assert np.isfinite(np.asarray(exp2_unless_empty(lse - with_sinks, with_sinks))).all()
