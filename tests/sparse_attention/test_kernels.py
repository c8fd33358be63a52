"""The sparse attention kernels: Pallas-Triton (interpret mode, and lowering for CUDA on this host) and Pallas
TPU (interpret mode, few grid steps) against the references; the GPU suite against XLA at realistic shapes."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sparse_cases import block_mask, qkv, sorted_segments

from ejkernel import kernel_registry
from ejkernel.kernels._pallas.tpu.blocksparse_attention import blocksparse_attention_tpu
from ejkernel.kernels._triton import blocksparse_attention as _triton_blocksparse
from ejkernel.kernels._triton import native_sparse_attention as _triton_native_sparse
from ejkernel.kernels._xla.blocksparse_attention import blocksparse_attention_xla
from ejkernel.kernels._xla.native_sparse_attention import native_sparse_attention_xla
from ejkernel.modules import (
    BlockSparseAttentionConfig,
    NativeSparseAttentionConfig,
    blocksparse_attention,
    native_sparse_attention,
)
from ejkernel.ops import BwdParams, FwdParams
from ejkernel.reference.blocksparse_attention import blocksparse_attention_reference
from ejkernel.reference.native_sparse_attention import native_sparse_attention_reference
from harness import check_forward_and_grads, randn

# Off a GPU the Triton kernels run only when interpretation is asked for (the lowering tests ask for none).
blocksparse_attention_triton = functools.partial(_triton_blocksparse.blocksparse_attention_triton, interpret=True)
native_sparse_attention_triton = functools.partial(_triton_native_sparse.native_sparse_attention_triton, interpret=True)

TILES = FwdParams(block_q=16, block_k=16)


def _check_blocksparse(impl, q, k, v, aux=None, bias=None, dtype=jnp.float32, **options):
    args = [q, k, v, aux, bias]
    argnums = tuple(i for i, a in enumerate(args) if a is not None)
    fn = jax.jit(lambda *a: impl(*a, fwd_params=TILES, **options))
    ref = jax.jit(lambda *a: blocksparse_attention_reference(*a, **options))
    check_forward_and_grads(fn, ref, args, argnums, dtype)


def test_triton_blocksparse_gqa_causal_bias_sinks_soft_cap():
    q, k, v = qkv(1, 4, 2, 37, 40, 16)
    _check_blocksparse(blocksparse_attention_triton, q, k, v, randn((4,)), randn((1, 4, 37, 40)), logits_soft_cap=3.0)


def test_triton_blocksparse_block_mask_empty_rows_segments_window_chunks():
    q, k, v = qkv(2, 2, 1, 40, 33, 16, value_dim=24, dtype=jnp.bfloat16)
    _check_blocksparse(
        blocksparse_attention_triton,
        q,
        k,
        v,
        randn((3,), jnp.bfloat16),
        dtype=jnp.bfloat16,
        causal=False,
        attention_mask=block_mask(2, 2, 40, 33, 16, empty_rows=(1,)),
        q_segment_ids=sorted_segments(2, 40, 2, pad=3),
        kv_segment_ids=sorted_segments(2, 33, 2, seed=1),
        sliding_window=(20, 9),
        chunk_size=24,
    )


def test_tpu_blocksparse_interpret_every_operand():
    """Grids of 1 x 2 x 3 x 3 steps (forward, dQ) and 1 x 1 x 3 x 2 x 3 (dK/dV)."""
    q, k, v = qkv(1, 2, 1, 40, 33, 16)
    _check_blocksparse(
        blocksparse_attention_tpu,
        q,
        k,
        v,
        randn((2,)),
        randn((1, 1, 40, 33)),
        logits_soft_cap=4.0,
        attention_mask=block_mask(1, 2, 40, 33, 8, density=0.7, seed=3),
        q_segment_ids=sorted_segments(1, 40, 2, pad=3),
        kv_segment_ids=sorted_segments(1, 33, 2, seed=1),
        chunk_size=30,
    )


def test_triton_native_sparse_packed_chosen_blocks_one_head_ratio_sliding_window():
    q, k, v = randn((1, 45, 3, 16)), randn((1, 45, 1, 16)), randn((1, 45, 1, 24))
    g, g_swa = randn((1, 45, 3)), randn((1, 45, 3))
    cu = jnp.array([0, 20, 21, 45], jnp.int32)
    options = dict(block_size=16, window_size=7)
    fn = jax.jit(lambda q, k, v, g, w: native_sparse_attention_triton(q, k, v, g, g, None, 2, cu, w, **options))
    ref = jax.jit(lambda q, k, v, g, w: native_sparse_attention_reference(q, k, v, g, g, None, 2, cu, w, **options))
    check_forward_and_grads(fn, ref, [q, k, v, g, g_swa], (0, 1, 2, 3, 4), jnp.float32)


@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")
def test_triton_kernels_lower_for_cuda(cuda_lowering):
    """Forward and backward of both ops lower to Triton for an H100 (compute capability 9.0) without a GPU."""
    q, k, v = qkv(1, 8, 2, 256, 256, 128, dtype=jnp.bfloat16)
    bias = randn((1, 8, 256, 256), jnp.bfloat16)
    mask = block_mask(1, 8, 256, 256, 32)
    sparse = lambda q, k, v, bias: blocksparse_attention_triton(
        q, k, v, None, bias, attention_mask=mask, chunk_size=100, logits_soft_cap=20.0, interpret=False
    )
    native = lambda q, k, v: native_sparse_attention_triton(
        *(jnp.swapaxes(x, 1, 2) for x in (q, k, v)), None, None, None, 4, interpret=False
    )
    for fn, args, names in ((sparse, (q, k, v, bias), "ejkernel_blocksparse"), (native, (q, k, v), "ejkernel_nsa")):
        train = lambda *a, fn=fn: jax.vjp(fn, *a)[1](fn(*a))
        text = jax.jit(train).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
        assert text.count(names) >= 3, names


# ---- GPU suite: the kernels against the XLA implementations at realistic shapes ----


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["causal window", "random blocks", "mask segments bias"])
def test_gpu_triton_blocksparse_matches_xla(case):
    q, k, v = qkv(2, 16, 4, 2048, 2048, 128, dtype=jnp.bfloat16)
    options = {
        "causal window": dict(sliding_window=(700, 0), softmax_aux=randn((16,))),
        "random blocks": dict(causal=False, mask_builder=_random_blocks(2048, 128, 0.25)),
        "mask segments bias": dict(
            attention_mask=jax.random.bernoulli(jax.random.PRNGKey(0), 0.8, (2, 1, 2048, 2048)),
            bias=randn((1, 16, 2048, 2048), jnp.bfloat16),
            chunk_size=1000,
        ),
    }[case]
    bias, aux = options.pop("bias", None), options.pop("softmax_aux", None)
    args = [q, k, v] + [x for x in (aux, bias) if x is not None]
    unpack = lambda a: (*a[:3], aux if aux is None else a[3], bias if bias is None else a[-1])
    triton = lambda *a: blocksparse_attention(*unpack(a), platform="triton", **options)
    xla = lambda *a: blocksparse_attention_xla(*unpack(a), **options)
    check_forward_and_grads(jax.jit(triton), jax.jit(xla), args, tuple(range(len(args))), jnp.bfloat16)


@pytest.mark.gpu
def test_gpu_triton_native_sparse_matches_xla_and_auto_takes_triton():
    assert kernel_registry.get("native_sparse_attention").__name__ == "native_sparse_attention_triton"
    # Computed block indices: float32, so that both sides select the same blocks (top-k on bfloat16
    # scores flips near-ties, which moves whole blocks in or out: 2% of the output, not the kernels' error).
    q, k, v = (randn((2, 4096, h, 128)) for h in (32, 2, 2))
    g = randn((2, 4096, 32))
    triton = lambda *a: native_sparse_attention(*a, None, 16, platform="triton")
    # Both sides at XLA's default precision, whose float32 products on a GPU are TF32 (the selection scores
    # too): agreement to TF32's rounding (an H100 run: 9e-4), not float32's.
    xla = lambda *a: native_sparse_attention_xla(*a, None, 16)
    args = [q, k, v, g, g]
    check_forward_and_grads(jax.jit(triton), jax.jit(xla), args, tuple(range(5)), jnp.float32, 2e-3, 4e-3)
    args = [x.astype(jnp.bfloat16) for x in (q, k, v)]
    cfg = NativeSparseAttentionConfig(bwd_params=BwdParams(num_warps=8))
    indices = jnp.asarray(np.random.default_rng(0).integers(-1, 128, (2, 4096, 2, 8)), jnp.int32)
    options = dict(block_size=32, cfg=cfg, platform="triton")
    triton = lambda q, k, v: native_sparse_attention(q, k, v, None, None, indices, 6, **options)
    xla = lambda q, k, v: native_sparse_attention_xla(q, k, v, None, None, indices, 6, block_size=32)
    check_forward_and_grads(jax.jit(triton), jax.jit(xla), args, (0, 1, 2), jnp.bfloat16)


@pytest.mark.gpu
def test_gpu_blocksparse_config_tiles():
    q, k, v = qkv(1, 8, 8, 4096, 4096, 64, dtype=jnp.bfloat16)
    cfg = BlockSparseAttentionConfig(fwd_params=FwdParams(block_q=64, block_k=64, num_warps=4, num_stages=2))
    fn = functools.partial(blocksparse_attention, sliding_window=(1000, 0), platform="triton", cfg=cfg)
    check_forward_and_grads(
        jax.jit(fn),
        jax.jit(functools.partial(blocksparse_attention_xla, sliding_window=(1000, 0))),
        [q, k, v],
        (0, 1, 2),
        jnp.bfloat16,
    )


def _random_blocks(length: int, block: int, density: float):
    """A mask builder of a random block pattern (positions alone: a constant block table)."""
    n = length // block
    tiles = np.random.default_rng(0).random((n, n)) < density
    return lambda i, j: tiles[np.asarray(i) // block, np.asarray(j) // block]
