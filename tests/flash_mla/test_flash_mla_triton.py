"""flash_mla's Pallas-Triton kernel: interpret mode against the reference, CUDA lowering, GPU suite."""

import functools

import jax
import jax.numpy as jnp
import pytest

from ejkernel.kernels._triton.flash_mla._interface import flash_mla_triton
from ejkernel.kernels._xla.flash_mla._interface import flash_mla_xla
from ejkernel.modules import FlashMLAConfig, flash_mla
from ejkernel.ops import FwdParams
from ejkernel.reference.flash_mla import flash_mla_reference
from harness import assert_close, check_forward_and_grads, randn

H, HKV, RANK, NOPE, ROPE, DV = 4, 2, 32, 16, 8, 24
# 16 rows = 4 positions x 4 heads per program, 16 latent rows per step; the context split in pieces.
SMALL = FlashMLAConfig(fwd_params=FwdParams(block_q=16, block_k=16, num_warps=4, num_stages=2), num_splits=2)


def inputs(batch, q_len, kv_len, q_dim, dtype=jnp.float32):
    return [
        randn((batch, q_len, H, q_dim), dtype),
        randn((batch, kv_len, RANK), dtype),
        randn((RANK, HKV, NOPE), dtype, scale=RANK**-0.5),
        randn((RANK, HKV, DV), dtype, scale=RANK**-0.5),
    ]


def test_interpret_decode_with_sinks_and_splits():
    """One query position against 100 latent rows in three splits; sinks join where the splits meet."""
    q, kv, wk, wv = inputs(2, 1, 100, NOPE + ROPE)
    bk, sinks = randn((2, 100, ROPE)), randn((H,))
    cfg = FlashMLAConfig(fwd_params=FwdParams(block_k=16), num_splits=3)
    out = jax.jit(lambda *a: flash_mla_triton(*a, cfg=cfg, interpret=True, softmax_aux=sinks))(q, kv, wk, wv, None, bk)
    assert_close(out, flash_mla_reference(q, kv, wk, wv, None, bk, softmax_aux=sinks))


def test_interpret_prefill_packed_window_cap_and_training():
    """Decoupled RoPE, packed sequences (with padding), causal window, soft cap; gradients via the XLA path."""
    q, kv, wk, wv = inputs(1, 45, 45, NOPE, jnp.bfloat16)
    bq, bk = randn((1, 45, ROPE), jnp.bfloat16), randn((1, 45, ROPE), jnp.bfloat16)
    options = dict(cu_seqlens=jnp.array([0, 17, 40], jnp.int32), causal=True, sliding_window=(12, 0))
    options["logits_soft_cap"] = 4.0
    fn = jax.jit(lambda *a: flash_mla_triton(*a, cfg=SMALL, interpret=True, **options))
    ref = jax.jit(lambda *a: flash_mla_reference(*a, **options))
    check_forward_and_grads(fn, ref, [q, kv, wk, wv, bq, bk], tuple(range(6)), jnp.bfloat16)


def test_declines_bias_mask_and_dropout():
    q, kv, wk, wv = inputs(1, 8, 8, NOPE)
    for option in (
        dict(bias=jnp.zeros((1, 1, 8, 8))),
        dict(attention_mask=jnp.ones((1, 1, 8, 8), bool)),
        dict(dropout_prob=0.1, deterministic=False, dropout_rng=jax.random.PRNGKey(0)),
    ):
        with pytest.raises(NotImplementedError, match="triton flash_mla does not support"):
            flash_mla_triton(q, kv, wk, wv, interpret=True, **option)


@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")
def test_kernel_lowers_for_cuda(cuda_lowering):
    """Decode and packed causal prefill at DeepSeek shapes (rank 512, RoPE 64) lower for an H100."""
    shape = jax.ShapeDtypeStruct
    weights = [shape((512, 1, 128), jnp.bfloat16)] * 2
    for q_len, kv_len, options in ((1, 4096, {}), (512, 512, dict(causal=True, cu_seqlens=jnp.array([0, 300, 512])))):
        q, kv, bk = (shape(s, jnp.bfloat16) for s in ((4, q_len, 16, 192), (4, kv_len, 512), (4, kv_len, 64)))
        fn = lambda q, kv, wk, wv, bk, o=options: flash_mla_triton(q, kv, wk, wv, None, bk, interpret=False, **o)
        text = jax.jit(fn).trace(q, kv, *weights, bk).lower(lowering_platforms=("cuda",)).as_text()
        assert "ejkernel_flash_mla" in text


# ---- GPU suite: the kernel against the XLA implementation on the device ----


def _deepseek_inputs(batch, q_len, kv_len, dtype=jnp.bfloat16):
    """DeepSeek-V2-Lite attention: 16 heads, rank 512, d_nope 128, RoPE 64, Dv 128; query [nope | rope]."""
    return [
        randn((batch, q_len, 16, 192), dtype),
        randn((batch, kv_len, 512), dtype),
        randn((512, 1, 128), dtype, scale=512**-0.5),
        randn((512, 1, 128), dtype, scale=512**-0.5),
        None,
        randn((batch, kv_len, 64), dtype),
    ]


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [None, FlashMLAConfig(fwd_params=FwdParams(block_k=32), num_splits=1)])
def test_gpu_decode_matches_xla(cfg):
    args = _deepseek_inputs(64, 1, 8192)
    triton = jax.jit(functools.partial(flash_mla, platform="triton", cfg=cfg))
    assert_close(triton(*args), jax.jit(flash_mla_xla)(*args))


@pytest.mark.gpu
def test_gpu_prefill_matches_xla_forward_and_grads():
    args = _deepseek_inputs(2, 2048, 2048)
    given = [0, 1, 2, 3, 5]
    call = lambda impl: jax.jit(lambda *a: impl(*a[:4], None, a[4], causal=True, sliding_window=(1024, 0)))
    triton = call(functools.partial(flash_mla, platform="triton"))
    check_forward_and_grads(triton, call(flash_mla_xla), [args[i] for i in given], tuple(range(5)), jnp.bfloat16)
