"""grouped_matmul kernels: Pallas-Triton (interpret mode, CUDA lowering, GPU suite) and Pallas TPU (interpret mode)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ejkernel.kernels._pallas.tpu.grouped_matmul._interface import grouped_matmul_tpu
from ejkernel.kernels._triton.grouped_matmul._interface import grouped_matmul_triton
from ejkernel.kernels._xla.grouped_matmul._interface import grouped_matmul_xla
from ejkernel.modules import GroupedMatmulConfig, grouped_matmul
from ejkernel.ops import BwdParams, FwdParams
from ejkernel.reference.grouped_matmul import grouped_matmul_reference
from harness import check_forward_and_grads, randn

# 40 rows in 16-row tiles: empty groups, groups that straddle tiles, 4 rows past the last group.
SIZES = jnp.array([0, 5, 14, 0, 3, 9, 5], jnp.int32)
M = 40


def _check(impl, lhs, rhs, *rest, offset=None, argnums=(0, 1), **options):
    fn = jax.jit(lambda lhs, rhs, *a: impl(lhs, rhs, SIZES, offset, *a, **options))
    ref = jax.jit(lambda lhs, rhs, *a: grouped_matmul_reference(lhs, rhs, SIZES, offset, *a, **options))
    check_forward_and_grads(fn, ref, [lhs, rhs, *rest], argnums, lhs.dtype)


# K = 40 and N = 50 are no multiples of the 16-wide tiles: every masked edge is taken.
TRITON_SMALL = GroupedMatmulConfig(
    fwd_params=FwdParams(block_q=16, block_k=16, block_d=32, num_warps=4, num_stages=2),
    bwd_params=BwdParams(block_q=16, block_k=16, block_d=16, num_warps=4, num_stages=2),
)


@pytest.mark.parametrize(("dtype", "transpose_rhs"), [(jnp.float32, False), (jnp.bfloat16, True)])
def test_triton_interpret_matches_reference(dtype, transpose_rhs):
    impl = functools.partial(grouped_matmul_triton, cfg=TRITON_SMALL, interpret=True)
    rhs = randn((7, 50, 40) if transpose_rhs else (7, 40, 50), dtype)
    _check(impl, randn((M, 40), dtype), rhs, transpose_rhs=transpose_rhs)


def test_triton_interpret_fewer_rows_than_a_span():
    """The default tiles fitted to M=40 give 64-row spans: every span reads past M, masked."""
    impl = functools.partial(grouped_matmul_triton, interpret=True)
    _check(impl, randn((M, 40)), randn((7, 40, 50)))


def test_triton_interpret_offset_and_existing_out():
    impl = functools.partial(grouped_matmul_triton, cfg=TRITON_SMALL, interpret=True)
    _check(impl, randn((M, 40)), randn((3, 40, 50)), randn((M, 50)), offset=jnp.int32(2), argnums=(0, 1, 2))


@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")
def test_triton_kernels_lower_for_cuda(cuda_lowering):
    """The forward and both backward products lower to Triton IR for an H100 (compute capability 9.0)."""
    lhs = jax.ShapeDtypeStruct((3000, 520), jnp.bfloat16)
    rhs = jax.ShapeDtypeStruct((7, 250, 520), jnp.bfloat16)  # transposed: [G, N, K]
    sizes = jnp.array([500, 0, 700, 300, 0, 1000, 100], jnp.int32)
    forward = functools.partial(grouped_matmul_triton, group_sizes=sizes, transpose_rhs=True, interpret=False)
    train = lambda lhs, rhs: jax.vjp(lambda a, b: forward(a, b), lhs, rhs)[1](jnp.ones((3000, 250), jnp.float32))
    text = jax.jit(train).trace(lhs, rhs).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("ejkernel_grouped_matmul_transposed") >= 1 and text.count("ejkernel_grouped_matmul") >= 3


def test_tpu_interpret_matches_reference():
    """Few grid steps (16-row tiles, 6 items per product); K = 40 in 32-wide steps leaves a partial block."""
    cfg = GroupedMatmulConfig(
        fwd_params=FwdParams(block_q=16, block_k=32), bwd_params=BwdParams(block_q=64, block_k=16)
    )
    impl = functools.partial(grouped_matmul_tpu, cfg=cfg, interpret=True)
    _check(impl, randn((M, 40)), randn((4, 48, 40)), offset=jnp.int32(1), transpose_rhs=True)


# ---- GPU suite: the kernels against the XLA implementation on the device, at MoE shapes ----


def _moe_inputs(m=32768, k=4096, n=1536, groups=64, seed=0):
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.integers(0, m - 100, groups - 1))
    sizes = jnp.asarray(np.diff(np.concatenate([[0], cuts, [m - 100]])), jnp.int32)  # 100 rows past the groups
    return randn((m, k), jnp.bfloat16), randn((groups, k, n), jnp.bfloat16, scale=k**-0.5), sizes


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [None, GroupedMatmulConfig(fwd_params=FwdParams(block_q=64, block_d=128))])
def test_gpu_triton_matches_xla_at_moe_shapes(cfg):
    lhs, rhs, sizes = _moe_inputs()
    triton = jax.jit(lambda lhs, rhs: grouped_matmul(lhs, rhs, sizes, platform="triton", cfg=cfg))
    xla = jax.jit(lambda lhs, rhs: grouped_matmul_xla(lhs, rhs, sizes))
    check_forward_and_grads(triton, xla, [lhs, rhs], (0, 1), jnp.bfloat16)


@pytest.mark.gpu
def test_gpu_triton_transposed_offset_existing_out():
    lhs, rhs, sizes = _moe_inputs(m=8192, k=1024, n=768, groups=16, seed=1)
    rhs_t, existing = jnp.swapaxes(rhs, 1, 2)[4:12], randn((8192, 768), jnp.bfloat16)
    out_dtype = lambda a: dict(transpose_rhs=True, preferred_element_type=a[2].dtype)  # the oracle runs in float32
    triton = jax.jit(lambda *a: grouped_matmul(a[0], a[1], sizes, 4, a[2], platform="triton", **out_dtype(a)))
    xla = jax.jit(lambda *a: grouped_matmul_xla(a[0], a[1], sizes, 4, a[2], **out_dtype(a)))
    check_forward_and_grads(triton, xla, [lhs, rhs_t, existing], (0, 1, 2), jnp.bfloat16)
