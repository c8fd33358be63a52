"""The Mosaic GPU decode quantized matmul on this CPU host: it lowers to Mosaic GPU for CUDA (both layouts, every
8-bit mode), runs correctly in Mosaic GPU's interpret mode against the reference (forward and ∂x), and declines
what it does not serve; (GPU suite) the compiled kernel matches the XLA path at decode shapes.

Lowering catches layout, TMA and shared-memory errors (Mosaic checks them as it lowers); interpret mode checks
the ring's barrier protocol (every phase observed, no race on shared memory) and the numbers, not layouts or
wgmma's asynchrony, which only the GPU suite checks.
"""

import functools
import importlib

import jax
import jax.numpy as jnp
import pytest
from jax import export

from ejkernel import kernel_registry
from ejkernel.kernels._pallas.gpu.quantized_matmul import _interface as interface
from ejkernel.kernels._pallas.gpu.quantized_matmul import quantized_matmul_mosaic_gpu
from ejkernel.kernels._pallas.gpu.quantized_matmul._interface import mosaic_quantized_matmul
from ejkernel.modules import QuantizedMatmul, QuantizedMatmulConfig, QuantizedMatmulMosaicTiling, quantized_matmul
from ejkernel.modules.operations.quantized_matmul import IMPLEMENTATIONS
from ejkernel.ops import Invocation
from ejkernel.quantization import prepack_quantized_weights
from ejkernel.quantization.modes import resolve_params
from ejkernel.reference.quantized_matmul import quantized_matmul_reference
from ejkernel.registry import Backend
from harness import assert_close, check_forward_and_grads, randn
from mosaic_gpu_interpret import interpret_mode

MODES = [("affine", 8), ("mxfp8", None), ("nvfp8", None)]


def _case(mode, bits, transpose, m, k, n, group=None, dtype=jnp.bfloat16):
    """`(x [M, K], (w, scales, zeros), options)` for the kernel and the reference."""
    params = resolve_params(mode, group, bits)
    packed = prepack_quantized_weights(randn((k, n)), group_size=group, bits=bits, mode=mode, transpose=transpose)
    weights = (*packed, None) if len(packed) == 2 else packed
    options = dict(transpose=transpose, group_size=params.group_size, bits=params.bits, mode=params.mode)
    return randn((m, k), dtype), weights, options


def _cfg(block_k=128, stages=2, splits=2):
    return QuantizedMatmulConfig(mosaic_tiling=QuantizedMatmulMosaicTiling(block_k, stages, splits))


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize(("mode", "bits"), MODES)
def test_lowers_for_cuda(mode, bits, transpose):
    """The decode shape (16 rows, K = N = 8192, bf16) at the default tiles lowers to one Mosaic GPU kernel."""
    params = resolve_params(mode, None, bits)
    shape = jax.ShapeDtypeStruct
    scales = shape((8192, 8192 // params.group_size), jnp.float32 if params.float_scales else jnp.uint8)
    args = [shape((16, 8192), jnp.bfloat16), shape((8192, 2048), jnp.uint32), scales]
    args += [scales] if mode == "affine" else []
    options = dict(transpose=transpose, group_size=params.group_size, bits=params.bits, mode=params.mode)
    cfg = QuantizedMatmulConfig(mosaic_tiling=QuantizedMatmulMosaicTiling())  # (the defaults, never declined)
    fn = jax.jit(functools.partial(mosaic_quantized_matmul, cfg=cfg, **options))
    assert export.export(fn, platforms=["cuda"])(*args).mlir_module().count("@mosaic_gpu") == 1


# mode, bits, transpose, M, K, N, group, block_k, x dtype
INTERPRET = [
    ("affine", 8, True, 5, 512, 128, 64, 64, "bfloat16"),  # scales after the product: a group a step, 2 splits
    ("affine", 8, True, 20, 1024, 128, 64, 128, "float16"),  # scales after: two groups a step, 32 padded tokens
    ("affine", 8, True, 40, 256, 128, 64, 128, "bfloat16"),  # 48 tokens: scales applied to the codes
    ("affine", 8, False, 16, 256, 256, 128, 64, "bfloat16"),  # decoded through shared memory, inside a group, 2 CTAs
    ("mxfp8", None, False, 3, 512, 128, None, 64, "bfloat16"),  # two groups across a tile's features, 2 splits
    ("nvfp8", None, True, 20, 256, 128, None, 128, "bfloat16"),  # eight groups a step, 32 padded tokens
]


@pytest.mark.parametrize(("mode", "bits", "transpose", "m", "k", "n", "group", "block_k", "dtype"), INTERPRET)
def test_interpret_matches_reference(mode, bits, transpose, m, k, n, group, block_k, dtype, capfd):
    x, weights, options = _case(mode, bits, transpose, m, k, n, group, jnp.dtype(dtype))
    with interpret_mode():
        y = mosaic_quantized_matmul(x, *weights, cfg=_cfg(block_k), **options)
    assert y.dtype == jnp.float32 and y.shape == (m, n)
    assert_close(y, quantized_matmul_reference(x, *weights, **options), jnp.dtype(dtype))
    assert "RACE DETECTED" not in capfd.readouterr().out


def test_interpret_gradient_wrt_x(capfd):
    """∂x (the plain-JAX transposed product) against the reference's autodiff, in x's dtype (float16)."""
    x, (w, scales, zeros), options = _case("affine", 8, False, 4, 256, 128, 64, jnp.float16)
    fn = lambda x: mosaic_quantized_matmul(x, w, scales, zeros, cfg=_cfg(64, 3, 1), **options)
    ref = lambda x: quantized_matmul_reference(x, w, scales, zeros, **options)
    with interpret_mode():
        check_forward_and_grads(fn, ref, [x], (0,), jnp.float16)
        assert jax.grad(lambda x: jnp.sum(fn(x)))(x).dtype == jnp.float16
    assert "RACE DETECTED" not in capfd.readouterr().out


def test_declines_what_it_does_not_serve():
    x, weights, options = _case("affine", 8, True, 5, 256, 128, 64)
    call = functools.partial(mosaic_quantized_matmul, cfg=QuantizedMatmulConfig(), **options)
    with pytest.raises(NotImplementedError, match="bfloat16/float16 x, got float32"):
        call(x.astype(jnp.float32), *weights)
    with pytest.raises(NotImplementedError, match="1 to 64 rows of x"):
        call(jnp.ones((65, 256), jnp.bfloat16), *weights)
    four = _case("affine", 4, True, 5, 256, 128, 64)
    with pytest.raises(NotImplementedError, match=r"8-bit codes .* got affine 4-bit"):
        mosaic_quantized_matmul(four[0], *four[1], cfg=QuantizedMatmulConfig(), **four[2])
    narrow = _case("affine", 8, True, 5, 256, 64, 64)
    with pytest.raises(NotImplementedError, match="N a multiple of 128"):
        mosaic_quantized_matmul(narrow[0], *narrow[1], cfg=QuantizedMatmulConfig(), **narrow[2])
    with pytest.raises(
        NotImplementedError, match=r"affine transposed weights at 5 rows were not measured faster than Triton"
    ):
        call(x, *weights)  # (declined unless the config names the kernel's tiles)
    with pytest.raises(NotImplementedError, match="needs a Hopper GPU"):
        quantized_matmul_mosaic_gpu(x, *weights, cfg=_cfg(), fuse=True, **options)
    with pytest.raises(ValueError, match=r"QuantizedMatmulMosaicTiling\.block_k must be a positive int"):
        QuantizedMatmulMosaicTiling(block_k=0)


def test_registered_first_and_autotune_candidates_fit(monkeypatch):
    """First on a GPU; every autotuning candidate plans within shared memory at decode shapes, both layouts."""
    assert [impl.platform.value for impl in IMPLEMENTATIONS] == ["pallas", "triton", "xla"]
    assert kernel_registry.get("quantized_matmul", "pallas", "gpu") is quantized_matmul_mosaic_gpu
    op = QuantizedMatmul()
    module = importlib.import_module(
        "ejkernel.modules.operations.quantized_matmul"
    )  # (the package exports the function)
    monkeypatch.setattr(module, "current_backend", lambda: Backend.GPU)
    x, weights, options = _case("affine", 8, True, 16, 256, 128, 64)
    cfgs = list(op.platform_cfgs("pallas", Invocation("quantized_matmul", (x, *weights), options, "pallas")))
    tilings = [c.mosaic_tiling for c in cfgs if c.mosaic_tiling is not None]
    assert len(tilings) > 2 and all(c.platform == "pallas" for c in cfgs)
    params = resolve_params("affine", 64, 8)
    for cfg in cfgs:
        for transpose in (False, True):
            for m in (16, 64):
                st, tiling = interface.plan(cfg, params, transpose, m, 8192, 8192, jnp.bfloat16)
                assert interface.smem_fits(st, tiling) and tiling.splits >= 1


def test_plan_scales_after_the_product_where_it_pays_and_fits():
    """Affine codes with transpose take the scales after the product up to 32 tokens, their steps cut to hold
    `SCALE_AFTER_PART_VALUES` group products; the untransposed layout and more tokens scale the codes."""
    params, cfg = resolve_params("affine", 64, 8), QuantizedMatmulConfig(mosaic_tiling=QuantizedMatmulMosaicTiling())
    planned = {
        (transpose, m): interface.plan(cfg, params, transpose, m, 8192, 8192, jnp.bfloat16)
        for transpose, m in [(True, 16), (True, 32), (True, 48), (False, 16)]
    }
    summary = {key: (st.scale_after, tiling.block_k) for key, (st, tiling) in planned.items()}
    assert summary == {
        (True, 16): (True, 256),
        (True, 32): (True, 128),
        (True, 48): (False, 256),
        (False, 16): (False, 128),
    }


# ---- GPU suite: the compiled kernel against the XLA implementation ----


@pytest.mark.gpu
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize(("mode", "bits"), MODES)
@pytest.mark.parametrize("m", [16, 64])
def test_gpu_matches_xla(mode, bits, transpose, m):
    """The default tiles (named, so that no call declines as measured slower) against XLA: K = 2048 in 8 steps.

    Affine codes with transpose at 16 rows take the scales after the product and round no dequantized value, which
    XLA rounds to bfloat16 (1.7e-3 of relative error apart at this shape); the other paths round as XLA does."""
    x, weights, options = _case(mode, bits, transpose, m, 2048, 2048)
    cfg = QuantizedMatmulConfig(platform="pallas", mosaic_tiling=QuantizedMatmulMosaicTiling())
    mosaic = jax.jit(functools.partial(quantized_matmul, cfg=cfg, **options))
    xla = jax.jit(functools.partial(quantized_matmul, platform="xla", **options))
    scale_after = mode == "affine" and transpose and m <= interface.SCALE_AFTER_MAX_TOKENS
    assert_close(mosaic(x, *weights), xla(x, *weights), tol=4e-3 if scale_after else 1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize(("mode", "transpose", "m"), [("affine", True, 64), ("mxfp8", False, 16)])
def test_gpu_auto_picks_mosaic_where_measured_faster_and_grads_match(mode, transpose, m):
    x, weights, options = _case(mode, 8, transpose, m, 2048, 2048, 64 if mode == "affine" else None)
    auto = jax.jit(functools.partial(quantized_matmul, **options))
    assert "mosaic_gpu" in auto.lower(x, *weights).as_text()
    xla = functools.partial(quantized_matmul, platform="xla", **options)
    check_forward_and_grads(lambda x: auto(x, *weights), lambda x: xla(x, *weights), [x], (0,), jnp.bfloat16)


@pytest.mark.gpu
def test_gpu_auto_leaves_measured_slower_calls_to_triton():
    x, weights, options = _case("affine", 8, True, 16, 2048, 2048, 64)
    auto = jax.jit(functools.partial(quantized_matmul, **options))
    assert "mosaic_gpu" not in auto.lower(x, *weights).as_text()
    assert_close(auto(x, *weights), quantized_matmul(x, *weights, platform="xla", **options), jnp.bfloat16)
