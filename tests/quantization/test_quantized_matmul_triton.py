"""The Triton quantized matmul: every mode in both layouts against the reference (Pallas interpret mode), the
gradient, what it declines, CUDA lowering at decode shapes, and (GPU suite) the compiled kernel against XLA."""

import functools

import jax
import jax.numpy as jnp
import pytest

from ejkernel import kernel_registry
from ejkernel.kernels._triton.quantized_matmul import quantized_matmul_triton
from ejkernel.kernels._xla.quantized_matmul import quantized_matmul_xla
from ejkernel.modules import QuantizedMatmul, QuantizedMatmulConfig, quantized_matmul
from ejkernel.modules.operations.quantized_matmul import IMPLEMENTATIONS
from ejkernel.ops import Invocation
from ejkernel.quantization import prepack_quantized_weights
from ejkernel.quantization.modes import resolve_params
from ejkernel.reference.quantized_matmul import quantized_matmul_reference
from harness import assert_close, check_forward_and_grads, randn

pytestmark = pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")

# mode, bits, transpose, M, K, N, group, block_n, block_k, split_k, x dtype
CASES = [
    ("affine", 4, False, 5, 40, 96, 32, 64, 32, 2, jnp.float32),  # partial K and N tiles, two splits
    ("affine", 4, True, 16, 128, 40, 32, 32, 64, None, jnp.bfloat16),  # partial tile of packed rows
    ("affine", 8, False, 1, 64, 128, 128, 64, 32, None, jnp.float32),  # a column tile inside one group
    ("affine", 8, True, 5, 256, 32, 128, 16, 64, 3, jnp.bfloat16),  # the third split has no step
    ("nf4", None, False, 16, 48, 64, 16, 32, 16, None, jnp.bfloat16),
    ("nf4", None, True, 1, 64, 24, 64, 16, 32, None, jnp.float32),
    ("mxfp4", None, False, 5, 32, 96, None, 64, 16, None, jnp.float32),
    ("mxfp4", None, True, 16, 96, 16, None, 16, 64, None, jnp.bfloat16),
    ("mxfp8", None, False, 1, 24, 64, None, 32, 16, None, jnp.bfloat16),
    ("nvfp4", None, True, 5, 64, 48, None, 32, 32, 2, jnp.float32),
    ("nvfp8", None, False, 16, 32, 48, None, 64, 16, None, jnp.float32),
]


def _case(mode, bits, transpose, m, k, n, group, dtype):
    """`(x [M, K], (w, scales, zeros), options)` for `quantized_matmul_triton` and the reference."""
    params = resolve_params(mode, group, bits)
    packed = prepack_quantized_weights(randn((k, n)), group_size=group, bits=bits, mode=mode, transpose=transpose)
    weights = (*packed, None) if len(packed) == 2 else packed
    options = dict(transpose=transpose, group_size=params.group_size, bits=params.bits, mode=params.mode)
    return randn((m, k), dtype), weights, options


def _triton(cfg=None, **options):
    cfg = QuantizedMatmulConfig() if cfg is None else cfg
    return functools.partial(quantized_matmul_triton, cfg=cfg, fuse=True, interpret=True, **options)


@pytest.mark.parametrize(
    ("mode", "bits", "transpose", "m", "k", "n", "group", "block_n", "block_k", "split_k", "dtype"), CASES
)
def test_matches_reference(mode, bits, transpose, m, k, n, group, block_n, block_k, split_k, dtype):
    x, weights, options = _case(mode, bits, transpose, m, k, n, group, dtype)
    cfg = QuantizedMatmulConfig(block_n=block_n, block_k=block_k, split_k=split_k)
    y = _triton(cfg, **options)(x, *weights)
    assert y.dtype == jnp.float32 and y.shape == (m, n)
    assert_close(y, quantized_matmul_reference(x, *weights, **options), dtype)


@pytest.mark.parametrize(("mode", "transpose", "dtype"), [("affine", False, jnp.float32), ("nf4", True, jnp.bfloat16)])
def test_gradient_wrt_x(mode, transpose, dtype):
    """∂x (the plain-JAX transposed product) against the reference's autodiff, in x's dtype."""
    x, (w, scales, zeros), options = _case(mode, None, transpose, 5, 64, 48, 16, dtype)
    fn = lambda x: _triton(QuantizedMatmulConfig(block_n=16, block_k=32), **options)(x, w, scales, zeros)
    ref = lambda x: quantized_matmul_reference(x, w, scales, zeros, **options)
    check_forward_and_grads(fn, ref, [x], (0,), dtype)
    assert jax.grad(lambda x: jnp.sum(fn(x)))(x).dtype == dtype


def test_declines_what_it_does_not_serve():
    x, weights, options = _case("affine", 4, False, 5, 32, 32, 16, jnp.float32)
    call = _triton(**options)
    with pytest.raises(NotImplementedError, match="up to 64 rows of x"):
        call(jnp.zeros((65, 32)), *weights)
    with pytest.raises(NotImplementedError, match="non-empty"):
        call(x[:0], *weights)
    with pytest.raises(NotImplementedError, match="codes of \\(4, 8\\) bits, got 3"):
        _triton(**(options | {"bits": 3}))(x, *weights)
    with pytest.raises(RuntimeError, match="use the xla platform here"):
        quantized_matmul_triton(x, *weights, cfg=QuantizedMatmulConfig(), fuse=True, **options)


def test_registered_before_xla_with_its_own_tiles():
    assert [impl.platform.value for impl in IMPLEMENTATIONS] == ["pallas", "triton", "xla"]
    assert kernel_registry.get("quantized_matmul", "triton", "gpu") is quantized_matmul_triton
    x, (w, scales, zeros), options = _case("affine", 4, True, 16, 256, 64, 64, jnp.bfloat16)
    inv = Invocation("quantized_matmul", (x, w, scales, zeros), options | {"fuse": True}, "triton")
    cfg = QuantizedMatmul().heuristic_cfg(inv)
    assert (cfg.platform, cfg.block_n, cfg.block_k, cfg.num_warps, cfg.split_k) == ("triton", 64, 256, 4, 2)
    assert all(c.platform == "triton" for c in QuantizedMatmul().platform_cfgs("triton", inv))


LOWERED = [("affine", 4, False), ("affine", 8, True), ("nf4", None, False), ("mxfp4", None, True)]
LOWERED += [("mxfp8", None, False), ("nvfp4", None, False), ("nvfp8", None, True)]


@pytest.mark.parametrize(("mode", "bits", "transpose"), LOWERED)
def test_kernel_lowers_for_cuda(cuda_lowering, mode, bits, transpose):
    """The decode shape (16 rows, K = N = 8192, bf16) with the heuristic tiles lowers for an H100."""
    params = resolve_params(mode, None, bits)
    rows, columns = 8192, 8192 // params.group_size
    shape = jax.ShapeDtypeStruct
    scales = shape((rows, columns), jnp.float32 if params.float_scales else jnp.uint8)
    zeros = scales if mode == "affine" else None
    w = shape((rows, 8192 * params.bits // 32), jnp.uint32)
    options = dict(transpose=transpose, group_size=params.group_size, bits=params.bits, mode=params.mode)
    inv = Invocation("quantized_matmul", (shape((16, 8192), jnp.bfloat16), w, scales, zeros), options, "triton")
    cfg = QuantizedMatmul().heuristic_cfg(inv)
    fn = lambda x, w, s, z: quantized_matmul_triton(x, w, s, z, cfg=cfg, fuse=True, interpret=False, **options)
    traced = jax.jit(fn).trace(shape((16, 8192), jnp.bfloat16), w, scales, zeros)
    assert "ejkernel_quantized_matmul" in traced.lower(lowering_platforms=("cuda",)).as_text()


def test_partial_tiles_lower_for_cuda(cuda_lowering):
    """Masked loads and stores (partial tiles of K, N and the packed rows), splits and the nf4 table lower too."""
    cfg = QuantizedMatmulConfig(block_n=64, block_k=32, split_k=2)
    for mode, transpose, k, n in (("nf4", False, 40, 96), ("affine", True, 128, 40)):
        x, weights, options = _case(mode, 4, transpose, 5, k, n, 32, jnp.bfloat16)
        fn = functools.partial(quantized_matmul_triton, cfg=cfg, fuse=True, interpret=False, **options)
        lowered = jax.jit(fn).trace(x, *weights).lower(lowering_platforms=("cuda",))
        assert "ejkernel_quantized_matmul" in lowered.as_text()


# ---- GPU suite: the compiled kernel against the XLA implementation ----

GPU_MODES = [("affine", 4), ("affine", 8), ("nf4", None), ("mxfp4", None), ("mxfp8", None), ("nvfp4", None)]
GPU_MODES += [("nvfp8", None)]


@pytest.mark.gpu
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize(("mode", "bits"), GPU_MODES)
@pytest.mark.parametrize("m", [16, 64])
def test_gpu_matches_xla(mode, bits, transpose, m):
    x, weights, options = _case(mode, bits, transpose, m, 4096, 8192, None, jnp.bfloat16)
    options |= dict(use_best_config=True)
    triton = jax.jit(functools.partial(quantized_matmul, platform="triton", **options))
    xla = jax.jit(functools.partial(quantized_matmul, platform="xla", **options))
    assert_close(triton(x, *weights), xla(x, *weights), tol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("transpose", [False, True])
def test_gpu_auto_picks_triton_for_decoding_and_grads_match(transpose):
    x, weights, options = _case("affine", 4, transpose, 16, 2048, 4096, 64, jnp.bfloat16)
    auto = jax.jit(functools.partial(quantized_matmul, **options))
    assert "ejkernel_quantized_matmul" in auto.lower(x, *weights).as_text()
    prefill = jnp.concatenate([x] * 8)  # 128 rows: XLA serves them
    assert "ejkernel_quantized_matmul" not in auto.lower(prefill, *weights).as_text()
    xla = functools.partial(quantized_matmul_xla, cfg=QuantizedMatmulConfig(), fuse=True, **options)
    check_forward_and_grads(lambda x: auto(x, *weights), lambda x: xla(x, *weights), [x], (0,), jnp.bfloat16)
