"""quantized_matmul: every mode and layout against the reference, knobs, gradient, errors, EasyDeL's calls."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ejkernel import kernel_registry
from ejkernel.kernels._xla.quantized_matmul._interface import quantized_matmul_xla
from ejkernel.modules import QuantizedMatmul, QuantizedMatmulConfig, QuantizedMatmulMosaicTiling, quantized_matmul
from ejkernel.ops import ConfigBase, KernelConfig
from ejkernel.quantization import prepack_quantized_weights
from ejkernel.reference.quantized_matmul import quantized_matmul_reference
from harness import assert_close, check_forward_and_grads, randn

MODES = [
    ("affine", 4),
    ("affine", 3),
    ("nf4", None),
    ("mxfp4", None),
    ("mxfp8", None),
    ("nvfp4", None),
    ("nvfp8", None),
]
TILED = QuantizedMatmulConfig(platform="xla", block_k=16, block_n=16)  # 40 packed rows: 3 tiles, the last padded
M, K, N = 5, 40, 128  # transpose=True swaps the roles: 40 output columns, contraction 128 (grouped)


def _packed(mode, bits, transpose, dtype=jnp.float32):
    """`(x, (w, scales, zeros), kernel)`: kernel [in, out] packed for the layout, x [M, in]."""
    k, n = (N, K) if transpose else (K, N)
    kernel = randn((k, n))
    out = prepack_quantized_weights(kernel, bits=bits, mode=mode, transpose=transpose)
    zeros = out[2] if len(out) == 3 else None
    return randn((M, k), dtype), (out[0], out[1], zeros), kernel


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize(("mode", "bits"), MODES)
def test_matches_reference(mode, bits, transpose):
    x, weights, kernel = _packed(mode, bits, transpose)
    y = quantized_matmul(x, *weights, transpose=transpose, bits=bits, mode=mode, cfg=TILED)
    assert y.dtype == jnp.float32 and y.shape == (M, kernel.shape[1])
    assert_close(y, quantized_matmul_reference(x, *weights, transpose=transpose, bits=bits, mode=mode))
    assert_close(y, x @ kernel, tol=0.25)  # and it is a product with (roughly) the kernel


def test_rows_split_over_a_mesh():
    """`mesh=`: the rows of x over 4 devices, the packed weights whole; a split of the packed columns is refused."""
    from jax.sharding import PartitionSpec as P

    x, weights, _ = _packed("affine", 4, False)
    x = jnp.concatenate([x] * 4)[:16]
    mesh = jax.make_mesh((4,), ("dp",), devices=jax.devices()[:4])
    y = quantized_matmul(x, *weights, mesh=mesh, in_specs=(P("dp"), P(), P(), P()), out_specs=P("dp"))
    assert_close(y, quantized_matmul_reference(x, *weights))
    with pytest.raises(ValueError, match="w's axis 1"):
        quantized_matmul(x, *weights, mesh=mesh, in_specs=(P("dp"), P(None, "dp"), P(), P()), out_specs=P("dp"))


def test_knobs_do_not_change_the_result(monkeypatch):
    x, weights, _ = _packed("affine", 5, False)
    call = lambda **kw: quantized_matmul(x, *weights, bits=5, **kw)
    expected = call(fuse=False)  # the dense path: dequantize, then one matmul
    assert_close(expected, quantized_matmul_reference(x, *weights, bits=5), tol=1e-6)
    for knobs in (
        {},
        {"cfg": TILED},
        {"cfg": TILED, "strict_fuse": True, "allow_dense_fallback": False, "tpu_path": "predecode"},
        {"use_best_config": True, "gemv_mode": "off", "revsplit_k": "off", "revsplit_k_parts": 4},
        {"platform": "xla", "tpu_path": "packed", "cfg": QuantizedMatmulConfig(block_k=8, tpu_path="hybrid")},
    ):
        assert_close(call(**knobs), expected, tol=1e-6, name=str(knobs))
    monkeypatch.setenv("EJKERNEL_QMM_STRICT_FUSED", "1")
    assert_close(call(), expected, tol=1e-6)
    with pytest.raises(ValueError, match="strict_fuse"):
        call(fuse=False)


def test_axis_overrides_transpose():
    x, weights, _ = _packed("nf4", None, True)
    expected = quantized_matmul(x, *weights, transpose=True, mode="nf4")
    np.testing.assert_array_equal(quantized_matmul(x, *weights, transpose=False, axis="col", mode="nf4"), expected)
    x, weights, _ = _packed("nf4", None, False)
    expected = quantized_matmul(x, *weights, transpose=False, mode="nf4")
    np.testing.assert_array_equal(quantized_matmul(x, *weights, transpose=True, axis="row", mode="nf4"), expected)


@pytest.mark.lowest
@pytest.mark.parametrize(("dtype", "transpose"), [(jnp.float32, False), (jnp.bfloat16, True)])
def test_gradient_wrt_x(dtype, transpose):
    """∂x against the reference's autodiff, in x's dtype; w, scales and zeros get zero cotangents."""
    x, (w, scales, zeros), _ = _packed("affine", 4, transpose, dtype)
    fn = lambda x, s, z: quantized_matmul(x, w, s, z, transpose=transpose, cfg=TILED)
    ref = lambda x, s, z: quantized_matmul_reference(x, w, scales, zeros, transpose=transpose)
    check_forward_and_grads(fn, ref, [x, scales, zeros], (0,), dtype)
    grads = jax.grad(lambda *a: jnp.sum(fn(*a) ** 2), argnums=(0, 1, 2))(x, scales, zeros)
    assert grads[0].dtype == dtype
    assert not bool(jnp.any(grads[1])) and not bool(jnp.any(grads[2]))


@pytest.mark.lowest
@pytest.mark.parametrize(
    ("mode", "bits", "extra"),
    [("affine", 8, {}), ("nf4", 4, {"allow_dense_fallback": False, "strict_fuse": False, "tpu_path": "predecode"})],
)
def test_easydel_call_forms(mode, bits, extra):
    """`prepack_quantized_weights(kernel, ..., transpose=False)` then EasyDeL's call, eager and under jit."""
    kernel, x = randn((64, 128)), randn((6, 64))
    packed = prepack_quantized_weights(kernel, group_size=64, bits=bits, mode=mode, transpose=False)
    wq, scales, zeros = packed if mode == "affine" else (*packed, None)

    def call(x, wq, scales, zeros):
        return quantized_matmul(
            x,
            wq,
            scales,
            zeros,
            transpose=False,
            group_size=64,
            bits=bits,
            mode=mode,
            fuse=True,
            platform="auto",
            use_best_config=True,
            **extra,
        )

    y = call(x, wq, scales, zeros)
    assert_close(y, quantized_matmul_reference(x, wq, scales, zeros, group_size=64, bits=bits, mode=mode))
    assert_close(y, x @ kernel, tol=0.1)
    np.testing.assert_allclose(jax.jit(call)(x, wq, scales, zeros), y, rtol=1e-5, atol=1e-5)


def test_leading_dims_and_single_row():
    """x [..., K]: leading dims are flattened into M and restored; gemv_mode="on" takes one row."""
    x, weights, _ = _packed("mxfp4", None, False)
    x3 = jnp.stack([x, 2 * x])
    y3 = quantized_matmul(x3, *weights, mode="mxfp4")
    assert y3.shape == (2, M, N)
    assert_close(y3[1], 2 * quantized_matmul(x, *weights, mode="mxfp4"))
    one = quantized_matmul(x[:1], *weights, mode="mxfp4", gemv_mode="on")
    assert_close(one, quantized_matmul_reference(x[:1], *weights, mode="mxfp4"))


def test_empty_inputs():
    """No rows of x, or no output columns: float32 zeros of the right shape."""
    x, weights, _ = _packed("affine", 4, False)
    assert quantized_matmul(x[:0], *weights, cfg=TILED).shape == (0, N)
    x, (w, scales, zeros), _ = _packed("affine", 4, True)
    y = quantized_matmul(x, w[:0], scales[:0], zeros[:0], transpose=True, cfg=TILED)
    assert y.shape == (M, 0) and y.dtype == jnp.float32


def test_autotuned_tiling(monkeypatch):
    """With the autotune policy, `use_best_config` times the candidate tilings; the result is the same."""
    monkeypatch.setenv("EJKERNEL_AUTOTUNE_POLICY", "autotune")
    x, weights, _ = _packed("nvfp4", None, True)
    y = quantized_matmul(x, *weights, transpose=True, mode="nvfp4", use_best_config=True)
    assert_close(y, quantized_matmul_reference(x, *weights, transpose=True, mode="nvfp4"))


def test_config_kernel_and_registration():
    base = [f.name for f in dataclasses.fields(KernelConfig)]
    own = [f.name for f in dataclasses.fields(QuantizedMatmulConfig)][len(base) :]
    upstream = ["block_m", "block_n", "block_k", "num_warps", "num_stages", "use_bf16", "split_k", "tpu_path"]
    assert own == [*upstream, "mosaic_tiling"]  # upstream's fields in order, then the Mosaic GPU kernel's tiles
    cfg = QuantizedMatmulConfig(platform="xla", backend="any", block_m=64, use_bf16=False, split_k=2, tpu_path="packed")
    tiled = QuantizedMatmulConfig(platform="pallas", mosaic_tiling=QuantizedMatmulMosaicTiling(block_k=64, split_k=2))
    for c in (cfg, tiled):
        assert ConfigBase.from_json(c.to_json()) == c and hash(c) == hash(ConfigBase.from_json(c.to_json()))
    defaults = {name: getattr(QuantizedMatmulConfig(), name) for name in ("platform", "backend", *own)}
    assert defaults == dict(
        platform="auto", backend="any", block_m=128, block_n=128, block_k=64, num_warps=4, num_stages=3
    ) | dict(use_bf16=True, split_k=None, tpu_path=None, mosaic_tiling=None)
    assert QuantizedMatmul().op_id == "quantized_matmul" and QuantizedMatmul.config_type is QuantizedMatmulConfig
    assert kernel_registry.get("quantized_matmul", "xla") is quantized_matmul_xla


def _args(mode="affine", transpose=False):
    x, weights, _ = _packed(mode, None, transpose)
    return x, *weights


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda x, w, s, z: quantized_matmul(x, w.astype(jnp.int32), s, z), "w must be uint32"),
        (lambda x, w, s, z: quantized_matmul(x, w, s.astype(jnp.uint8), z), "scales must be floating"),
        (lambda x, w, s, z: quantized_matmul(x, w, s, z[:, :1]), "zeros must have the shape"),
        (lambda x, w, s, z: quantized_matmul(x, w, s), "zeros is required"),
        (lambda x, w, s, z: quantized_matmul(x, w, s, z, mode="nf4"), "zeros must be None"),
        (lambda x, w, s, z: quantized_matmul(x, w, s, z, mode="mxfp4"), "scales must be uint8"),
        (lambda x, w, s, z: quantized_matmul(x[:, :32], w, s, z), "w must be \\[K, words\\]"),
        (lambda x, w, s, z: quantized_matmul(x, w, s, z, transpose=True), "scales .* must be \\[N, K/g\\]"),
        (lambda x, w, s, z: quantized_matmul(x, w[:, :8], s, z), "w must have 16 words"),
        (lambda x, w, s, z: quantized_matmul(x, w[None], s, z), "w must be 2-D"),
        (lambda x, w, s, z: quantized_matmul(x.astype(jnp.int32), w, s, z), "x must be a floating"),
        (lambda x, w, s, z: quantized_matmul(x[0], w, s, z), "x must be \\[M, K\\]"),
        (lambda x, w, s, z: quantized_matmul(x, w, s, z, strict_fuse=True, allow_dense_fallback=True), "strict_fuse"),
        (lambda x, w, s, z: quantized_matmul(x, w, s, z, strict_fuse=True, fuse=False), "strict_fuse"),
        (lambda x, w, s, z: quantized_matmul(x, w, s, z, tpu_path="fast"), "tpu_path"),
        (lambda x, w, s, z: quantized_matmul(x, w, s, z, gemv_mode="maybe"), "gemv_mode"),
        (lambda x, w, s, z: quantized_matmul(x, w, s, z, gemv_mode="on"), "gemv_mode='on'"),
        (lambda x, w, s, z: quantized_matmul(x, w, s, z, revsplit_k="sometimes"), "revsplit_k"),
        (lambda x, w, s, z: quantized_matmul(x, w, s, z, bits=8, revsplit_k="on"), "revsplit_k='on'"),
        (lambda x, w, s, z: quantized_matmul(x, w, s, z, revsplit_k_parts=3), "revsplit_k_parts"),
        (lambda x, w, s, z: quantized_matmul(x, w, s, z, fuse="yes"), "fuse"),
        (lambda x, w, s, z: quantized_matmul(x, w, s, z, mode="mxfp"), "mode"),
        (lambda x, w, s, z: quantized_matmul(x, w, s, z, group_size=48), "group_size"),
        (lambda x, w, s, z: quantized_matmul(x, w, s, z, bits=9), "bits"),
        (lambda x, w, s, z: quantized_matmul(x, w, s, z, axis="diag"), "axis"),
        (lambda x, w, s, z: quantized_matmul(x, w, s, z, platform="tpu"), "platform"),
        (lambda x, w, s, z: QuantizedMatmulConfig(block_k=48), "block_k"),
        (lambda x, w, s, z: QuantizedMatmulConfig(use_bf16=1), "use_bf16"),
        (lambda x, w, s, z: QuantizedMatmulConfig(split_k=0), "split_k"),
        (lambda x, w, s, z: QuantizedMatmulConfig(tpu_path="fast"), "tpu_path"),
    ],
)
def test_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call(*_args())
