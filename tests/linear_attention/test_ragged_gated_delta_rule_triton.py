"""`ragged_gated_delta_rule` on the Triton platform: interpret mode on CPU against the reference (and the XLA
implementation where a slot is out of range: the reference has no such rule), CUDA lowering, GPU suite.

Interpret-mode cases stay small: head dims 16 and 32 (the smallest the Triton matmuls take), two heads, value
tiles of 16 columns (two per state), chunks of 16.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from linear_cases import log_decay, write_strength

from ejkernel.kernels._common.linear_attention.ragged import requests
from ejkernel.kernels._triton.ragged_gated_delta_rule import chunked_requests, ragged_gated_delta_rule_triton
from ejkernel.kernels._xla.ragged_gated_delta_rule import ragged_gated_delta_rule_xla
from ejkernel.modules import RaggedGatedDeltaRuleConfig, ragged_gated_delta_rule
from ejkernel.ops import FwdParams
from ejkernel.reference.ragged_gated_delta_rule import ragged_gated_delta_rule_reference
from harness import assert_close, copies_in, randn

T, H, DK, DV, SLOTS = 48, 2, 16, 32, 9
CFG = RaggedGatedDeltaRuleConfig(chunk_size=16, fwd_params=FwdParams(block_d=16))
# Padding tokens 0-2 and 45-47; requests of 13 tokens, 1, 0 (its slot 0 also request 1's), 21, 1, 6, 0.
QSL = np.array([3, 16, 17, 17, 38, 39, 45, 45], np.int32)
SLOT_OF = np.array([4, 0, 0, 7, 2, 5, 6], np.int32)
# Decode only: padding tokens 0, 1, 7; request 4 shares slot 3 with request 1 (it reads, request 1 writes);
# request 2 is empty; request 5's slot is outside the pool (dropped).
DECODE_QSL = np.array([2, 3, 4, 4, 5, 6, 7], np.int32)
DECODE_SLOTS = np.array([1, 3, 8, 0, 3, 12], np.int32)
# Fewer tokens (8) than a chunk (16): padding tokens 0 and 7; requests of 3 tokens, 1, 0 and 2.
SHORT_QSL = np.array([1, 4, 5, 5, 7], np.int32)
SHORT_SLOTS = np.array([2, 3, 0, 6], np.int32)


def make_inputs(num_tokens=T, dtype=jnp.float32, decay=True):
    return (
        randn((num_tokens, H, DK), dtype),
        randn((num_tokens, H, DK), dtype),
        randn((num_tokens, H, DV), dtype),
        write_strength(num_tokens, H).astype(dtype),
        log_decay(num_tokens, H).astype(dtype) if decay else None,
        randn((SLOTS, H, DK, DV)),
    )


def triton(**options):
    return functools.partial(ragged_gated_delta_rule_triton, cfg=CFG, interpret=True, **options)


def i32(x):
    return jnp.asarray(x, jnp.int32)


def check_reference(out, new_state, inputs, qsl, slots, dtype=jnp.float32, use_qk_l2norm=True):
    ref_out, ref_state = ragged_gated_delta_rule_reference(*inputs, qsl, slots, use_qk_l2norm=use_qk_l2norm)
    assert out.dtype == inputs[0].dtype and new_state.dtype == inputs[5].dtype
    assert_close(out, ref_out, dtype, name="out")
    assert_close(new_state, ref_state, dtype, name="new_state")
    untouched = np.setdiff1d(np.arange(SLOTS), slots[np.diff(qsl) > 0])
    assert bool(jnp.all(new_state[untouched] == inputs[5][untouched]))
    assert bool(jnp.all(out[np.r_[0 : qsl[0], qsl[-1] : out.shape[0]]] == 0))


@pytest.mark.parametrize(
    "dtype, use_qk_l2norm, decay, chunk", [(jnp.float32, True, True, 16), (jnp.bfloat16, False, False, 64)]
)
def test_mixed_requests_under_jit(dtype, use_qk_l2norm, decay, chunk):
    """Prefill and decode requests in one call: the packed chunked kernels (chunks of one and of two row blocks: 64
    asked, EasyDeL's, runs as 32), bounds and slots traced."""
    inputs = make_inputs(dtype=dtype, decay=decay)
    cfg = dataclasses.replace(CFG, chunk_size=chunk)
    call = jax.jit(
        functools.partial(ragged_gated_delta_rule_triton, cfg=cfg, interpret=True, use_qk_l2norm=use_qk_l2norm)
    )
    out, new_state = call(*inputs, i32(QSL), i32(SLOT_OF))
    check_reference(out, new_state, inputs, QSL, SLOT_OF, dtype, use_qk_l2norm)


def test_prefill_of_fewer_tokens_than_a_chunk():
    """A call of 8 tokens (one chunk of 16 holds them all) with a request of 3: the chunked form, one chunk per
    request, the pack kernel's masked loads past the tokens' end; the same from the chunked entry."""
    inputs = make_inputs(num_tokens=8)
    out, new_state = jax.jit(triton())(*inputs, i32(SHORT_QSL), i32(SHORT_SLOTS))
    check_reference(out, new_state, inputs, SHORT_QSL, SHORT_SLOTS)
    # the same kernels as the chunked entry the Mosaic GPU implementation hands its prefills to
    req = requests(i32(SHORT_QSL), i32(SHORT_SLOTS), 8, SLOTS)
    entry = functools.partial(chunked_requests, chunk_size=CFG.chunk_size, use_qk_l2norm=True, interpret=True)
    for got, want in zip(jax.jit(entry)(inputs[:5], inputs[5], req), (out, new_state), strict=True):
        assert bool(jnp.array_equal(got, want))


def test_decode_step_reads_before_the_slot_is_written():
    """Decode only: the fused kernel on the pool in place; the reader of a shared slot sees its old state, the
    empty request and the out-of-range slot write nothing and output zeros, as on XLA."""
    inputs = make_inputs(num_tokens=8)
    out, new_state = jax.jit(triton())(*inputs, i32(DECODE_QSL), i32(DECODE_SLOTS))
    xla_out, xla_state = jax.jit(ragged_gated_delta_rule_xla)(*inputs, i32(DECODE_QSL), i32(DECODE_SLOTS))
    assert_close(out, xla_out, name="out")
    assert_close(new_state, xla_state, name="new_state")
    check_reference(out, new_state, inputs, DECODE_QSL[:-1], DECODE_SLOTS[:-1])  # without the dropped request


def test_decode_batch_without_query_start_loc():
    """A decode batch by contract (no `query_start_loc`): the decode kernel alone, token i on slot
    `state_indices[i]`; a shared slot's reader sees the old state, an out-of-range slot outputs zeros."""
    inputs = make_inputs(num_tokens=6)
    slots = np.array([1, 3, 8, 3, 12, 0], np.int32)
    out, new_state = jax.jit(triton())(*inputs, None, i32(slots))
    xla_out, xla_state = jax.jit(ragged_gated_delta_rule_xla)(*inputs, None, i32(slots))
    assert_close(out, xla_out, name="out")
    assert_close(new_state, xla_state, name="new_state")
    kept = np.array([0, 1, 2, 3, 5])  # without the dropped token
    check_reference(out[kept], new_state, [x[kept] for x in inputs[:5]] + [inputs[5]], np.arange(6), slots[kept])


def test_serving_loop_donates_the_pool():
    """Two decode steps, each fed the pool the last returned, donated (updated in place by the kernel)."""
    qsl, slots = np.array([0, 1, 2, 3], np.int32), np.array([5, 2, 7], np.int32)
    first, second = make_inputs(num_tokens=3), make_inputs(num_tokens=3)
    step = jax.jit(lambda pool, *rest: triton()(*rest[:5], pool, *rest[5:]), donate_argnums=0)
    pool = jnp.copy(first[5])
    _, pool = step(pool, *first[:5], i32(qsl), i32(slots))
    out, pool = step(pool, *second[:5], i32(qsl), i32(slots))
    _, expected = ragged_gated_delta_rule_reference(*first, qsl, slots)
    check_reference(out, pool, (*second[:5], expected), qsl, slots)


def test_gradient_is_the_plain_jax_one():
    """Differentiated, the op runs the plain-JAX computation: the reference's gradients of q, k, v, beta, decay
    and the pool."""
    inputs = make_inputs()
    cotangent = randn((T, H, DV))

    def loss(fn, *floats):
        out, new_state = fn(*floats)
        return jnp.sum(out * cotangent) + jnp.sum(new_state[np.array([4, 0, 7])] ** 2)

    triton_call = lambda *f: triton()(*f, i32(QSL), i32(SLOT_OF))
    reference = lambda *f: ragged_gated_delta_rule_reference(*f, QSL, SLOT_OF)
    grads = jax.jit(jax.grad(functools.partial(loss, triton_call), argnums=tuple(range(6))))(*inputs)
    expected = jax.jit(jax.grad(functools.partial(loss, reference), argnums=tuple(range(6))))(*inputs)
    for name, g, e in zip(("query", "key", "value", "beta", "decay", "state"), grads, expected, strict=True):
        assert_close(g, e, tol=1e-4, name=name)


def test_declines_what_it_cannot_serve():
    query, key, value, beta, decay, state = make_inputs(num_tokens=8)
    with pytest.raises(NotImplementedError, match="dim_k a power of two"):
        triton()(query[..., :8], key[..., :8], value, beta, decay, state[:, :, :8], i32(DECODE_QSL), i32(DECODE_SLOTS))
    # On this CPU, auto takes XLA (the Triton entry is for GPUs), and asking for Triton says so.
    index = i32(DECODE_QSL), i32(DECODE_SLOTS % SLOTS)
    out, _ = ragged_gated_delta_rule(query, key, value, beta, decay, state, *index)
    assert out.shape == (8, H, DV)
    with pytest.raises(ValueError, match="triton"):
        ragged_gated_delta_rule(query, key, value, beta, decay, state, *index, platform="triton")


@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")
def test_kernels_lower_for_cuda(cuda_lowering):
    """Both paths lower to Triton IR for an H100: the decode kernels (readers, writers in place) and the prefill's."""
    shape = lambda *s, dtype=jnp.bfloat16: jax.ShapeDtypeStruct(s, dtype)
    tokens, requests = 256, 8
    args = (shape(tokens, 4, 128), shape(tokens, 4, 128), shape(tokens, 4, 128))
    args += (shape(tokens, 4, dtype=jnp.float32), shape(tokens, 4, dtype=jnp.float32))
    args += (shape(16, 4, 128, 128, dtype=jnp.float32), shape(requests + 1, dtype=jnp.int32))
    args += (shape(requests, dtype=jnp.int32),)
    lower = lambda *args: (
        jax.jit(functools.partial(ragged_gated_delta_rule_triton, interpret=False), donate_argnums=5)
        .trace(*args)
        .lower(lowering_platforms=("cuda",))
        .as_text()
    )
    text = lower(*args)
    for name in (
        "ejkernel_ragged_delta_decode",
        "ejkernel_ragged_delta_decode_readers",
        "ejkernel_ragged_delta_wy",
        "ejkernel_ragged_delta_pass",
    ):
        assert name in text
    # a decode batch: the readers' kernel deciding the modes, then the writers'; nothing else
    text = lower(*args[:6], None, shape(tokens, dtype=jnp.int32))
    assert "ejkernel_ragged_delta_decode_readers" in text and "ejkernel_ragged_delta_wy" not in text


# ---- GPU suite: the compiled kernels against the XLA implementation at serving shapes ----


def _serving_inputs(num_tokens, heads, slots, dtype=jnp.bfloat16):
    return (
        randn((num_tokens, heads, 128), dtype),
        randn((num_tokens, heads, 128), dtype),
        randn((num_tokens, heads, 128), dtype),
        write_strength(num_tokens, heads),
        log_decay(num_tokens, heads, strength=0.05),
        randn((slots, heads, 128, 128)),
    )


def _versus_xla(inputs, qsl, slots, dtype):
    on = lambda platform: jax.jit(functools.partial(ragged_gated_delta_rule, platform=platform))
    bounds = None if qsl is None else i32(qsl)
    out, new_state = on("triton")(*inputs, bounds, i32(slots))
    xla_out, xla_state = on("xla")(*inputs, bounds, i32(slots))
    assert_close(out, xla_out, dtype, name="out")
    assert_close(new_state, xla_state, dtype, name="new_state")


@pytest.mark.gpu
def test_gpu_decode_matches_xla():
    """256 requests of one token, 32 heads; a few share slots, one is empty, one's slot is out of range."""
    slots = np.random.default_rng(0).permutation(320)[:256].astype(np.int32)
    slots[10], slots[20], slots[30] = slots[3], slots[3], 400
    qsl = np.r_[0, np.cumsum(np.where(np.arange(256) == 7, 0, 1))].astype(np.int32)
    _versus_xla(_serving_inputs(256, 32, 320, jnp.float32), qsl, slots, jnp.float32)


@pytest.mark.gpu
def test_gpu_decode_batch_matches_xla():
    """The same decode step called as a decode batch (no `query_start_loc`): 256 tokens, each its own request."""
    slots = np.random.default_rng(2).permutation(320)[:256].astype(np.int32)
    slots[10], slots[20], slots[30] = slots[3], slots[3], 400
    _versus_xla(_serving_inputs(256, 32, 320, jnp.float32), None, slots, jnp.float32)


@pytest.mark.gpu
def test_gpu_mixed_prefill_matches_xla():
    """Prefill requests of 1000, 2048, 37 and 513 tokens among 60 decode requests, 16 heads, bf16 inputs."""
    lengths = np.r_[[1] * 30, 1000, 2048, [1] * 30, 37, 513]
    qsl = np.r_[0, np.cumsum(lengths)].astype(np.int32)
    slots = np.random.default_rng(1).permutation(100)[: len(lengths)].astype(np.int32)
    _versus_xla(_serving_inputs(int(qsl[-1]), 16, 100), qsl, slots, jnp.bfloat16)


@pytest.mark.gpu
def test_gpu_decode_updates_a_donated_pool_in_place():
    """Compiled for the GPU with the pool donated, the decode step makes no copy of the pool."""
    inputs = _serving_inputs(64, 8, 128, jnp.float32)
    qsl, slots = i32(np.arange(65)), i32(np.arange(64) * 2)
    step = jax.jit(lambda pool, *rest: ragged_gated_delta_rule(*rest[:5], pool, *rest[5:]), donate_argnums=0)
    copies = copies_in(step.lower(inputs[5], *inputs[:5], qsl, slots).compile().as_text(), "f32[128,8,128,128]")
    assert not copies, copies[:2]
