"""The Mosaic GPU FP8 x FP8 grouped matmul forward (`fp8_lhs` with FP8 `[G, N, K]` weights and v3 block scales)
on this CPU host: it lowers to Mosaic GPU for CUDA (lhs's rounding pass and the product; its gradient to the
16-bit kernels), runs correctly in Mosaic GPU's interpret mode (the rounding pass bit for bit as
`fp8_row_blocks`; both promotions), plans its tiles within registers and shared memory and declines what it does
not serve; (GPU suite) it matches the XLA path forward and in the gradients of lhs and the scales on a Hopper GPU.
"""

import dataclasses
import functools
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from ejkernel.kernels._common.grouped_matmul_quantized import fp8_row_blocks
from ejkernel.kernels._pallas.gpu.grouped_matmul import _interface as interface
from ejkernel.kernels._pallas.gpu.grouped_matmul._fp8 import (
    MosaicGpuFp8GroupedMatmulTiling,
    fit_smem,
    round_lhs_blocks,
)
from ejkernel.kernels._pallas.gpu.grouped_matmul._interface import grouped_matmul_mosaic_gpu, mosaic_grouped_matmul
from ejkernel.kernels._xla.grouped_matmul._interface import grouped_matmul_xla
from ejkernel.modules import GroupedMatmulConfig, GroupedMatmulMosaicFp8Tiling, grouped_matmul
from ejkernel.ops import BwdParams
from ejkernel.reference.grouped_matmul import grouped_matmul_reference
from ejkernel.registry import Backend
from harness import assert_close, check_forward_and_grads, randn
from mosaic_gpu_interpret import interpret_mode

V3 = dict(use_v3=True, fp8_lhs=True, transpose_rhs=True)


def _weights(groups, n, k, blocks, column_blocks=False):
    """FP8 `[G, N, K]` codes and v3 scales `[G, blocks, 1, N]` (positive, varying by block and column, or with
    `column_blocks` by block of 128 columns as DeepSeek-V3's 128 x 128 blocks)."""
    w = randn((groups, n, k), scale=4.0).astype(jnp.float8_e4m3fn)
    if column_blocks:
        return w, jnp.repeat(jnp.abs(randn((groups, blocks, 1, n // 128))) / 8 + 0.01, 128, axis=3)
    return w, jnp.abs(randn((groups, blocks, 1, n))) / 8 + 0.01


def _lower(tiling, grad=False, out_dtype=jnp.bfloat16, m=300, k=256, n=768, sizes=(0, 100, 50, 0, 120)):
    sizes = jnp.asarray(sizes, jnp.int32)
    cfg = GroupedMatmulConfig(mosaic_fp8_tiling=tiling)

    def forward(lhs, rhs, scale):
        return mosaic_grouped_matmul(lhs, rhs, sizes, rhs_scale=scale, preferred_element_type=out_dtype, cfg=cfg, **V3)

    fn = jax.value_and_grad(lambda *a: jnp.sum(forward(*a).astype(jnp.float32)), (0, 2)) if grad else forward
    shapes = [
        jax.ShapeDtypeStruct((m, k), jnp.bfloat16),
        jax.ShapeDtypeStruct((len(sizes), n, k), jnp.float8_e4m3fn),
        jax.ShapeDtypeStruct((len(sizes), k // 128, 1, n), jnp.float32),
    ]
    return export.export(jax.jit(fn), platforms=["cuda"])(*shapes).mlir_module()


@pytest.mark.parametrize(
    ("tiling", "kernels"),
    [
        (None, 2),  # 128 x 256 tiles in two wgmmas a step, both promotions; lhs rounded by a kernel
        (GroupedMatmulMosaicFp8Tiling(block_n=192, round_in_kernel=False), 1),  # per-column promotion, XLA rounding
        (GroupedMatmulMosaicFp8Tiling(block_n=128, num_stages=5, overlap=True), 2),  # promotion beside the wgmma
        (GroupedMatmulMosaicFp8Tiling(block_m=256, block_n=128, num_stages=3, overlap=True), 2),  # four, overlapped
        (GroupedMatmulMosaicFp8Tiling(spans=True, num_stages=4), 2),  # spans, the output stored in 4 column pieces
    ],
)
def test_forward_lowers_for_cuda(tiling, kernels):
    assert _lower(tiling).count("@mosaic_gpu") == kernels


def test_gradient_lowers_to_the_16_bit_kernels():
    """Frozen FP8 weights: dlhs and the scales' gradient are the 16-bit gmm and tgmm on dequantised weights."""
    assert _lower(None, grad=True, out_dtype=jnp.float32).count("@mosaic_gpu") == 4


def test_rounding_pass_lowers_for_scale_blocks_of_512():
    """Four 128-column pieces a block: the registers hold one at a time."""
    shape = jax.ShapeDtypeStruct((96, 1024), jnp.bfloat16)
    lowered = export.export(jax.jit(lambda x: round_lhs_blocks(x, 512, 128, 128)), platforms=["cuda"])(shape)
    assert lowered.mlir_module().count("@mosaic_gpu") == 1


# ---- interpret mode: the schedule, barriers, promotion and merging, run on this CPU ----

M, K, N = 200, 256, 256
SIZES = jnp.array([0, 90, 0, 70, 25], jnp.int32)  # empty groups, groups straddling tiles, rows past the last


@pytest.mark.parametrize(("rows", "block"), [(203, 128), (136, 256)])
def test_interpret_rounding_pass_is_fp8_row_blocks_bit_for_bit(rows, block, capfd):
    """Codes and scales of `fp8_row_blocks` (in the product's layout: per step, rows past M zero codes and scale
    1), with a zero block, a row with an outlier, rows (not a multiple of 8) past the last tile, and four blocks a
    CTA (its two slots refilled)."""
    lhs = randn((rows, 4 * block), jnp.bfloat16, scale=3.0).at[5, :block].set(0).at[7, 3].set(1e4)
    code_rows, scale_rows = -(-rows // 8) * 8, -(-rows // 128) * 128
    with interpret_mode():
        codes, scales = round_lhs_blocks(lhs, block, code_rows, scale_rows)
    ref_codes, ref_scales = fp8_row_blocks(lhs, block)
    codes, bits = np.asarray(codes).view(np.uint8), np.asarray(ref_codes).view(np.uint8)
    np.testing.assert_array_equal(codes[:rows], bits)
    np.testing.assert_array_equal(np.asarray(scales)[:, :rows], np.repeat(np.asarray(ref_scales), block // 128, 1).T)
    assert not codes[rows:].any() and (np.asarray(scales)[:, rows:] == 1).all()
    assert "RACE DETECTED" not in capfd.readouterr().out


@pytest.mark.parametrize(
    ("tiling", "out_dtype", "column_blocks"),
    [
        (GroupedMatmulMosaicFp8Tiling(block_n=64, num_stages=3, overlap=True), jnp.float32, False),  # beside wgmma
        (GroupedMatmulMosaicFp8Tiling(block_n=256, num_stages=2), jnp.bfloat16, True),  # 2 wgmmas, a scale per row
    ],
)
def test_interpret_forward_matches_reference(tiling, out_dtype, column_blocks, monkeypatch, capfd):
    monkeypatch.setattr(interface, "num_sms", lambda: 2)  # each CTA walks several output tiles
    rhs, scale = _weights(len(SIZES), N, K, blocks=2, column_blocks=column_blocks)
    fn = functools.partial(mosaic_grouped_matmul, cfg=GroupedMatmulConfig(mosaic_fp8_tiling=tiling), **V3)
    lhs = randn((M, K), jnp.bfloat16)
    with interpret_mode():
        out = fn(lhs, rhs, SIZES, rhs_scale=scale, preferred_element_type=out_dtype)
    ref = grouped_matmul_reference(
        lhs.astype(jnp.float32), rhs, SIZES, rhs_scale=scale, transpose_rhs=True, fp8_lhs=True
    )
    assert_close(out, ref, out_dtype)  # lhs rounded alike; float32 sums in another order
    assert "RACE DETECTED" not in capfd.readouterr().out


def test_interpret_spans_match_reference(monkeypatch, capfd):
    """Spans (`mosaic_spans`): groups starting off multiples of 8 and of 128 (a span's row scales start there too),
    an empty group, rows past the last group (a span of zeros), spans reading past the codes' and scales' rows (the
    last group's span from row 120: its second warpgroup's rows all past the 184 rows of codes); 4 stages, so the
    output tile is stored in four 64-column pieces, each cutting across the two wgmma chunks."""
    monkeypatch.setattr(interface, "num_sms", lambda: 2)
    m, sizes = 180, jnp.array([3, 0, 110, 13, 40], jnp.int32)
    rhs, scale = _weights(len(sizes), N, K, blocks=2, column_blocks=True)
    cfg = GroupedMatmulConfig(mosaic_fp8_tiling=GroupedMatmulMosaicFp8Tiling(block_n=256, num_stages=4))
    assert fit_smem(interface.plan_fp8(cfg, N), N, jnp.bfloat16).out_pieces == 4
    lhs = randn((m, K), jnp.bfloat16)
    with interpret_mode():
        out = mosaic_grouped_matmul(
            lhs, rhs, sizes, rhs_scale=scale, preferred_element_type=jnp.bfloat16, cfg=cfg, **V3
        )
    ref = grouped_matmul_reference(
        lhs.astype(jnp.float32), rhs, sizes, rhs_scale=scale, transpose_rhs=True, fp8_lhs=True
    )
    assert_close(out, ref, jnp.bfloat16)
    assert not np.asarray(out[int(sizes.sum()) :], np.float32).any()
    assert "RACE DETECTED" not in capfd.readouterr().out


def test_interpret_gradients_match_reference(monkeypatch, capfd):
    """256-row tiles in four overlapped 32-column wgmmas a step, a bfloat16 output, one scale block of 256 rows
    (two steps); the lhs and scale gradients."""
    monkeypatch.setattr(interface, "num_sms", lambda: 1)
    m, sizes = 72, jnp.array([0, 40, 20], jnp.int32)
    rhs, scale = _weights(len(sizes), 128, K, blocks=1)
    cfg = GroupedMatmulConfig(
        mosaic_fp8_tiling=GroupedMatmulMosaicFp8Tiling(block_m=256, block_n=128, num_stages=2),
        bwd_params=BwdParams(block_d=64),
    )
    fn = functools.partial(mosaic_grouped_matmul, rhs=rhs, group_sizes=sizes, cfg=cfg, **V3)
    ref = functools.partial(grouped_matmul_reference, rhs=rhs, group_sizes=sizes, transpose_rhs=True, fp8_lhs=True)
    with interpret_mode():
        check_forward_and_grads(
            lambda lhs, s: fn(lhs, rhs_scale=s, preferred_element_type=jnp.bfloat16),
            lambda lhs, s: ref(lhs, rhs_scale=s),
            [randn((m, K), jnp.bfloat16), scale],
            (0, 1),
            jnp.bfloat16,
        )
    assert "RACE DETECTED" not in capfd.readouterr().out


# ---- planning and declining ----


def test_tiles_are_planned_within_registers_and_shared_memory(monkeypatch):
    monkeypatch.setattr(interface, "num_sms", lambda: 132)
    plan = interface.plan_fp8
    cfg = lambda **kw: GroupedMatmulConfig(mosaic_fp8_tiling=GroupedMatmulMosaicFp8Tiling(**kw))
    tiles = dict(spans=False)  # (spans follow GroupedMatmulConfig.mosaic_spans, True by default)
    assert plan(cfg(block_n=256, num_stages=3, **tiles), 1536) == MosaicGpuFp8GroupedMatmulTiling(
        128, 256, 3, 132, False, 2
    )
    assert plan(None, 1536) == MosaicGpuFp8GroupedMatmulTiling(128, 128, 5, 132, False, spans=True)
    off = plan(cfg(round_in_kernel=False, column_blocks=False), 1536)
    assert (off.round_in_kernel, off.promotes_by_column_block) == (False, False)
    assert not plan(cfg(block_n=192), 1536).promotes_by_column_block  # a 192-column wgmma spans two blocks
    wide_rows = plan(
        cfg(block_m=256, block_n=128, overlap=True), 1536
    )  # 128 rows a warpgroup: three 128 x 128 tiles would not fit
    assert (wide_rows.block_n, wide_rows.chunks, wide_rows.tile_registers) == (128, 4, 192)
    assert not wide_rows.spans  # 256-row spans tiles hit a misaligned address on a GPU: fixed tiles
    with pytest.raises(NotImplementedError, match="FP8 spans take 128-row tiles, got block_m=256"):
        plan(cfg(block_m=256, spans=True), 1536)
    wide = plan(cfg(block_n=256, overlap=False, **tiles), 1536)
    assert (wide.block_n, wide.chunks) == (256, 2)
    assert plan(cfg(block_n=256, overlap=False), 1344).block_n == 192  # 1344 = 7 x 192
    assert plan(cfg(block_n=128), 320).block_n == 64
    fitted = fit_smem(plan(cfg(block_n=128, num_stages=6, overlap=True, **tiles), 1536), 1536, jnp.float32)
    assert fitted.stages == 4 and not dataclasses.replace(fitted, stages=5).fits(jnp.float32)
    assert fit_smem(wide, 1536, jnp.float32).block_n == 128  # a float32 256-column tile leaves no room for 2 stages
    spans = lambda **kw: fit_smem(plan(cfg(spans=True, block_n=256, **kw), 1536), 1536, jnp.bfloat16)
    assert (spans(num_stages=3).stages, spans(num_stages=3).out_pieces) == (3, 2)  # pieces of SPAN_STORE_COLS
    assert (spans(num_stages=4).stages, spans(num_stages=4).out_pieces) == (4, 4)  # 4 stages: 64-column pieces
    assert plan(GroupedMatmulConfig(mosaic_spans=True), 1536).spans  # the FP8 tiling's spans follow the config's
    assert not plan(
        GroupedMatmulConfig(mosaic_spans=True, mosaic_fp8_tiling=GroupedMatmulMosaicFp8Tiling(spans=False)), 1536
    ).spans
    op = importlib.import_module("ejkernel.modules.operations.grouped_matmul")
    for tiling in op.MOSAIC_FP8_TILINGS:
        for out in (jnp.bfloat16, jnp.float32):
            assert fit_smem(plan(GroupedMatmulConfig(mosaic_fp8_tiling=tiling), 1536), 1536, out).fits(out)


def test_autotuning_offers_fp8_tilings_for_fp8_calls(monkeypatch):
    op = importlib.import_module("ejkernel.modules.operations.grouped_matmul")
    monkeypatch.setattr(op, "current_backend", lambda: Backend.GPU)
    inv = type("Inv", (), {"kwargs": {"fp8_lhs": True}})()
    tilings = [c.mosaic_fp8_tiling for c in op.GroupedMatmul().platform_cfgs("pallas", inv)]
    assert set(op.MOSAIC_FP8_TILINGS) <= set(tilings)
    back = GroupedMatmulConfig.from_json(GroupedMatmulConfig(mosaic_fp8_tiling=op.MOSAIC_FP8_TILINGS[1]).to_json())
    assert back.mosaic_fp8_tiling == op.MOSAIC_FP8_TILINGS[1]


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (
            lambda lhs, w, s: mosaic_grouped_matmul(lhs, w, SIZES, rhs_scale=s, **V3 | dict(transpose_rhs=False)),
            "K-major",
        ),
        (
            lambda lhs, w, s: mosaic_grouped_matmul(lhs, w, SIZES, rhs_scale=s[:, :1].repeat(4, 1), **V3),
            "multiple of 128",
        ),
        (lambda lhs, w, s: mosaic_grouped_matmul(lhs, w, SIZES, jnp.int32(0), rhs_scale=s, **V3), "group_offset"),
        (
            lambda lhs, w, s: mosaic_grouped_matmul(lhs, w, SIZES, None, jnp.zeros((M, N)), rhs_scale=s, **V3),
            "existing_out",
        ),
        (lambda lhs, w, s: mosaic_grouped_matmul(lhs.astype(jnp.float32), w, SIZES, rhs_scale=s, **V3), "bfloat16"),
        (lambda lhs, w, s: mosaic_grouped_matmul(lhs, w, SIZES, rhs_scale=s, interpret=True, **V3), "interpret"),
        (lambda lhs, w, s: mosaic_grouped_matmul(lhs, w[:, :100], SIZES, rhs_scale=s[..., :100], **V3), "dividing N"),
        (
            lambda lhs, w, s: mosaic_grouped_matmul(lhs, w, SIZES, rhs_scale=s, use_v3=True, transpose_rhs=True),
            "rhs_scale",
        ),
        (lambda lhs, w, s: grouped_matmul_mosaic_gpu(lhs, w, SIZES, rhs_scale=s, **V3), "Hopper"),
    ],
)
def test_declines_what_it_does_not_serve(call, words):
    """Before tracing, naming the reason (without fp8_lhs FP8 weights are the 16-bit kernels' to decline)."""
    w, scale = jnp.ones((5, N, K), jnp.float8_e4m3fn), jnp.ones((5, 2, 1, N))
    with pytest.raises(NotImplementedError, match=words):
        call(jnp.ones((M, K), jnp.bfloat16), w, scale)


# ---- GPU suite: the kernel against the XLA implementation on the device ----


@pytest.mark.gpu
def test_gpu_rounding_pass_is_fp8_row_blocks_bit_for_bit():
    """At the MoE shape's lhs (32768 x 4096, scale blocks of 128) and an odd one (1000 x 1024, blocks of 512)."""
    for (m, k), block in (((32768, 4096), 128), ((1000, 1024), 512)):
        lhs = randn((m, k), jnp.bfloat16, scale=3.0).at[3, :block].set(0)
        rounding = functools.partial(
            round_lhs_blocks, block=block, code_rows=-(-m // 8) * 8, scale_rows=-(-m // 128) * 128
        )
        codes, scales = jax.jit(rounding)(lhs)
        ref_codes, ref_scales = jax.jit(functools.partial(fp8_row_blocks, block=block))(lhs)
        codes = np.asarray(jax.lax.bitcast_convert_type(codes[:m], jnp.uint8))
        np.testing.assert_array_equal(codes, np.asarray(jax.lax.bitcast_convert_type(ref_codes, jnp.uint8)))
        np.testing.assert_array_equal(np.asarray(scales)[:, :m], np.repeat(np.asarray(ref_scales), block // 128, 1).T)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("tiling", "column_blocks"),
    [
        (None, True),  # a scale per row in the promotion, lhs rounded by the kernel
        (None, False),
        (GroupedMatmulMosaicFp8Tiling(round_in_kernel=False, column_blocks=False), True),  # session 31's first
        (GroupedMatmulMosaicFp8Tiling(block_n=128, num_stages=5, overlap=True), True),
        (GroupedMatmulMosaicFp8Tiling(block_m=256, block_n=128, num_stages=4), True),
        pytest.param(GroupedMatmulMosaicFp8Tiling(spans=True, num_stages=4), True, id="spans-s4"),
    ],
)
def test_gpu_matches_xla_at_the_moe_shape(tiling, column_blocks):
    """M 32768, K 4096, N 1536, 64 groups (two empty, rows past the last): forward within FP8's rounding of the
    XLA path (which rounds lhs through FP8 too), and the gradients of lhs and the scales; weight scales per
    column, or per 128 columns (DeepSeek-V3's blocks)."""
    m, k, n, groups = 32768, 4096, 1536, 64
    cuts = np.sort(np.random.default_rng(3).integers(0, m - 100, groups - 1))
    sizes = np.diff(np.concatenate([[0], cuts, [m - 100]]))
    sizes[1] += sizes[0]
    sizes[0] = sizes[-1] = 0  # (the last group's rows are left to none)
    sizes = jnp.asarray(sizes, jnp.int32)
    rhs, scale = _weights(groups, n, k, blocks=k // 128, column_blocks=column_blocks)
    scale = scale * k**-0.5 / 4
    cfg = GroupedMatmulConfig(platform="pallas", mosaic_fp8_tiling=tiling)
    options = dict(preferred_element_type=jnp.bfloat16, **V3)
    mosaic = jax.jit(lambda lhs, s: grouped_matmul(lhs, rhs, sizes, rhs_scale=s, cfg=cfg, **options))
    # (the reference runs in float32: its bfloat16 output is widened so that its cotangent may be float32)
    xla = jax.jit(lambda lhs, s: grouped_matmul_xla(lhs, rhs, sizes, rhs_scale=s, **options).astype(jnp.float32))
    lhs = randn((m, k), jnp.bfloat16)
    check_forward_and_grads(mosaic, xla, [lhs, scale], (0, 1), jnp.bfloat16)
    out = mosaic(lhs, scale)
    assert float(jnp.max(jnp.abs(out[int(sizes.sum()) :].astype(jnp.float32)))) == 0.0


@pytest.mark.gpu
def test_gpu_spans_match_xla_with_unaligned_groups():
    """Spans at M 6003 (no multiple of 8), K 1024, N 768: groups of odd sizes starting anywhere, empty ones, rows past
    the last group, whose last span (from row 5952) reads its second warpgroup's rows wholly past the codes (6008
    rows) and row scales (6016); the default tiles (128 x 128, 5 stages). Forward only (the gradients are the 16-bit
    kernels')."""
    m, k, n = 6003, 1024, 768
    sizes = jnp.asarray([5, 0, 1001, 377, 0, 2048, 1, 999, 1393, 0, 159], jnp.int32)  # 5983 rows: 20 past the last
    rhs, scale = _weights(len(sizes), n, k, blocks=k // 128, column_blocks=True)
    cfg = GroupedMatmulConfig(platform="pallas", mosaic_fp8_tiling=GroupedMatmulMosaicFp8Tiling(spans=True))
    options = dict(rhs_scale=scale * k**-0.5 / 4, preferred_element_type=jnp.bfloat16, **V3)
    lhs = randn((m, k), jnp.bfloat16)
    out = jax.jit(lambda x: grouped_matmul(x, rhs, sizes, cfg=cfg, **options))(lhs)
    ref = jax.jit(lambda x: grouped_matmul_xla(x, rhs, sizes, **options))(lhs)
    assert_close(out, ref.astype(jnp.float32), jnp.bfloat16)
    assert float(jnp.max(jnp.abs(out[int(sizes.sum()) :].astype(jnp.float32)))) == 0.0
