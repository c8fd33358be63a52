"""The Pallas-Triton MLA serving kernel: interpret mode against the reference, CUDA lowering, declines, GPU suite.

Interpret-mode cases (the cases of `test_mla_ragged_paged`: decode, prefill, empty and ignored sequences,
off-cache table entries, padded latent rows) use 16-row tiles and two splits, so each call runs several key
steps per split and merges splits by log-sum-exp; pages of 4 positions take the per-position table lookup,
pages of 16 the one-entry-per-step lookup.
"""

import functools

import jax
import jax.numpy as jnp
import pytest
from test_mla_ragged_paged import make_case

from ejkernel import kernel_registry
from ejkernel.kernels._triton.multi_latent_ragged_page_attention import multi_latent_ragged_page_attention_triton
from ejkernel.modules import (
    MultiLatentRaggedPageAttentionConfig,
    MultiLatentRaggedPageAttentionTritonTiling,
    MultiLatentRaggedPageAttentionV2Config,
    multi_latent_ragged_page_attention,
    multi_latent_ragged_page_attention_v2,
)
from ejkernel.reference.multi_latent_ragged_page_attention import multi_latent_ragged_page_attention_reference
from harness import assert_close, randn

pytestmark = pytest.mark.filterwarnings("ignore:The Pallas Triton")
OPS = ("multi_latent_ragged_page_attention", "multi_latent_ragged_page_attention_v2")
SMALL = MultiLatentRaggedPageAttentionTritonTiling(block_h=16, block_k=16, num_splits=2)
interpreted = functools.partial(multi_latent_ragged_page_attention_triton, interpret=True)


def check(args, options, cfg, tol=None):
    out, cache = interpreted(*args, cfg=cfg, **options)
    ref_out, ref_cache = multi_latent_ragged_page_attention_reference(*args, **options)
    assert out.dtype == args[0].dtype and cache.dtype == args[4].dtype
    float8 = jnp.dtype(args[4].dtype).itemsize == 1  # kernel and reference read the same float8 values
    assert_close(out, ref_out, args[0].dtype if float8 else args[4].dtype, tol)
    assert bool(jnp.array_equal(cache, ref_cache)), "the cache holds exactly the reference's writes"


CASES = {
    "mixed f32, window, soft cap, page 4": (
        dict(),
        {"sliding_window": 3, "logits_soft_cap": 2.0},
        MultiLatentRaggedPageAttentionConfig(triton_tiling=SMALL),
    ),
    "mixed bf16, q/k/v scales, page 16, v2 config": (
        dict(cache_dtype=jnp.bfloat16, dtype=jnp.bfloat16, page=16, pages_per_seq=2),
        {"q_scale": 0.3, "k_scale": 1.5, "v_scale": 2.0, "softmax_scale": 0.2, "logits_soft_cap": -3.0},
        MultiLatentRaggedPageAttentionV2Config(num_queries_per_block=(1, 8, 4), triton_tiling=SMALL),
    ),
    "decode, float8 cache, bf16 queries, q/k scales": (
        dict(cache_dtype=jnp.float8_e4m3fn, dtype=jnp.bfloat16, q_lens=(1, 1, 0, 1, 1), page=16, pages_per_seq=2),
        {"q_scale": 0.5, "k_scale": 1.5, "v_scale": 0.75},
        MultiLatentRaggedPageAttentionConfig(triton_tiling=SMALL),
    ),
    "decode, 32 heads in two programs, page 16": (
        dict(q_lens=(1, 1, 0, 1, 1), kv_lens=(37, 20, 5, 50, 4), heads=32, page=16),
        {},
        MultiLatentRaggedPageAttentionConfig(triton_tiling=SMALL),
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_matches_reference(case):
    shape, options, cfg = CASES[case]
    check(make_case(**shape), options, cfg)


def test_default_tiling_and_gradients():
    """The kernel's own tiling (one split of 32-row steps here); `jax.grad` through it (the plain-JAX core's
    backward) equals the reference's."""
    args = make_case(q_lens=(1, 3, 0, 2, 1))
    check(args, {}, None)
    cotangent = randn(args[0].shape)

    def loss(op, q_nope, q_pe):
        return jnp.sum(op(q_nope, q_pe, *args[2:], sliding_window=4)[0] * cotangent)

    grads = jax.jit(jax.grad(functools.partial(loss, interpreted), argnums=(0, 1)))(args[0], args[1])
    ref = multi_latent_ragged_page_attention_reference
    for g, rg in zip(grads, jax.grad(functools.partial(loss, ref), argnums=(0, 1))(args[0], args[1]), strict=True):
        assert_close(g, rg, tol=1e-4)


def test_registered_first_for_gpus():
    for op in OPS:
        assert [i.platform.value for i in kernel_registry.candidates(op, backend="gpu")] == ["pallas", "triton", "xla"]
        assert kernel_registry.get(op, "triton", "gpu").__name__ == "multi_latent_ragged_page_attention_triton"


def test_kernel_lowers_for_cuda(cuda_lowering):
    """The kernel lowers to Triton IR for an H100 at DeepSeek's widths (latent 512, RoPE 64, 128 heads, page
    64), without a GPU: bf16 with its own tiling, float32 with steps longer than a page (per-position lookup)."""
    steps = MultiLatentRaggedPageAttentionConfig(triton_tiling=MultiLatentRaggedPageAttentionTritonTiling(block_k=128))
    for dtype, cfg in ((jnp.bfloat16, None), (jnp.float32, steps)):
        args = make_case(dtype, dtype, (1, 2, 0, 1, 1), (70, 64, 3, 9, 4), 2, heads=128, page=64, latent=512, rope=64)
        call = functools.partial(multi_latent_ragged_page_attention_triton, interpret=False, cfg=cfg)
        text = jax.jit(call).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
        assert "ejkernel_mla_paged_attention" in text, dtype


def test_declines_what_it_cannot_serve():
    args = make_case(q_lens=(1, 1, 0, 1, 1))
    int8 = [*args[:4], args[4].astype(jnp.int8), *args[5:]]
    with pytest.raises(NotImplementedError, match="float8/16/32 caches, got int8"):
        interpreted(*int8)
    wide = make_case(q_lens=(1, 1, 0, 1, 1), latent=1100, rope=16)
    with pytest.raises(NotImplementedError, match="latent widths up to 1024, got 1100"):
        interpreted(*wide)
    with pytest.raises(ValueError, match=r"TritonTiling\.block_k must be a power of two of at least 16, got 8"):
        MultiLatentRaggedPageAttentionTritonTiling(block_k=8)
    with pytest.raises(ValueError, match="triton_tiling must be a MultiLatentRaggedPageAttentionTritonTiling"):
        MultiLatentRaggedPageAttentionConfig(triton_tiling={"block_k": 16})


# ---- GPU suite: the kernel against the XLA implementation at DeepSeek's widths ----

GPU_SHAPES = {
    "decode 8 x 2048": dict(q_lens=(1,) * 8 + (1,), kv_lens=(2048,) * 7 + (1500, 64)),
    "mixed prefill + decode": dict(q_lens=(1,) * 6 + (256, 77, 1), kv_lens=(2048,) * 6 + (2048, 700, 64)),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", GPU_SHAPES)
@pytest.mark.parametrize("op", OPS)
def test_gpu_matches_xla(name, op):
    """Each op through its public function (v1 whole contexts, v2 with a sliding window), then with 3 splits."""
    args = make_case(
        jnp.bfloat16, jnp.bfloat16, **GPU_SHAPES[name], pages_per_seq=32, heads=128, page=64, latent=512, rope=64
    )
    public = {OPS[0]: multi_latent_ragged_page_attention, OPS[1]: multi_latent_ragged_page_attention_v2}[op]
    options = {"sliding_window": 1024} if op == OPS[1] else {}
    fn = lambda platform: jax.jit(lambda *a: public(*a, platform=platform, **options))
    out, cache = fn("triton")(*args)
    ref_out, ref_cache = fn("xla")(*args)
    assert_close(out, ref_out, jnp.bfloat16)
    assert bool(jnp.array_equal(cache, ref_cache))
    cfg = MultiLatentRaggedPageAttentionConfig(triton_tiling=MultiLatentRaggedPageAttentionTritonTiling(num_splits=3))
    split_out, _ = kernel_registry.get(op, "triton", "gpu")(*args, cfg=cfg, **options)
    assert_close(split_out, ref_out, jnp.bfloat16)
