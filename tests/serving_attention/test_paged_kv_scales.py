"""Quantised KV caches with per-token-head scales in every paged op: float8 (e4m3fn, e5m2) and int8 codes,
dequantised in the cores (XLA and Triton, interpret mode), against the reference, which dequantises first.

The caches are the shared cases' random caches quantised by the reference's `quantize`; `ragged_page_attention_v3`
and the MLA ops also quantise the new tokens as they write them (compared with the reference's writes).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from paged_cases import CASES, OPS, output_of
from test_mla_ragged_paged import make_case

import ejkernel.modules as modules
from ejkernel import kernel_registry
from ejkernel.kernels._common.paged_attention.implementations import implementation
from ejkernel.kernels._common.paged_attention.kv_cache import v3_cache_shape
from ejkernel.kernels._triton.multi_latent_ragged_page_attention import multi_latent_ragged_page_attention_triton
from ejkernel.kernels._triton.paged_attention._interface import paged_attention_triton_core
from ejkernel.kernels._triton.paged_attention._kernel import widen
from ejkernel.modules.operations.page_attention import PagedAttentionConfig
from ejkernel.ops import FwdParams
from ejkernel.reference import paged_attention as reference
from ejkernel.reference.multi_latent_ragged_page_attention import multi_latent_ragged_page_attention_reference
from harness import assert_close, check_forward_and_grads, randn

pytestmark = pytest.mark.filterwarnings("ignore:The Pallas Triton")
E4M3, E5M2, INT8 = jnp.float8_e4m3fn, jnp.float8_e5m2, jnp.int8
SMALL = PagedAttentionConfig(fwd_params=FwdParams(block_q=2, block_k=16), num_splits=2)
SEPARATE = {"page_attention", "prefill_page_attention", "ragged_decode_attention", "unified_attention"}
CACHE_SLOTS = {"ragged_page_attention_v2": 1, "ragged_page_attention_v3": 3}  # the other ops: key 1, value 2


def quantized_case(op, code_dtype, rng_seed=0, **case):
    """`(args, options)` of `op` with its cache(s) quantised to `code_dtype` and the scales among the options;
    `ragged_page_attention_v3`'s cache takes the packed layout of `code_dtype` (its new keys/values stay float)."""
    args, options = CASES[op](np.random.default_rng(rng_seed), **case)
    options = dict(options)
    if op in SEPARATE:
        (args[1], options["key_cache_scales"]), (args[2], options["value_cache_scales"]) = (
            reference.quantize(x, code_dtype) for x in args[1:3]
        )
        return args, options
    slot = CACHE_SLOTS[op]
    cache = args[slot]
    if op == "ragged_page_attention_v3":
        num_pages, page_size = cache.shape[:2]
        cache = randn(v3_cache_shape(num_pages, page_size, args[1].shape[1], args[1].shape[2], code_dtype))
        options["softmax_scale"] = None
    args[slot], options["kv_cache_scales"] = reference.quantize(cache, code_dtype)
    return args, options


def triton(op):
    """The Triton implementation of `op` with its kernel interpreted."""
    core = functools.partial(paged_attention_triton_core, interpret=True)
    return implementation(op, core, kernel_registry.get(op, "triton", "gpu").__name__)


def assert_same_writes(cache, scales, ref_cache, ref_scales):
    """The quantised writes match: scales to float32 rounding (a compiled `max / M` may round once more), and the
    dequantised caches (a code may sit on the other side of a rounding boundary)."""
    np.testing.assert_allclose(np.asarray(scales), np.asarray(ref_scales), rtol=1e-6)
    dequantized = lambda c, s: reference.dequantize(c, s.reshape(c.shape[:-1]))
    assert_close(dequantized(cache, scales), dequantized(ref_cache, ref_scales), tol=1e-3, name="dequantised cache")


def expected(op, args, options):
    return getattr(reference, f"{op}_reference")(*args, **options)


@pytest.mark.parametrize("op", OPS)
def test_xla_float8_forward_matches_reference(op):
    args, options = quantized_case(op, E4M3)
    out = getattr(modules, op)(*args, platform="xla", **options)
    ref = expected(op, args, options)
    assert_close(output_of(op)(out), output_of(op)(ref), jnp.float32)
    if op == "ragged_page_attention_v3":  # the quantised write: codes and scales as the reference's
        assert_same_writes(*out[1:], *ref[1:])


def test_xla_gradients_of_queries_and_scales():
    """The XLA core differentiates through the per-row scales as through the queries."""
    args, options = quantized_case("unified_attention", E5M2, rng_seed=2)
    ks, vs = options.pop("key_cache_scales"), options.pop("value_cache_scales")

    def call(fn):
        return lambda q, k_s, v_s: fn(q, *args[1:], key_cache_scales=k_s, value_cache_scales=v_s, **options)

    op = functools.partial(modules.unified_attention, platform="xla")
    check_forward_and_grads(
        call(op), call(reference.unified_attention_reference), [args[0], ks, vs], (0, 1, 2), jnp.float32
    )


@pytest.mark.lowest
@pytest.mark.parametrize(
    ("platform", "dtype"),
    [("xla", jnp.float32), ("triton", jnp.float32), ("triton", jnp.bfloat16), ("triton", jnp.float16)],
)
def test_int8_cache(platform, dtype):
    """With 16-bit queries the Triton core's logits are an int8 dot (`_queries`), its values' dot float16
    (`widen`)."""
    args, options = quantized_case("page_attention", INT8, rng_seed=3, dtype=dtype)
    fn = triton("page_attention") if platform == "triton" else kernel_registry.get("page_attention", "xla")
    cfg = SMALL if platform == "triton" else None
    assert_close(fn(*args, cfg=cfg, **options), expected("page_attention", args, options), dtype)


def test_int8_codes_widen_to_float16_exactly():
    """The Triton core's int8 -> float16 through float16's bits gives every code's value."""
    codes = jnp.arange(-128, 128, dtype=jnp.int32)
    np.testing.assert_array_equal(widen(codes.astype(INT8), jnp.float16), codes.astype(jnp.float16))


@pytest.mark.parametrize(("op", "dtype"), [("ragged_page_attention_v3", E4M3), ("unified_attention", E5M2)])
def test_triton_interpret_matches_reference(op, dtype):
    args, options = quantized_case(op, dtype, rng_seed=4)
    out = triton(op)(*args, cfg=SMALL, **options)
    ref = expected(op, args, options)
    assert_close(output_of(op)(out), output_of(op)(ref), jnp.float32)
    if op == "ragged_page_attention_v3":
        assert_same_writes(*out[1:], *ref[1:])


@pytest.mark.parametrize("dtype", [E4M3, INT8])
def test_v3_write_quantises_each_token_head(dtype):
    """A written token-head holds `code = x / scale` with `scale = max|x| / M`: it dequantises to the bf16 input
    within the format's rounding; untouched rows keep their scales; zero rows get scale 1."""
    args, options = quantized_case("ragged_page_attention_v3", dtype, rng_seed=5)
    keys, values = (x.astype(jnp.bfloat16) for x in args[1:3])
    keys = keys.at[0].set(0.0)  # token 0's keys: zero rows
    args[1], args[2] = keys, values
    scales = options["kv_cache_scales"]
    _, cache, new_scales = modules.ragged_page_attention_v3(*args, platform="xla", **options)
    _, ref_cache, ref_scales = expected("ragged_page_attention_v3", args, options)
    assert_same_writes(cache, new_scales, ref_cache, ref_scales)

    # Token 0 of sequence 0 sits at position kv_lens[0] - q_len[0] of its pages: its rows, head by head.
    num_pages, page_size, groups, packing, _ = cache.shape
    q_len = int(args[6][1] - args[6][0])
    pos = int(args[4][0]) - q_len
    page = int(args[5].reshape(args[4].shape[0], -1)[0, pos // page_size])
    heads = cache[page, pos % page_size].reshape(groups * packing, -1)[:, : keys.shape[2]].astype(jnp.float32)
    row_scales = new_scales[page, pos % page_size].reshape(-1)
    top = 127.0 if dtype == INT8 else 448.0
    for h in range(keys.shape[1]):
        assert float(row_scales[2 * h]) == 1.0 and not bool(jnp.any(heads[2 * h]))  # a zero key row
        x = values[0, h].astype(jnp.float32)
        scale = float(row_scales[2 * h + 1])
        np.testing.assert_allclose(scale, float(jnp.max(jnp.abs(x))) / top, rtol=1e-6)
        step = 0.5 * scale if dtype == INT8 else 2.0**-4 * jnp.abs(x) + 2.0**-9 * scale
        assert bool(jnp.all(jnp.abs(heads[2 * h + 1] * scale - x) <= step))
    untouched = np.ones(num_pages, bool)
    untouched[np.asarray(args[5])] = False
    assert bool(jnp.array_equal(new_scales[untouched], scales[untouched]))


@pytest.mark.parametrize("platform", ["xla", "triton"])
def test_mla_float8_cache_with_scales(platform):
    args = make_case(E4M3, jnp.bfloat16, page=16, pages_per_seq=2)
    scales = jnp.asarray(np.random.default_rng(6).uniform(0.5, 2.0, args[4].shape[:-1]), jnp.float32)
    options = {"kv_cache_scales": scales, "q_scale": 0.5, "k_scale": 1.5}
    if platform == "triton":
        tiling = modules.MultiLatentRaggedPageAttentionTritonTiling(block_h=16, block_k=16, num_splits=2)
        cfg = modules.MultiLatentRaggedPageAttentionConfig(triton_tiling=tiling)
        out = multi_latent_ragged_page_attention_triton(*args, interpret=True, cfg=cfg, **options)
    else:
        out = modules.multi_latent_ragged_page_attention(*args, platform="xla", **options)
    ref = multi_latent_ragged_page_attention_reference(*args, **options)
    assert_close(out[0], ref[0], jnp.bfloat16)
    assert_same_writes(*out[1:], *ref[1:])


def test_v3_sharded_heads_split_the_scales_as_the_cache():
    """With the heads split over 2 devices, the scales follow the cache's group axis (in and out)."""
    args, options = quantized_case("ragged_page_attention_v3", E4M3, rng_seed=9, heads=8, kv_heads=4)
    heads, groups = P(None, "x"), P(None, None, "x")
    specs = (heads, heads, heads, groups, P(), P(), P(), P(), P("x"))
    mesh = jax.make_mesh((2,), ("x",))
    out = modules.ragged_page_attention_v3(
        *args, mesh=mesh, in_specs=specs, out_specs=(heads, groups, groups), **options
    )
    ref = expected("ragged_page_attention_v3", args, options)
    assert_close(out[0], ref[0], jnp.float32)
    assert_same_writes(*out[1:], *ref[1:])


@pytest.mark.lowest
def test_bad_inputs():
    args, options = quantized_case("page_attention", INT8)
    with pytest.raises(TypeError, match="key_cache is int8: pass key_cache_scales"):
        modules.page_attention(*args)
    with pytest.raises(ValueError, match="key_cache_scales and value_cache_scales go together"):
        modules.page_attention(*args, key_cache_scales=options["key_cache_scales"])
    float_args, _ = CASES["unified_attention"](np.random.default_rng(0))
    ones = jnp.ones(float_args[1].shape[:-1], jnp.float32)
    with pytest.raises(TypeError, match="key_cache_scales is for float8/int8 caches, key_cache is float32"):
        modules.unified_attention(*float_args, key_cache_scales=ones, value_cache_scales=ones)
    args, options = quantized_case("ragged_page_attention_v3", E4M3)
    with pytest.raises(TypeError, match=r"kv_cache_scales must be float32 \[num_pages, page_size, kv_groups"):
        modules.ragged_page_attention_v3(*args, kv_cache_scales=options["kv_cache_scales"][:, :1])
    with pytest.raises(TypeError, match="kv_cache_scales"):
        modules.ragged_page_attention_v3(*args, kv_cache_scales=options["kv_cache_scales"].astype(jnp.bfloat16))
    mla = make_case(INT8, jnp.float32)
    with pytest.raises(TypeError, match="kv_cache is int8: pass kv_cache_scales"):
        modules.multi_latent_ragged_page_attention(*mla)
    bad = jnp.ones(mla[4].shape[:-1], jnp.bfloat16)
    with pytest.raises(TypeError, match="kv_cache_scales must be float32, got bfloat16"):
        modules.multi_latent_ragged_page_attention(*mla, kv_cache_scales=bad)
    with pytest.raises(ValueError, match="kv_cache_scales must be kv_cache's shape without its last axis"):
        modules.multi_latent_ragged_page_attention(*mla, kv_cache_scales=jnp.ones(mla[4].shape[:-2], jnp.float32))


def test_kernels_lower_for_cuda(cuda_lowering):
    """The paged kernel (int8 and float8 caches with scales) and the MLA kernel (with scales) lower for an H100."""
    core = functools.partial(paged_attention_triton_core, interpret=False)
    for op, dtype in (("unified_attention", INT8), ("ragged_page_attention_v3", E4M3)):
        args, options = quantized_case(op, dtype, dtype=jnp.bfloat16)
        call = functools.partial(implementation(op, core, op), **options)
        assert "ejkernel_paged_attention" in jax.jit(call).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    args = make_case(INT8, jnp.bfloat16, (1, 2, 0, 1, 1), (70, 64, 3, 9, 4), 2, heads=16, page=64, latent=512, rope=64)
    scales = jnp.ones(args[4].shape[:-1], jnp.float32)
    call = functools.partial(multi_latent_ragged_page_attention_triton, interpret=False, kv_cache_scales=scales)
    assert "ejkernel_mla_paged_attention" in jax.jit(call).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


# ---- GPU suite: the kernels against the XLA implementation at a realistic decode shape ----


def _decode_v3(dtype, num_seqs=32, context=4096, heads=32, kv_heads=8, dim=128, page=16):
    """A v3 decode step (one new token per sequence on a full context) over a quantised cache, and its scales."""
    pages_per_seq = context // page
    cache, scales = reference.quantize(
        randn(v3_cache_shape(num_seqs * pages_per_seq, page, kv_heads, dim, dtype)), dtype
    )
    q, k, v = (randn((num_seqs, h, dim), jnp.bfloat16) for h in (heads, kv_heads, kv_heads))
    tables = jnp.asarray(np.random.default_rng(7).permutation(num_seqs * pages_per_seq), jnp.int32)
    lens = jnp.full((num_seqs,), context, jnp.int32)
    starts = jnp.arange(num_seqs + 1, dtype=jnp.int32)
    return [q, k, v, cache, lens, tables, starts, jnp.asarray([num_seqs] * 3, jnp.int32)], scales


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [E4M3, INT8])
def test_gpu_v3_decode_matches_xla(dtype):
    args, scales = _decode_v3(dtype)
    fn = lambda platform: jax.jit(
        lambda *a: modules.ragged_page_attention_v3(*a, kv_cache_scales=scales, softmax_scale=None, platform=platform)
    )
    out, cache, new_scales = fn("triton")(*args)
    ref_out, ref_cache, ref_scales = fn("xla")(*args)
    assert_close(out, ref_out, jnp.bfloat16)
    assert_same_writes(cache, new_scales, ref_cache, ref_scales)


@pytest.mark.gpu
def test_gpu_mla_decode_with_scales_matches_xla():
    args = make_case(
        E4M3, jnp.bfloat16, (1,) * 9, (2048,) * 7 + (1500, 64), 32, heads=128, page=64, latent=512, rope=64
    )
    scales = jnp.asarray(np.random.default_rng(8).uniform(0.5, 2.0, args[4].shape[:-1]), jnp.float32)
    fn = lambda platform: jax.jit(
        lambda *a: modules.multi_latent_ragged_page_attention(*a, kv_cache_scales=scales, platform=platform)
    )
    out, cache, new_scales = fn("triton")(*args)
    ref_out, ref_cache, ref_scales = fn("xla")(*args)
    assert_close(out, ref_out, jnp.bfloat16)
    assert_same_writes(cache, new_scales, ref_cache, ref_scales)
