"""The Mosaic GPU MLA serving kernel: CUDA lowering and interpret mode on this CPU host, declines, GPU suite.

Lowering for CUDA (DeepSeek's widths) catches layout, TMA and shared-memory-budget errors; Mosaic GPU interpret
mode runs the kernel's warpgroups, barriers, TMA copies and (synchronous) wgmma on the CPU against the
reference, with race detection, at 16, 64 or 128 heads and small latent widths: several splits of a span of 2-4
blocks, a sliding window that starts inside a block, tokens of no sequence (empty spans), pages of one and of
two blocks, prefill tokens (each its own tile; at 16 heads four to a tile, each row masked by its own query's
position), both schedules (`shared_scores`), P in the r tiles or its own.
Layouts, swizzles and wgmma's asynchrony only the GPU suite checks.
"""

import functools

import jax
import jax.numpy as jnp
import pytest
from test_mla_ragged_paged import make_case

from ejkernel import kernel_registry
from ejkernel.kernels._pallas.gpu.multi_latent_ragged_page_attention import (
    multi_latent_ragged_page_attention_mosaic_gpu,
)
from ejkernel.kernels._pallas.gpu.multi_latent_ragged_page_attention._interface import mosaic_latent_paged
from ejkernel.kernels._pallas.gpu.multi_latent_ragged_page_attention._kernel import MosaicGpuLatentPagedTiling
from ejkernel.modules import multi_latent_ragged_page_attention, multi_latent_ragged_page_attention_v2
from ejkernel.reference.multi_latent_ragged_page_attention import multi_latent_ragged_page_attention_reference
from harness import assert_close, randn
from mosaic_gpu_interpret import check_in_fresh_process, interpret_mode

OPS = ("multi_latent_ragged_page_attention", "multi_latent_ragged_page_attention_v2")
BF16 = jnp.bfloat16


def deepseek_case(q_lens=(1, 1, 0, 1, 1), kv_lens=(70, 64, 3, 9, 4), pages_per_seq=2, heads=128):
    return make_case(BF16, BF16, q_lens, kv_lens, pages_per_seq, heads=heads, page=64, latent=512, rope=64)


@pytest.mark.parametrize(
    "tiling, heads",
    [(None, 128), (MosaicGpuLatentPagedTiling(num_splits=3, stages=2, shared_scores=True), 128), (None, 16)],
    ids=["own", "shared", "16 heads"],
)
def test_kernel_lowers_for_cuda(tiling, heads):
    """DeepSeek's widths (latent 512, RoPE 64, 128 heads or a shard's 16, page 64), in both schedules: the query
    tiles and two cache blocks fit shared memory (Mosaic checks the budget as it lowers)."""
    call = jax.jit(functools.partial(mosaic_latent_paged, tiling=tiling))
    text = call.trace(*deepseek_case(heads=heads)).lower(lowering_platforms=("cuda",)).as_text()
    assert "mosaic_gpu" in text


# ---- interpret mode ----

INTERPRET_CASES = {
    # shape of `make_case`, options, tiling
    "64 heads, window inside a block, soft cap, 3 splits, 3 stages": (
        dict(q_lens=(1, 0, 1), kv_lens=(150, 3, 100), pages_per_seq=3, heads=64, page=64, latent=128, rope=64),
        dict(sliding_window=70, logits_soft_cap=3.0),
        MosaicGpuLatentPagedTiling(num_splits=3, stages=3),
    ),
    "16 heads (4 queries a tile), prefill chunks, window inside a block, 2 splits": (
        dict(q_lens=(1, 6, 0, 3), kv_lens=(100, 150, 3, 70), pages_per_seq=3, heads=16, page=64, latent=128, rope=64),
        dict(sliding_window=90),
        MosaicGpuLatentPagedTiling(num_splits=2, stages=2, shared_scores=True),
    ),
    "shared scores, 128 heads, pages of 2 blocks, no RoPE, prefill tokens, q/k/v scales, gradients": (
        dict(q_lens=(1, 2), kv_lens=(250, 100), pages_per_seq=2, heads=128, page=128, latent=128, rope=0),
        dict(q_scale=0.5, k_scale=1.5, v_scale=2.0),
        MosaicGpuLatentPagedTiling(num_splits=1, stages=3, shared_scores=True),
    ),
}


def interpret_check(case: str) -> None:
    """`INTERPRET_CASES[case]` in interpret mode against the reference (AssertionError): the output and, where the
    case says so, the gradient with respect to both query parts (the plain-JAX core's backward: this checks the
    wiring); a race shows as "RACE DETECTED" on stdout."""
    shape, options, tiling = INTERPRET_CASES[case]
    args = make_case(BF16, BF16, **shape)
    cotangent = randn(args[0].shape)

    def run(op, q_nope, q_pe):
        out, cache = op(q_nope, q_pe, *args[2:], **options)
        return out.astype(jnp.float32), cache

    kernel = functools.partial(run, functools.partial(mosaic_latent_paged, tiling=tiling))
    ref = functools.partial(run, multi_latent_ragged_page_attention_reference)
    with interpret_mode():
        if "gradients" in case:
            (out, cache), vjp = jax.vjp(kernel, *args[:2])
            grads = vjp((cotangent, jnp.zeros_like(cache)))
        else:
            out, cache = kernel(*args[:2])
        out, cache = jax.block_until_ready((out, cache))
    (ref_out, ref_cache), ref_vjp = jax.vjp(ref, *args[:2])
    assert_close(out, ref_out, BF16)
    assert bool(jnp.array_equal(cache, ref_cache)), "the cache holds exactly the reference's writes"
    if "gradients" in case:
        for g, rg in zip(grads, ref_vjp((cotangent, jnp.zeros_like(ref_cache))), strict=True):
            assert_close(g, rg, BF16)


@pytest.mark.long
def test_interpret_mode_matches_reference():
    """`interpret_check` of every case, in one fresh Python process (started again if the interpreter hangs)."""
    check_in_fresh_process(__file__, INTERPRET_CASES)


# ---- what it serves ----


def test_registered_first_for_gpus():
    for op in OPS:
        assert [i.platform.value for i in kernel_registry.candidates(op, backend="gpu")] == ["pallas", "triton", "xla"]
        assert kernel_registry.get(op, "pallas", "gpu") is multi_latent_ragged_page_attention_mosaic_gpu


def _declines(args, words, **options):
    with pytest.raises(NotImplementedError, match=words):
        mosaic_latent_paged(*args, **options)


def test_declines_what_it_cannot_serve():
    small = dict(heads=64, page=64, latent=128, rope=64)
    args = make_case(BF16, BF16, (1, 1), (5, 9), 1, **small)
    with pytest.raises(NotImplementedError, match="needs a Hopper GPU"):
        multi_latent_ragged_page_attention_mosaic_gpu(*args)
    _declines(make_case(jnp.float32, BF16, (1, 1), (5, 9), 1, **small), "all bfloat16 or all float16, got")
    float8 = [*args[:4], args[4].astype(jnp.float8_e4m3fn), *args[5:]]
    _declines(float8, "all bfloat16 or all float16, got bfloat16/bfloat16/float8_e4m3fn")
    _declines(args, "no per-row cache scales", kv_cache_scales=jnp.ones(args[4].shape[:3], jnp.float32))
    _declines(
        make_case(BF16, BF16, (1, 1), (5, 9), 1, heads=48, page=64, latent=128, rope=64), "divisors of 64, got 48"
    )
    _declines(make_case(BF16, BF16, (1, 1), (5, 9), 1, heads=64, page=64, latent=96, rope=64), "got 96")
    _declines(make_case(BF16, BF16, (1, 1), (5, 9), 1, heads=64, page=64, latent=1024, rope=64), "got 1024")
    _declines(make_case(BF16, BF16, (1, 1), (5, 9), 1, heads=64, page=64, latent=128, rope=32), "RoPE widths")
    _declines(make_case(BF16, BF16, (1, 1), (5, 9), 2, heads=64, page=16, latent=128, rope=64), "positions, got 16")
    _declines(args, "stages >= 2", tiling=MosaicGpuLatentPagedTiling(num_splits=1, stages=1))
    deepseek = deepseek_case()
    _declines(deepseek, "shared memory", tiling=MosaicGpuLatentPagedTiling(num_splits=1, stages=3))


# ---- GPU suite: the kernel against the XLA implementation at DeepSeek's widths ----

GPU_SHAPES = {
    "decode 8 x 2048": dict(q_lens=(1,) * 8 + (1,), kv_lens=(2048,) * 7 + (1500, 64)),
    "mixed prefill + decode": dict(q_lens=(1,) * 6 + (256, 77, 1), kv_lens=(2048,) * 6 + (2048, 700, 64)),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", GPU_SHAPES)
@pytest.mark.parametrize("op", OPS)
def test_gpu_matches_xla(name, op):
    """Each op through its public function (v1 whole contexts, v2 with a sliding window), then with 3 splits, and
    in the shared-scores schedule with 1 and 2; `auto` takes this kernel on a Hopper GPU."""
    args = make_case(BF16, BF16, **GPU_SHAPES[name], pages_per_seq=32, heads=128, page=64, latent=512, rope=64)
    public = {OPS[0]: multi_latent_ragged_page_attention, OPS[1]: multi_latent_ragged_page_attention_v2}[op]
    options = {"sliding_window": 1024} if op == OPS[1] else {}
    fn = lambda platform: jax.jit(lambda *a: public(*a, platform=platform, **options))
    out, cache = fn("pallas")(*args)
    ref_out, ref_cache = fn("xla")(*args)
    assert_close(out, ref_out, BF16)
    assert bool(jnp.array_equal(cache, ref_cache))
    for splits, shared in ((3, False), (1, True), (2, True)):
        tiling = MosaicGpuLatentPagedTiling(num_splits=splits, stages=2, shared_scores=shared)
        split_out, _ = jax.jit(functools.partial(mosaic_latent_paged, tiling=tiling, **options))(*args)
        assert_close(split_out, ref_out, BF16)
    assert kernel_registry.candidates(op, backend="gpu")[0].platform.value == "pallas"


@pytest.mark.gpu
def test_gpu_sixteen_heads_matches_xla():
    """A tensor-parallel shard's 16 heads (four queries to a tile): mixed prefill and decode, with a window and 2
    splits, against XLA."""
    args = make_case(BF16, BF16, **GPU_SHAPES["mixed prefill + decode"], pages_per_seq=32, heads=16, page=64,
                     latent=512, rope=64)  # fmt: skip
    for options in ({}, {"sliding_window": 300}):
        ref_out, ref_cache = jax.jit(lambda *a, o=options: multi_latent_ragged_page_attention(*a, platform="xla", **o))(
            *args
        )
        tiling = MosaicGpuLatentPagedTiling(num_splits=2, stages=2, shared_scores=True)
        out, cache = jax.jit(functools.partial(mosaic_latent_paged, tiling=tiling, **options))(*args)
        assert_close(out, ref_out, BF16)
        assert bool(jnp.array_equal(cache, ref_cache))


def test_config_tiling_reaches_the_kernel_and_is_checked():
    """`mosaic_tiling` sets the fields it names (the rest the kernel's own), and bad fields are one-line errors."""
    from ejkernel.kernels._pallas.gpu.multi_latent_ragged_page_attention._interface import OWN_TILING, plan
    from ejkernel.modules import MultiLatentRaggedPageAttentionConfig as Config
    from ejkernel.modules import MultiLatentRaggedPageAttentionMosaicTiling as Tiling

    cfg = Config(platform="pallas", mosaic_tiling=Tiling(num_splits=3, shared_scores=False))
    chosen = tuple(sorted(cfg.mosaic_tiling.overrides().items()))
    assert plan(None, None, chosen) == MosaicGpuLatentPagedTiling(
        **{**OWN_TILING, "num_splits": 3, "shared_scores": False}
    )
    with pytest.raises(ValueError, match="stages must be an int of at least 2, got 1"):
        Tiling(stages=1)
    with pytest.raises(ValueError, match="mosaic_tiling must be a MultiLatentRaggedPageAttentionMosaicTiling"):
        Config(mosaic_tiling=MosaicGpuLatentPagedTiling(num_splits=1, stages=2))
