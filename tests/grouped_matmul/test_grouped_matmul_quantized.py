"""grouped_matmul with quantized weights: every `ejkernel.quantization` mode on XLA, the Triton kernels that decode
in registers (interpret mode, CUDA lowering, GPU suite), v3 FP8 block scales, the lhs gradient, bad inputs."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from ejkernel.kernels._pallas.gpu.grouped_matmul._interface import mosaic_grouped_matmul
from ejkernel.kernels._triton.grouped_matmul._interface import grouped_matmul_triton
from ejkernel.kernels._xla.grouped_matmul._interface import grouped_matmul_xla
from ejkernel.modules import GroupedMatmulConfig, grouped_matmul
from ejkernel.ops import BwdParams, FwdParams
from ejkernel.quantization import QuantizedArray, quantize_array
from ejkernel.reference.grouped_matmul import grouped_matmul_reference
from harness import check_forward_and_grads, randn

pytestmark = pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")

# 40 rows: empty groups, groups straddling 16-row tiles, 4 rows past the last group.
SIZES = jnp.array([0, 5, 14, 0, 3, 9, 5], jnp.int32)
M, K, N = 40, 64, 96
XLA_SMALL = GroupedMatmulConfig(platform="xla", fwd_params=FwdParams(block_q=16))
TRITON_SMALL = GroupedMatmulConfig(
    fwd_params=FwdParams(block_q=16, block_k=16, block_d=32, num_warps=4, num_stages=2),
    bwd_params=BwdParams(block_q=16, block_k=16, block_d=32, num_warps=4, num_stages=2),
)


def _quantized(mode, axis, transpose_rhs, groups=7, group_size=None, bits=None):
    """A `QuantizedArray` of `w [groups, K, N]` (`[groups, N, K]` with transpose_rhs), packed with `axis`."""
    w = randn((groups, N, K) if transpose_rhs else (groups, K, N))
    return quantize_array(w, group_size=group_size, bits=bits, mode=mode, axis=axis)


def _check(impl, lhs, rhs, **options):
    """Forward and ∂lhs against the reference (the weights are constants of the call)."""
    fn = jax.jit(lambda lhs: impl(lhs, rhs, SIZES, **options))
    ref = jax.jit(lambda lhs: grouped_matmul_reference(lhs, rhs, SIZES, **options))
    check_forward_and_grads(fn, ref, [lhs], (0,), lhs.dtype)


# Each mode once, the four (axis, transpose_rhs) layouts spread over them.
MODES = [
    ("affine", "row", False, 32, 8),
    ("affine", "col", True, 32, 4),
    ("affine", "col", False, 16, 3),  # an odd width: codes split over words
    ("nf4", "row", True, 32, None),
    ("mxfp4", "col", False, None, None),
    ("mxfp8", "row", False, None, None),
    ("nvfp4", "row", True, None, None),
    ("nvfp8", "col", True, None, None),
]


@pytest.mark.parametrize(("mode", "axis", "transpose_rhs", "group_size", "bits"), MODES)
def test_xla_every_mode_matches_reference(mode, axis, transpose_rhs, group_size, bits):
    rhs = _quantized(mode, axis, transpose_rhs, group_size=group_size, bits=bits)
    impl = functools.partial(grouped_matmul_xla, cfg=XLA_SMALL)
    _check(impl, randn((M, K)), rhs, transpose_rhs=transpose_rhs)


@pytest.mark.lowest
def test_public_function_bf16_offset_bias_and_frozen_weights():
    """Through the executor: a shard of groups 2..5, v3 bias, bf16; the packed arrays get zero cotangents."""
    rhs = _quantized("affine", "row", False, groups=4, group_size=32)
    lhs, bias = randn((M, K), jnp.bfloat16), randn((4, 1, N))
    options = dict(use_v3=True, rhs_bias=bias, preferred_element_type=jnp.bfloat16)
    fn = jax.jit(lambda lhs: grouped_matmul(lhs, rhs, SIZES, 2, platform="xla", cfg=XLA_SMALL, **options))
    ref = jax.jit(lambda lhs: grouped_matmul_reference(lhs, rhs, SIZES, 2, rhs_bias=bias))
    check_forward_and_grads(fn, ref, [lhs], (0,), jnp.bfloat16)
    scales_grad = jax.grad(lambda s: grouped_matmul(lhs, dataclasses.replace(rhs, scales=s), SIZES, 2).sum())
    assert not np.any(np.asarray(scales_grad(rhs.scales)))


def test_xla_bypass_tiling_decodes_once():
    rhs = _quantized("nf4", "col", False, group_size=32)
    cfg = GroupedMatmulConfig(platform="xla", bypass_xla_tiling=True)
    _check(functools.partial(grouped_matmul_xla, cfg=cfg), randn((M, K)), rhs)


def _fp8_v3(transpose_rhs, groups=7, k=K, n=N, blocks=2):
    """v3 FP8 weights with block scales `[groups, blocks, 1, N]` (DeepSeek's form, blocks of K/blocks rows)."""
    w = randn((groups, n, k) if transpose_rhs else (groups, k, n), scale=4.0).astype(jnp.float8_e4m3fn)
    return w, jnp.abs(randn((groups, blocks, 1, n))) / 8 + 0.01


@pytest.mark.parametrize(
    ("mode", "axis", "transpose_rhs", "bits"),
    [("affine", "row", False, 8), ("mxfp4", "col", True, None), ("mxfp8", "row", True, None)],
)
def test_triton_interpret_decodes_packed_weights(mode, axis, transpose_rhs, bits):
    """Words split into 4-bit codes, and 8-bit codes read as bytes (uint8, and float8 for E4M3)."""
    rhs = _quantized(mode, axis, transpose_rhs, group_size=32 if mode == "affine" else None, bits=bits)
    impl = functools.partial(grouped_matmul_triton, cfg=TRITON_SMALL, interpret=True)
    _check(impl, randn((M, K), jnp.bfloat16), rhs, transpose_rhs=transpose_rhs)


@pytest.mark.parametrize("transpose_rhs", [False, True])
def test_triton_interpret_fp8_block_scales(transpose_rhs):
    """Forward and the gradients of lhs and rhs_scale (the v3 contract) against the reference, which scales
    the float32 weights; the fp8 rhs itself is exact in float32."""
    rhs, scale = _fp8_v3(transpose_rhs)
    options = dict(use_v3=True, transpose_rhs=transpose_rhs)
    fn = jax.jit(
        lambda lhs, s: grouped_matmul_triton(lhs, rhs, SIZES, rhs_scale=s, cfg=TRITON_SMALL, interpret=True, **options)
    )
    ref = jax.jit(lambda lhs, s: grouped_matmul_reference(lhs, rhs, SIZES, rhs_scale=s, transpose_rhs=transpose_rhs))
    check_forward_and_grads(fn, ref, [randn((M, K)), scale], (0, 1), jnp.float32)


@pytest.mark.parametrize("transpose_rhs", [False, True])
def test_fp8_lhs_matches_its_reference(transpose_rhs):
    """The opt-in FP8 x FP8 product (Triton rounds lhs on the fly, XLA first) against the reference that rounds
    lhs through FP8 per row and scale block; the lhs gradient passes straight through the rounding."""
    rhs, scale = _fp8_v3(transpose_rhs)
    options = dict(rhs_scale=scale, transpose_rhs=transpose_rhs, fp8_lhs=True)
    triton = functools.partial(grouped_matmul_triton, cfg=TRITON_SMALL, interpret=True)
    ref = jax.jit(lambda lhs: grouped_matmul_reference(lhs, rhs, SIZES, **options))
    for impl in (triton, functools.partial(grouped_matmul_xla, cfg=XLA_SMALL)):
        fn = jax.jit(lambda lhs, impl=impl: impl(lhs, rhs, SIZES, use_v3=True, **options))
        check_forward_and_grads(fn, ref, [randn((M, K))], (0,), jnp.float32)


def test_xla_fp8_block_scales():
    rhs, scale = _fp8_v3(False)
    fn = jax.jit(lambda lhs, s: grouped_matmul(lhs, rhs, SIZES, rhs_scale=s, use_v3=True, cfg=XLA_SMALL))
    ref = jax.jit(lambda lhs, s: grouped_matmul_reference(lhs, rhs, SIZES, rhs_scale=s))
    check_forward_and_grads(fn, ref, [randn((M, K), jnp.bfloat16), scale], (0,), jnp.bfloat16)


@pytest.mark.lowest
def test_bad_inputs_one_line():
    lhs, rhs = randn((M, K)), _quantized("affine", "col", False, group_size=32)
    flat = quantize_array(randn((K, N)), group_size=32, axis="col")
    wrong_k = quantize_array(randn((7, K + 32, N)), group_size=32, axis="col")
    along_k = quantize_array(randn((7, K, N)), group_size=32, axis="row")  # grouped along K, for lhs of K = 48
    fp8, _ = _fp8_v3(False)
    mesh = jax.make_mesh((1,), ("x",))
    cases = [
        (lambda: grouped_matmul(lhs, flat, SIZES), "leading group axis"),
        (lambda: grouped_matmul(lhs, wrong_k, SIZES), "holds K = 96, must equal lhs.shape\\[1\\] = 64"),
        (lambda: grouped_matmul(randn((M, 48)), along_k, SIZES), "group_size 32 must divide K"),
        (lambda: grouped_matmul(lhs, QuantizedArray(rhs.data, rhs.scales, None, mode="int3"), SIZES), "mode must be"),
        (lambda: grouped_matmul(lhs, rhs, SIZES, use_v3=True, rhs_scale=jnp.ones((7, 2, 1, N))), "its own scales"),
        (lambda: grouped_matmul(lhs, fp8, SIZES, use_v3=True, rhs_scale=jnp.ones((7, 2, 1, 9))), "rhs_scale must be"),
        (lambda: grouped_matmul(lhs, fp8, SIZES, use_v3=True, rhs_scale=jnp.ones((7, 3, 1, N))), "divide K"),
        (lambda: grouped_matmul(lhs, fp8, SIZES, fp8_lhs=True), "fp8_lhs multiplies FP8 by FP8"),
        (lambda: grouped_matmul(lhs, rhs, SIZES, mesh=mesh, in_specs=(P(),) * 3, out_specs=P()), "not sharded"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message) as info:
            call()
        assert "\n" not in str(info.value)


def test_kernels_decline_what_they_do_not_decode():
    lhs = randn((M, K), jnp.bfloat16)
    three_bits = _quantized("affine", "col", False, group_size=32, bits=3)
    with pytest.raises(NotImplementedError, match="codes of \\(4, 8\\) bits, got 3"):
        grouped_matmul_triton(lhs, three_bits, SIZES, interpret=True)
    with pytest.raises(NotImplementedError, match=r"MXFP4 and affine int4 .* got mode 'nf4'"):  # (its own file's tests)
        mosaic_grouped_matmul(lhs, _quantized("nf4", "row", False), SIZES)


@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")
def test_triton_quantized_kernels_lower_for_cuda(cuda_lowering):
    """The forward and the lhs gradient lower to Triton IR for an H100: packed int4 and mxfp4, v3 FP8 (both
    layouts, and FP8 x FP8)."""
    lhs = jax.ShapeDtypeStruct((3000, 512), jnp.bfloat16)
    sizes = jnp.array([500, 0, 700, 300, 0, 1000, 100], jnp.int32)
    dout = jnp.ones((3000, 384), jnp.float32)

    def lowered(rhs, transpose_rhs=False, **options):
        fn = lambda a: grouped_matmul_triton(a, rhs, sizes, transpose_rhs=transpose_rhs, interpret=False, **options)
        train = lambda a: jax.vjp(fn, a)[1](dout)
        return jax.jit(train).trace(lhs).lower(lowering_platforms=("cuda",)).as_text()

    int4 = quantize_array(jnp.ones((7, 512, 384)), group_size=128, bits=4, axis="row")
    mxfp4 = quantize_array(jnp.ones((7, 384, 512)), mode="mxfp4", axis="col")
    fp8 = jnp.ones((7, 512, 384), jnp.float8_e4m3fn)
    for text in (lowered(int4), lowered(mxfp4, transpose_rhs=True)):
        assert text.count("ejkernel_grouped_matmul") >= 2
    scale = jnp.ones((7, 4, 1, 384))
    text = lowered(fp8, use_v3=True, rhs_scale=scale, fp8_lhs=True)
    assert text.count("ejkernel_grouped_matmul") >= 2 and "f8E4M3FN" in text
    for text in (
        lowered(fp8, use_v3=True, rhs_scale=scale),
        lowered(fp8.swapaxes(1, 2), True, use_v3=True, rhs_scale=scale),
    ):
        assert text.count("ejkernel_grouped_matmul") >= 2


# ---- GPU suite: the decoding kernels against XLA's dequantize-per-group at the MoE shape class ----


def _moe(m=16384, k=4096, n=1536, groups=64, seed=0):
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.integers(0, m - 100, groups - 1))
    sizes = jnp.asarray(np.diff(np.concatenate([[0], cuts, [m - 100]])), jnp.int32)  # 100 rows past the groups
    return randn((m, k), jnp.bfloat16), randn((groups, k, n), scale=k**-0.5), sizes


@pytest.mark.gpu
@pytest.mark.parametrize(("mode", "group_size", "axis"), [("affine", 128, "row"), ("mxfp4", None, "row")])
def test_gpu_triton_packed_matches_xla(mode, group_size, axis):
    lhs, w, sizes = _moe()
    rhs = quantize_array(w, group_size=group_size, bits=4, mode=mode, axis=axis)
    triton = jax.jit(lambda lhs: grouped_matmul(lhs, rhs, sizes, platform="triton"))
    xla = jax.jit(lambda lhs: grouped_matmul(lhs, rhs, sizes, platform="xla"))
    check_forward_and_grads(triton, xla, [lhs], (0,), jnp.bfloat16)


@pytest.mark.gpu
def test_gpu_triton_fp8_block_scales_matches_xla():
    lhs, w, sizes = _moe()
    groups, k, n = w.shape
    scale = (
        jnp.abs(w).reshape(groups, k // 128, 128, n).max(axis=2, keepdims=True)[:, :, :1] / 448.0
    )  # [G, K/128, 1, N]
    fp8 = (w / jnp.repeat(scale[:, :, 0], 128, axis=1)).astype(jnp.float8_e4m3fn)
    triton = jax.jit(
        lambda lhs: grouped_matmul(
            lhs, fp8, sizes, rhs_scale=scale, platform="triton", use_v3=True, preferred_element_type=jnp.bfloat16
        )
    )
    xla = jax.jit(lambda lhs: grouped_matmul(lhs, fp8, sizes, rhs_scale=scale, platform="xla", use_v3=True))
    check_forward_and_grads(triton, xla, [lhs], (0,), jnp.bfloat16)


@pytest.mark.gpu
def test_gpu_triton_fp8_lhs_matches_xla():
    """The FP8 x FP8 forward on tensor cores against XLA rounding lhs first: XLA rounds the same bfloat16
    activations (the harness hands the reference float32 copies), so both multiply the same FP8 values."""
    lhs, w, sizes = _moe()
    groups, k, n = w.shape
    scale = jnp.abs(w).reshape(groups, k // 128, 128, n).max(axis=2, keepdims=True)[:, :, :1] / 448.0
    fp8 = (w / jnp.repeat(scale[:, :, 0], 128, axis=1)).astype(jnp.float8_e4m3fn)
    options = dict(rhs_scale=scale, use_v3=True, fp8_lhs=True)
    triton = jax.jit(
        lambda lhs: grouped_matmul(lhs, fp8, sizes, platform="triton", preferred_element_type=jnp.bfloat16, **options)
    )
    xla = jax.jit(lambda lhs: grouped_matmul(lhs.astype(jnp.bfloat16), fp8, sizes, platform="xla", **options))
    check_forward_and_grads(triton, xla, [lhs], (0,), jnp.bfloat16)
