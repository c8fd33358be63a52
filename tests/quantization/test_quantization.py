"""ejkernel.quantization: round trips, bit layout, code tables, metadata, jit, errors, TurboQuant helpers."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejkernel.quantization as Q
from ejkernel.quantization import (
    QuantizedArray,
    QuantRuntimeConfig,
    dense_quantized_matmul,
    dequantize,
    prepack_quantized_array,
    prepack_quantized_weights,
    quantize,
    quantize_array,
)
from ejkernel.quantization.codes import E2M1, E4M3, NF4
from ejkernel.quantization.packing import pack_codes, unpack_codes
from ejkernel.quantization.turboquant.codebook import LloydMaxCodebook, solve_lloyd_max
from ejkernel.quantization.turboquant.matrices import generate_projection_matrix, generate_rotation_matrix
from ejkernel.reference.quantized_matmul import (
    NF4_VALUES,
    dequantize_reference,
    quantized_matmul_reference,
    unpack_reference,
)
from harness import assert_close, randn

MODES = [("affine", 1), ("affine", 3), ("affine", 4), ("affine", 8), ("nf4", None)]
MODES += [("mxfp4", None), ("mxfp8", None), ("nvfp4", None), ("nvfp8", None)]
GROUP = {"affine": 64, "nf4": 64, "mxfp4": 32, "mxfp8": 32, "nvfp4": 16, "nvfp8": 16}
BITS = {"nf4": 4, "mxfp4": 4, "mxfp8": 8, "nvfp4": 4, "nvfp8": 8}
# Relative (Frobenius) round-trip error on normal weights, about 1.3x what these formats reach (nvfp8 rounds
# its scale to the nearest E4M3 value, coarse below 2^-6: groups whose scale rounds down saturate).
FP_ERROR = {"nf4": 0.12, "mxfp4": 0.16, "mxfp8": 0.04, "nvfp4": 0.14, "nvfp8": 0.07}


def _groups(layout, g):
    return np.asarray(layout, np.float64).reshape(*layout.shape[:-1], -1, g)


def test_exports():
    assert sorted(Q.__all__) == sorted(
        [
            "quantize",
            "dequantize",
            "prepack_quantized_weights",
            "QuantRuntimeConfig",
            "QuantizationMode",
            "QuantizationAxis",
            "QuantizedArray",
            "quantize_array",
            "prepack_quantized_array",
            "dense_quantized_matmul",
            "clear_runtime_autotune_cache",
            "runtime_autotune_cache_sizes",
        ]
    )


@pytest.mark.lowest
@pytest.mark.parametrize(("mode", "bits"), MODES)
def test_round_trip(mode, bits):
    """Every mode: dequantize equals the reference's independent decoding, and the error is bounded (per value
    by half a step for affine; relatively for the codebooks)."""
    w = randn((32, 128))
    out = quantize(w, bits=bits, mode=mode, axis="col")
    zeros = out[2] if mode == "affine" else None
    back = dequantize(*out, bits=bits, mode=mode)
    b = bits or BITS[mode]
    assert back.dtype == jnp.float32 and back.shape == w.shape
    assert out[0].shape == (32, math.ceil(128 * b / 32)) and out[1].shape == (32, 128 // GROUP[mode])
    ref = dequantize_reference(out[0], out[1], zeros, group_size=GROUP[mode], bits=b, mode=mode)
    np.testing.assert_array_equal(np.asarray(back), ref)
    if mode == "affine":
        groups = _groups(w, 64)
        step = (groups.max(-1) - groups.min(-1)) / (2**bits - 1)  # the scale s
        error = np.abs(_groups(back, 64) - groups)
        assert np.all(error <= step[..., None] * (0.5 + 1e-4))
    else:
        err = float(jnp.linalg.norm(back - w) / jnp.linalg.norm(w))
        assert err < FP_ERROR[mode], err


def test_packing_layout_by_hand():
    """LSB-first bit stream; widths 3 and 5 put a code across two words (low bits first)."""
    cases = [
        (3, [1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 5], [0x511F58D1, 0x1]),  # code 10 = 0b101: bits 30-31 <- 01, word 1 <- 1
        (5, [31, 0, 17, 3, 8, 21, 26], [0xAA81C41F, 0x6]),  # code 6 = 0b11010: bits 30-31 <- 10, word 1 <- 110
        (4, [0, 1, 2, 3, 4, 5, 6, 7, 8], [0x76543210, 0x8]),
        (8, [1, 2, 3, 4, 5], [0x04030201, 0x5]),
        (1, [1, 0, 1, 1], [0xD]),
    ]
    for bits, codes, words in cases:
        packed = pack_codes(jnp.asarray([codes], jnp.uint32), bits)
        assert [int(v) for v in packed[0]] == words, bits
        expected = np.asarray([codes])
        for policy in ("auto", "generic"):
            np.testing.assert_array_equal(
                unpack_codes(jnp.asarray([words], jnp.uint32), bits, len(codes), policy), expected
            )
        np.testing.assert_array_equal(unpack_reference(np.asarray([words], np.uint32), bits, len(codes)), expected)


def test_quantize_packs_affine_codes_in_place():
    """Groups spanning exactly 0..2^b-1 have s = 1 and z = 0: the codes are the values, packed as by hand."""
    codes = np.array([[5, 0, 7, 1, 6, 2, 3, 4, 7, 0, 2, 2, 1, 5, 6, 3] * 2], np.uint32)
    w_q, scales, zeros = quantize(jnp.asarray(codes, jnp.float32), group_size=16, bits=3, axis="col")
    np.testing.assert_array_equal(np.asarray(scales), 1.0)
    np.testing.assert_array_equal(np.asarray(zeros), 0.0)
    np.testing.assert_array_equal(np.asarray(w_q), np.asarray(pack_codes(jnp.asarray(codes), 3)))
    assert w_q.shape == (1, 3)  # 32 codes of 3 bits: 96 bits


def test_code_tables():
    np.testing.assert_array_equal(E2M1[:8], [0, 0.5, 1, 1.5, 2, 3, 4, 6])
    np.testing.assert_array_equal(E2M1[8:], -E2M1[:8])
    assert E4M3[0x7E] == 448 and E4M3[0x01] == 2.0**-9 and E4M3[0x08] == 2.0**-6 and E4M3[0x38] == 1.0
    assert E4M3[0xB8] == -1.0 and np.isnan(E4M3[0x7F]) and np.isnan(E4M3[0xFF])
    assert np.nanmax(E4M3) == 448 and np.sum(np.isnan(E4M3)) == 2
    np.testing.assert_array_equal(NF4, NF4_VALUES)
    assert NF4.dtype == np.float32 and NF4[0] == -1 and NF4[7] == 0 and NF4[15] == 1 and np.all(np.diff(NF4) > 0)


def test_nearest_code_rules():
    """mxfp8: exponent e = ceil(log2(max/448)) stored as an int8 byte, midpoints to the smaller magnitude;
    nvfp4: the scale is the nearest E4M3 value, and values past 6 times it saturate (never a NaN code)."""
    row = jnp.asarray([[224.0, 5.0, 4.25, -4.25, 0.0, 1e-9] + [0.0] * 26], jnp.float32)
    w_q, scales = quantize(row, mode="mxfp8", axis="col")
    assert int(scales[0, 0]) == 0xFF  # e = ceil(log2(224/448)) = -1, stored as the byte 255
    codes = np.asarray(unpack_codes(w_q, 8, 32))[0]
    # 4.25 * 2 = 8.5 lies midway between E4M3 8 and 9: it goes to 8 (and -8.5 to -8).
    np.testing.assert_array_equal(E4M3[codes[:6]] * 2.0**-1, [224.0, 5.0, 4.0, -4.0, 0.0, 0.0])
    big = jnp.asarray([[1.0] * 15 + [7.0]], jnp.float32)  # nvfp4: σ = nearest e4m3(7/6) = 1.125
    w_q, scales = quantize(big, mode="nvfp4", axis="col")
    assert E4M3[int(scales[0, 0])] == 1.125
    assert float(dequantize(w_q, scales, mode="nvfp4")[0, 15]) == 6 * 1.125  # 7/1.125 = 6.2 saturates at 6


def test_nvfp_small_weights_keep_their_values():
    """σ ≈ 0.02 weights get scale codes >= 0x01 (upstream rounds them to 0), so nvfp8 does not turn them into
    zeros; an all-zero group gets scale code 0 and decodes to zeros."""
    w = randn((16, 64), scale=0.02).at[3, :16].set(0.0)
    for mode in ("nvfp8", "nvfp4"):
        w_q, scales = quantize(w, mode=mode, axis="col")
        back = dequantize(w_q, scales, mode=mode)
        assert int(scales[3, 0]) == 0 and bool(jnp.all(back[3, :16] == 0))
        assert int(jnp.sum(scales == 0)) == 1
        assert float(jnp.mean(back != 0)) > 0.9
        assert float(jnp.linalg.norm(back - w) / jnp.linalg.norm(w)) < FP_ERROR[mode]


def test_affine_narrow_range_groups_stay_finite():
    """Norm-like weights (|min| far above the range): float32 scales and zeros, finite values, half-step error."""
    w = 100.0 + randn((8, 64), scale=1e-3)
    w_q, scales, zeros = quantize(w, bits=8, axis="col")
    assert scales.dtype == zeros.dtype == jnp.float32
    assert bool(jnp.all(jnp.isfinite(scales))) and bool(jnp.all(jnp.isfinite(zeros)))
    back = dequantize(w_q, scales, zeros, bits=8)
    assert bool(jnp.all(jnp.isfinite(back)))
    # Half a step, plus float32 rounding of (q - z) with |z| ~ 1e7.
    assert float(jnp.max(jnp.abs(back - w) / scales)) < 1.5


def test_dequantize_is_differentiable_in_the_metadata():
    """d/dz Σ (q - z)·s = -g·s and d/ds Σ (q - z)·s = Σ (q - z), per group."""
    w_q, scales, zeros = quantize(randn((4, 64)), group_size=16, axis="col")
    loss = lambda s, z: jnp.sum(dequantize(w_q, s, z, group_size=16))
    d_scales, d_zeros = jax.grad(loss, argnums=(0, 1))(scales, zeros)
    assert_close(d_zeros, -16 * scales)
    assert_close(d_scales, jnp.sum(dequantize(w_q, jnp.ones_like(scales), zeros, group_size=16).reshape(4, 4, 16), -1))


def test_row_axis_dequantizes_to_the_transpose():
    """`dequantize(*quantize(w, axis="row"))` is w with its last two axes swapped; col keeps the shape."""
    w = randn((2, 64, 32))
    row = dequantize(*quantize(w, bits=8, group_size=16), bits=8, group_size=16)
    assert row.shape == (2, 32, 64)
    assert_close(row, jnp.swapaxes(w, -1, -2), tol=5e-3)
    col = dequantize(*quantize(w, bits=8, group_size=16, axis="col"), bits=8, group_size=16, axis="col")
    assert col.shape == w.shape
    assert_close(col, w, tol=5e-3)


def test_prepack_under_jit_with_static_options():
    kernel = randn((64, 128), jnp.bfloat16)
    packed = jax.jit(prepack_quantized_weights, static_argnames=("group_size", "bits", "mode", "transpose"))
    # transpose=False packs kernel[in, out] grouped along out; transpose=True packs kernelᵀ grouped along in.
    for mode, transpose, shape in (("affine", False, (64, 16)), ("nf4", True, (128, 8))):
        out = packed(kernel, group_size=64, bits=4, mode=mode, transpose=transpose)
        eager = prepack_quantized_weights(kernel, group_size=64, bits=4, mode=mode, transpose=transpose)
        for a, b in zip(out, eager, strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert out[0].shape == shape and out[0].dtype == jnp.uint32
        assert out[1].dtype == (jnp.float32 if mode == "affine" else jnp.bfloat16)  # nf4: the input's dtype


def test_runtime_config():
    w = randn((16, 64))
    meta = QuantRuntimeConfig(affine_metadata_dtype="bf16", dequant_output_dtype="bf16")
    w_q, scales, zeros = quantize(w, axis="col", runtime_config=meta)
    assert scales.dtype == zeros.dtype == jnp.bfloat16
    back = dequantize(w_q, scales, zeros, runtime_config=meta)
    assert back.dtype == jnp.bfloat16
    exact = dequantize_reference(w_q, scales, zeros, group_size=64, bits=4, mode="affine")
    assert_close(back, exact, tol=5e-3)  # codes made from the bf16-rounded metadata
    compute = QuantRuntimeConfig(prefer_compute_dtype="fp16", dequant_output_dtype="compute")
    assert dequantize(w_q, scales, zeros, runtime_config=compute).dtype == jnp.float16
    generic = QuantRuntimeConfig(dequant_unpack_policy="generic")
    np.testing.assert_array_equal(
        dequantize(w_q, scales, zeros, runtime_config=generic), dequantize(w_q, scales, zeros)
    )
    for mode in ("nf4", "nvfp8"):  # nearest codes by distance to every code: the same codes
        by_distance = quantize(
            w, mode=mode, axis="col", runtime_config=QuantRuntimeConfig(enable_threshold_codebook=False)
        )
        for a, b in zip(by_distance, quantize(w, mode=mode, axis="col"), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    Q.clear_runtime_autotune_cache()
    assert Q.runtime_autotune_cache_sizes() == (0, 0)


@pytest.mark.lowest
def test_quantized_array_and_dense_matmul():
    kernel, x = randn((64, 32)), randn((3, 64))
    qa = prepack_quantized_array(kernel, mode="nf4", group_size=16, transpose=False)
    assert isinstance(qa, QuantizedArray) and qa.axis == "col" and qa.zeros is None and len(qa.as_tuple()) == 2
    roundtrip = jax.jit(lambda a: a)(qa)  # a pytree: arrays are leaves, the format is static
    assert roundtrip.mode == "nf4" and roundtrip.group_size == 16
    assert_close(roundtrip.dequantize(), dequantize(*qa.as_tuple(), mode="nf4", group_size=16))
    y = dense_quantized_matmul(x, qa.data, qa.scales, mode="nf4", group_size=16)
    assert y.dtype == jnp.float32 and y.shape == (3, 32)
    assert_close(y, quantized_matmul_reference(x, qa.data, qa.scales, mode="nf4", group_size=16))
    qb = quantize_array(kernel, bits=8, group_size=16)
    assert qb.axis == "row" and qb.data.shape == (32, 16)
    assert_close(dense_quantized_matmul(x, *qb.as_tuple(), bits=8, group_size=16, axis="col"), x @ kernel, tol=1e-2)


FAST = QuantRuntimeConfig(dequant_unpack_policy="fast")


def _bad_packed():
    w_q, scales, zeros = quantize(randn((4, 64)), axis="col")
    return w_q, scales, zeros


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: quantize(randn((4, 64)), mode="mxfp"), "mode"),
        (lambda: quantize(randn((4, 64)), mode="nvfp"), "mode"),
        (lambda: quantize(randn((4, 64)), mode="int4"), "mode"),
        (lambda: quantize(randn((4, 64)), mode=4), "mode"),
        (lambda: quantize(randn((4, 64)), group_size=48, axis="col"), "group_size"),
        (lambda: quantize(randn((4, 64)), group_size=True, axis="col"), "group_size"),
        (lambda: quantize(randn((4, 64)), mode="mxfp4", group_size=64, axis="col"), "group_size"),
        (lambda: quantize(randn((4, 64)), mode="nvfp8", group_size=32, axis="col"), "group_size"),
        (lambda: quantize(randn((4, 64)), bits=0, axis="col"), "bits"),
        (lambda: quantize(randn((4, 64)), bits=9, axis="col"), "bits"),
        (lambda: quantize(randn((4, 64)), bits=4.0, axis="col"), "bits"),
        (lambda: quantize(randn((64,))), "rank"),
        (lambda: quantize(jnp.ones((4, 64), jnp.int32), axis="col"), "floating"),
        (lambda: quantize(randn((4, 96))), "group_size=64 must divide"),
        (lambda: quantize(randn((4, 64)), axis="diag"), "axis"),
        (lambda: quantize(randn((4, 64)), axis="col", runtime_config={"x": 1}), "runtime_config"),
        (lambda: QuantRuntimeConfig(affine_metadata_dtype="fp8"), "affine_metadata_dtype"),
        (lambda: QuantRuntimeConfig(dequant_unpack_policy="slow"), "dequant_unpack_policy"),
        (lambda: prepack_quantized_weights(randn((64, 64)), transpose="yes"), "transpose"),
        (lambda: dequantize(*_bad_packed()[:2]), "zeros is required"),
        (lambda: dequantize(*_bad_packed(), mode="nf4"), "zeros must be None"),
        (lambda: dequantize(_bad_packed()[0].astype(jnp.int32), *_bad_packed()[1:]), "w_q must be uint32"),
        (lambda: dequantize(_bad_packed()[0][:, :4], *_bad_packed()[1:]), "w_q must have 8 words"),
        (lambda: dequantize(*_bad_packed()[:2], _bad_packed()[2][:2]), "zeros must have the shape"),
        (lambda: dequantize(_bad_packed()[0], _bad_packed()[1].astype(jnp.uint8), _bad_packed()[2]), "scales must be"),
        (lambda: dequantize(_bad_packed()[0], _bad_packed()[1], mode="mxfp4"), "scales must be uint8"),
        (lambda: dequantize(_bad_packed()[0][:2], *_bad_packed()[1:]), "must agree"),
        (lambda: dequantize(*_bad_packed(), axis="rows"), "axis"),
        (lambda: dequantize(*quantize(randn((4, 64)), bits=3, axis="col"), bits=3, runtime_config=FAST), "'fast'"),
        (lambda: solve_lloyd_max(0), "bits"),
        (lambda: solve_lloyd_max(2, dim=1, use_gaussian_approx=False), "dim"),
        (lambda: generate_rotation_matrix(0, 0), "head_dim"),
        (lambda: generate_projection_matrix(0, 0, 8), "projection_dim"),
    ],
)
def test_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_lloyd_max_codebook():
    """Sorted, symmetric centroids; boundaries at midpoints; the known Gaussian optima (1 bit: ±σ√(2/π);
    2 bits: ±0.4528σ, ±1.5104σ); the exact density for a small dim differs from the Gaussian."""
    sigma = 1 / math.sqrt(128)
    one = solve_lloyd_max(1)
    assert isinstance(one, LloydMaxCodebook) and one.n_levels == 2 and one.dim == 128
    np.testing.assert_allclose(
        one.centroids, [-sigma * math.sqrt(2 / math.pi), sigma * math.sqrt(2 / math.pi)], rtol=1e-6
    )
    two = solve_lloyd_max(2)
    np.testing.assert_allclose(two.centroids / sigma, [-1.5104, -0.4528, 0.4528, 1.5104], atol=2e-4)
    for book in (solve_lloyd_max(4), solve_lloyd_max(3, dim=8, use_gaussian_approx=False)):
        c, b = book.centroids, book.boundaries
        assert c.dtype == b.dtype == np.float32 and c.shape == (book.n_levels,) and b.shape == (book.n_levels - 1,)
        assert np.all(np.diff(c) > 0)
        np.testing.assert_allclose(c, -c[::-1], atol=1e-7)
        np.testing.assert_array_equal(b, (c[:-1] + c[1:]) / np.float32(2))
    exact, gaussian = solve_lloyd_max(3, dim=8, use_gaussian_approx=False), solve_lloyd_max(3, dim=8)
    assert np.all(np.abs(exact.centroids) < 1) and not np.allclose(exact.centroids, gaussian.centroids, rtol=1e-2)
    np.testing.assert_array_equal(
        solve_lloyd_max(3, dim=64, use_gaussian_approx=False).centroids, solve_lloyd_max(3, dim=64).centroids
    )


def test_rotation_and_projection_matrices():
    rotation = generate_rotation_matrix(7, 32)
    assert rotation.shape == (32, 32) and rotation.dtype == jnp.float32
    np.testing.assert_allclose(rotation @ rotation.T, np.eye(32), atol=2e-5)
    np.testing.assert_array_equal(rotation, generate_rotation_matrix(7, 32))  # a function of the seed
    assert not np.allclose(rotation, generate_rotation_matrix(8, 32))
    assert generate_rotation_matrix(7, 32, dtype=jnp.bfloat16).dtype == jnp.bfloat16
    projection = generate_projection_matrix(3, 64, 32)
    assert projection.shape == (64, 32)
    expected = jax.random.normal(jax.random.PRNGKey(3), (64, 32), jnp.float32) / 8.0
    np.testing.assert_allclose(projection, expected, rtol=1e-6)


def test_code_values_are_every_code_exactly_and_survive_xla():
    """`code_values` gives each of a format's 256 codes its value (NaN codes stay NaN), and a round trip through it
    is a lookup in the compiled program, not a float8 -> float32 conversion that XLA on a GPU may drop."""
    from ejkernel.kernels._common.scaled_codes import code_values

    for dtype in (jnp.float8_e4m3fn, jnp.float8_e5m2, jnp.int8):
        codes = jnp.asarray(np.arange(256, dtype=np.uint8).view(dtype))
        expected = np.asarray(codes).astype(np.float32)
        np.testing.assert_array_equal(np.asarray(code_values(codes)), expected)
    text = jax.jit(lambda x: code_values(x.astype(jnp.float8_e4m3fn))).lower(jnp.ones(8)).as_text()
    assert "gather" in text
