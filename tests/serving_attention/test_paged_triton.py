"""The Pallas-Triton serving kernel: interpret mode against the reference, CUDA lowering, declines, GPU suite.

Interpret-mode cases use small tiles and two splits, so each call runs several key steps per split,
merges splits by log-sum-exp, and covers three cache layouts (page-major, head-major, packed v3).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from paged_cases import CASES, OPS, jitted_reference, output_of, ragged_v3_case, unified_case

import ejkernel.modules as modules
from ejkernel import kernel_registry
from ejkernel.kernels._common.paged_attention.adapters import unified_batch
from ejkernel.kernels._common.paged_attention.implementations import implementation
from ejkernel.kernels._common.paged_attention.jax_core import paged_attention_core
from ejkernel.kernels._triton.paged_attention._interface import paged_attention_triton_core, plan, short_pass
from ejkernel.modules.operations.page_attention import PagedAttentionConfig
from ejkernel.ops import FwdParams
from harness import assert_close, check_forward_and_grads, randn

pytestmark = pytest.mark.filterwarnings("ignore:The Pallas Triton")
SMALL = PagedAttentionConfig(fwd_params=FwdParams(block_q=2, block_k=16), num_splits=2)


def triton(op):
    """The registered Triton implementation of `op`, its kernel interpreted (off a GPU it must be asked for)."""
    core = functools.partial(paged_attention_triton_core, interpret=True)
    return implementation(op, core, kernel_registry.get(op, "triton", "gpu").__name__)


@pytest.mark.parametrize(
    ("op", "case", "options"),
    [
        ("page_attention", {}, {"sliding_window": 19, "attn_logits_soft_cap": 2.0}),
        ("ragged_page_attention_v3", {"mixed": (1, 2, 4), "dtype": jnp.bfloat16}, {"v_scale": 2.0}),
        ("ragged_decode_attention", {"rank": 4}, {"sliding_window": (5, 2)}),
    ],
)
def test_forward_matches_reference(op, case, options):
    args, base = CASES[op](np.random.default_rng(3), **case)
    options = {**base, **options}
    out = output_of(op)(triton(op)(*args, cfg=SMALL, **options))
    assert_close(out, jitted_reference(op, options)(*args), out.dtype)


def test_unified_forward_and_gradients():
    """ALiBi, query-query bias, sinks, soft cap; gradients through the custom VJP (the plain-JAX backward)."""
    args, _ = unified_case(np.random.default_rng(4))
    fn = jax.jit(lambda *a: triton("unified_attention")(*a, cfg=SMALL, logits_soft_cap=2.0))
    ref = jitted_reference("unified_attention", {"logits_soft_cap": 2.0})
    check_forward_and_grads(fn, ref, args, (0, 1, 2, 6, 7, 8), jnp.float32)


def test_mixed_batch_runs_short_sequences_apart():
    """Decode sequences beside prefill chunks: a pass of one small tile per short sequence and a pass of prefill
    tiles, each token written by one; the output and its log-sum-exp as the plain-JAX core's."""
    args, _ = unified_case(np.random.default_rng(6), q_lens=(1, 20, 0, 2, 17), kv_lens=(17, 26, 0, 5, 30), kv_heads=1)
    batch = unified_batch(*args, logits_soft_cap=2.0)
    assert short_pass(batch, None, plan(batch, None, True)) is not None
    out, lse = jax.jit(lambda b: paged_attention_triton_core(b, interpret=True, with_lse=True))(batch)
    expected, expected_lse = paged_attention_core(batch, with_lse=True)
    assert_close(out, expected)
    assert_close(lse, expected_lse, name="lse")


def test_kernel_lowers_for_cuda(cuda_lowering):
    """The kernel lowers to Triton IR for an H100 (compute capability 9.0), without a GPU."""
    core = functools.partial(paged_attention_triton_core, interpret=False)
    for op in ("page_attention", "ragged_page_attention_v3", "unified_attention"):  # each layout, every bias
        args, options = CASES[op](np.random.default_rng(0), dtype=jnp.bfloat16)
        impl = implementation(op, core, op)
        call = functools.partial(impl, **options)
        text = jax.jit(call).trace(*args).lower(lowering_platforms=("cuda",))
        assert "ejkernel_paged_attention" in text.as_text(), op


def test_declines_what_it_cannot_serve():
    args, _ = unified_case(np.random.default_rng(5), dim=512)
    with pytest.raises(NotImplementedError, match="head dims"):
        plan(unified_batch(*args), None, True)
    args, _ = unified_case(np.random.default_rng(5))
    args[1], args[2] = (x.astype(jnp.int8) for x in args[1:3])
    with pytest.raises(NotImplementedError, match="cache"):
        plan(unified_batch(*args), None, True)


def test_eight_bit_caches_step_longer_with_more_in_flight():
    """An 8-bit cache's default tiling: 128 keys a step, three stages, and splits for twice the programs (the
    float8 decode's sweep on an H200); a config's fields still win."""
    args, _ = unified_case(np.random.default_rng(5), q_lens=(1,) * 64, kv_lens=(8192,) * 64, kv_heads=1)
    wide = plan(unified_batch(*args), None, True)
    args[1], args[2] = (x.astype(jnp.float8_e4m3fn) for x in args[1:3])
    narrow = plan(unified_batch(*args), None, True)
    assert (wide.block_k, wide.num_stages, narrow.block_k, narrow.num_stages) == (64, 2, 128, 3)
    assert narrow.num_splits > wide.num_splits  # 9 against 5 here
    cfg = PagedAttentionConfig(fwd_params=FwdParams(block_k=32, num_stages=2))
    assert (plan(unified_batch(*args), cfg, True).block_k, plan(unified_batch(*args), cfg, True).num_stages) == (32, 2)


@pytest.mark.parametrize("dtype", [jnp.float8_e4m3fn, jnp.float8_e5m2])
def test_float8_cache_read_as_stored(dtype):
    """A float8 cache (v3 quantises the new keys/values into it, the queries with `q_scale`) is read as float8 and
    converted in registers: the same result as XLA's on the same cache."""
    args, _ = ragged_v3_case(np.random.default_rng(8), dtype=jnp.float32)
    args[1], args[2], args[3] = (x.astype(dtype) for x in args[1:4])
    options = dict(q_scale=0.5, k_scale=1.5, v_scale=0.75, softmax_scale=24**-0.5)
    out, cache = triton("ragged_page_attention_v3")(*args, cfg=SMALL, **options)
    expected, expected_cache = kernel_registry.get("ragged_page_attention_v3", "xla")(*args, **options)
    assert_close(out, expected)
    assert bool(jnp.all(cache == expected_cache))


def test_float8_cache_with_bfloat16_queries_computes_in_float16():
    """bfloat16 queries over a float8 cache take float16 dots; queries past float16's range (here 1e5) enter
    divided by a power of two and the logits are scaled back, so the result is XLA's, not inf or NaN."""
    args, _ = ragged_v3_case(np.random.default_rng(9), dtype=jnp.bfloat16)
    args[0] = args[0] * 1e5
    args[1], args[2], args[3] = (x.astype(jnp.float8_e4m3fn) for x in args[1:4])
    options = dict(softmax_scale=1e-5 * 24**-0.5)
    out, _ = triton("ragged_page_attention_v3")(*args, cfg=SMALL, **options)
    expected, _ = kernel_registry.get("ragged_page_attention_v3", "xla")(*args, **options)
    assert_close(out, expected)


def test_float8_cache_lowers_for_cuda(cuda_lowering):
    args, _ = ragged_v3_case(np.random.default_rng(8), dtype=jnp.bfloat16)
    args[1], args[2], args[3] = (x.astype(jnp.float8_e4m3fn) for x in args[1:4])
    core = functools.partial(paged_attention_triton_core, interpret=False)
    impl = implementation("ragged_page_attention_v3", core, "v3")
    text = jax.jit(functools.partial(impl, q_scale=0.5)).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert "ejkernel_paged_attention" in text


# ---- GPU suite: the kernel against the XLA implementation at real shapes ----

GPU_SHAPES = {
    "decode 64 x 4096": ("page_attention", dict(kv_lens=(4096,) * 60 + (1, 17, 4000, 0), heads=32, kv_heads=8)),
    "unified mixed prefill + decode": (
        "unified_attention",
        dict(q_lens=(1,) * 30 + (512, 77), kv_lens=(3000,) * 30 + (1024, 2000), heads=32, kv_heads=8, page=16),
    ),
}


def _gpu_case(op, shape):
    rng = np.random.default_rng(0)
    if op == "page_attention":
        return CASES[op](rng, dim=128, page=16, dtype=jnp.bfloat16, **shape)
    return CASES[op](rng, dim=128, dtype=jnp.bfloat16, **shape)


@pytest.mark.gpu
@pytest.mark.parametrize("name", GPU_SHAPES)
def test_gpu_matches_xla(name):
    op, shape = GPU_SHAPES[name]
    args, options = _gpu_case(op, shape)
    fn = lambda platform: jax.jit(lambda *a: getattr(modules, op)(*a, platform=platform, **options))
    assert_close(fn("triton")(*args), fn("xla")(*args), jnp.bfloat16)
    g = randn((args[0].shape), jnp.bfloat16)
    grad = lambda platform: jax.grad(lambda q: jnp.vdot(fn(platform)(q, *args[1:]), g).real)(args[0])
    assert_close(grad("triton"), grad("xla"), jnp.bfloat16, tol=4e-2, name="dq")


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
def test_gpu_every_op_with_splits(op):
    args, options = CASES[op](np.random.default_rng(1), dtype=jnp.bfloat16)
    cfg = PagedAttentionConfig(fwd_params=FwdParams(block_k=32), num_splits=3)
    out = triton(op)(*args, cfg=cfg, **options)
    expected = kernel_registry.get(op, "xla")(*args, **options)
    assert_close(output_of(op)(out), output_of(op)(expected), jnp.bfloat16)
