"""Mosaic GPU grouped matmul on this CPU host: its kernels lower to Mosaic GPU for CUDA, run correctly in
Mosaic GPU's interpret mode, and decline what they do not serve; (GPU suite) they match the XLA path
forward and in both gradients on a Hopper GPU.

Lowering for CUDA catches shape, layout, TMA and shared-memory-budget errors (Mosaic checks the budget
as it lowers) of every code path; interpret mode checks the schedule, the barrier protocol (every phase
observed, no race on shared memory) and the numbers, but not wgmma's asynchrony, layouts or swizzles.
"""

import dataclasses
import functools
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from ejkernel.kernels._common.grouped_matmul import Dims
from ejkernel.kernels._pallas.gpu.grouped_matmul import _interface as interface
from ejkernel.kernels._pallas.gpu.grouped_matmul._interface import grouped_matmul_mosaic_gpu, mosaic_grouped_matmul
from ejkernel.kernels._pallas.gpu.grouped_matmul._kernel import (
    SMEM_BUDGET,
    MosaicGpuGroupedMatmulTiling,
    fit_smem,
    tile_items,
)
from ejkernel.kernels._xla.grouped_matmul._interface import grouped_matmul_xla
from ejkernel.modules import GroupedMatmulConfig, grouped_matmul
from ejkernel.ops import BwdParams, FwdParams
from ejkernel.reference.grouped_matmul import grouped_matmul_reference
from ejkernel.registry import Backend
from harness import check_forward_and_grads, randn

ROWS_256 = GroupedMatmulConfig(
    fwd_params=FwdParams(block_q=256, block_d=128, num_stages=3),
    bwd_params=BwdParams(block_q=256, block_d=128, block_k=128, num_stages=2),
)

PINGPONG = GroupedMatmulConfig(  # one compute warpgroup per output tile, tiles alternating
    fwd_params=FwdParams(block_q=128, block_d=128, num_warps=4),
    bwd_params=BwdParams(block_q=64, block_d=256, num_warps=4),
)
NARROW_STEPS = GroupedMatmulConfig(fwd_params=FwdParams(block_k=32, num_stages=5))  # [N, K] weights only
SPANS = GroupedMatmulConfig(mosaic_spans=True)  # gmm's output tiles follow the groups, row-bounded stores

# (M, K, N, group sizes, transpose_rhs, output dtype, config). Sizes: empty groups first, last and in
# the middle, groups that straddle tiles, rows past the last group; M not always a multiple of 8.
CASES = {
    "straddling-empty-groups": (300, 256, 384, [0, 100, 50, 0, 120], False, jnp.bfloat16, None),
    "transposed-f32-out": (300, 256, 384, [0, 100, 50, 0, 120], True, jnp.float32, None),
    "tiny-m-odd": (40, 128, 64, [0, 5, 14, 0, 3, 9, 5], False, jnp.bfloat16, None),
    "one-group-of-many-128x128-tiles": (
        2048,
        512,
        768,
        [0, 0, 0, 2048, 0],
        True,
        jnp.bfloat16,
        GroupedMatmulConfig(
            fwd_params=FwdParams(block_q=128, block_d=128, num_stages=6),
            bwd_params=BwdParams(block_q=128, block_d=128, num_stages=6),
        ),
    ),
    "all-empty-f16": (1000, 256, 192, [0, 0, 0], False, jnp.float16, None),
    "rows-256-drhs-steps-128": (4096, 1024, 512, [1000, 0, 2900, 96], False, jnp.bfloat16, ROWS_256),
    "pingpong": (300, 256, 384, [0, 100, 50, 0, 120], False, jnp.bfloat16, PINGPONG),
    "pingpong-transposed-f32-out-tiny-m": (40, 128, 128, [0, 5, 14, 0, 3, 9, 5], True, jnp.float32, PINGPONG),
    "transposed-steps-of-32": (300, 256, 384, [0, 100, 50, 0, 120], True, jnp.bfloat16, NARROW_STEPS),
    "spans-transposed-f32-out": (300, 256, 384, [0, 100, 50, 0, 120], True, jnp.float32, SPANS),
    "spans-pingpong-rows-256": (
        4096,
        1024,
        512,
        [1000, 0, 2900, 96],
        False,
        jnp.bfloat16,
        dataclasses.replace(ROWS_256, mosaic_spans=True, fwd_params=FwdParams(block_q=128, num_warps=4)),
    ),
    "easydel-flat-fields": (  # upstream's tiles for TPUs, sent to these kernels by platform="pallas"
        300,
        256,
        384,
        [0, 100, 50, 0, 120],
        True,
        jnp.bfloat16,
        GroupedMatmulConfig(platform="pallas", bypass_xla_tiling=True, block_m=1024, block_n=1024, block_k=512),
    ),
}


def _lower(m, k, n, sizes, transpose, out_dtype, cfg, grad=True, dtype=jnp.bfloat16):
    sizes = jnp.asarray(sizes, jnp.int32)
    options = dict(preferred_element_type=out_dtype, transpose_rhs=transpose, cfg=cfg)

    def loss(lhs, rhs):
        return jnp.sum(mosaic_grouped_matmul(lhs, rhs, sizes, **options).astype(jnp.float32))

    fn = jax.jit(jax.value_and_grad(loss, (0, 1)) if grad else loss)
    rhs_shape = (len(sizes), n, k) if transpose else (len(sizes), k, n)
    shapes = [jax.ShapeDtypeStruct((m, k), dtype), jax.ShapeDtypeStruct(rhs_shape, dtype)]
    return export.export(fn, platforms=["cuda"])(*shapes).mlir_module()


@pytest.mark.parametrize("case", CASES)
def test_forward_and_gradients_lower_for_cuda(case):
    module = _lower(*CASES[case])
    assert module.count("@mosaic_gpu") == 3  # forward, dlhs (the forward kernel, other transpose), drhs


def test_autotune_candidates_plan_at_moe_shapes(monkeypatch):
    """Every Mosaic GPU config the op offers autotuning (on a GPU) serves the benchmark's calls, both rhs
    layouts, within shared memory (their tilings lower in `CASES`)."""
    op = importlib.import_module("ejkernel.modules.operations.grouped_matmul")  # (the package exports the function)
    monkeypatch.setattr(op, "current_backend", lambda: Backend.GPU)
    cfgs = list(op.GroupedMatmul().platform_cfgs("pallas", None))
    assert len(cfgs) > 3 and all(c.platform == "pallas" for c in cfgs)
    bf16 = jnp.bfloat16
    for cfg in cfgs:
        for transpose in (False, True):
            planned = interface.plan(Dims(32768, 4096, 1536, 64, 64), transpose, cfg)
            for tiling in (planned.fwd, planned.dlhs, planned.drhs):
                assert fit_smem(tiling, bf16, bf16).smem_bytes(bf16, bf16) <= SMEM_BUDGET


# ---- interpret mode: the kernels' schedule, barrier protocol and merging, run on this CPU ----

# Mosaic GPU's interpret mode simulates the warpgroups, barriers, TMA copies and (synchronous) wgmma on a
# CPU, checks that every barrier phase is observed, and detects races on shared memory; it models neither
# the asynchrony of wgmma nor layouts and swizzles, which only the GPU suite checks. Few CTAs, so that
# each walks several output tiles (the ring running on across them, ping-pong alternating).
INTERPRET_CASES = {
    # M, K, N, sizes, transpose_rhs, dtype, output dtype, cfg, CTAs
    "cooperative-2-ctas-f32-out": (
        300,
        128,
        128,
        [0, 100, 50, 0, 120],
        False,
        jnp.bfloat16,
        jnp.float32,
        GroupedMatmulConfig(fwd_params=FwdParams(block_d=64, num_stages=2), bwd_params=BwdParams(block_d=64)),
        2,
    ),
    "pingpong-1-cta-transposed": (
        203,
        128,
        128,
        [0, 100, 50, 0, 40],
        True,
        jnp.bfloat16,
        jnp.bfloat16,
        GroupedMatmulConfig(
            fwd_params=FwdParams(block_q=128, block_d=64, num_warps=4, num_stages=2),
            bwd_params=BwdParams(block_q=64, block_d=64, num_warps=4, num_stages=3),
        ),
        1,
    ),
    "spans-2-ctas-unaligned-groups": (  # groups starting off multiples of 8, rows past the last owned by none
        150,
        128,
        128,
        [3, 0, 70, 13, 0, 40, 20],
        False,
        jnp.bfloat16,
        jnp.bfloat16,
        GroupedMatmulConfig(
            mosaic_spans=True, fwd_params=FwdParams(block_d=64, num_stages=2), bwd_params=BwdParams(block_d=64)
        ),
        2,
    ),
    "rows-256-f16-drhs-steps-128": (
        600,
        256,
        128,
        [0, 200, 3, 0, 250, 77],
        False,
        jnp.float16,
        jnp.float16,
        GroupedMatmulConfig(
            fwd_params=FwdParams(block_q=256, block_d=64, num_stages=3),
            bwd_params=BwdParams(block_q=256, block_d=64, block_k=128, num_stages=2),
        ),
        3,
    ),
}


@pytest.mark.parametrize("case", INTERPRET_CASES)
def test_interpret_mode_matches_reference(case, monkeypatch, capfd):
    from jax.experimental.pallas import mosaic_gpu as plgpu

    m, k, n, sizes, transpose, dtype, out_dtype, cfg, ctas = INTERPRET_CASES[case]
    monkeypatch.setattr(interface, "num_sms", lambda: ctas)
    sizes = jnp.asarray(sizes, jnp.int32)
    rhs_shape = (len(sizes), n, k) if transpose else (len(sizes), k, n)
    options = dict(transpose_rhs=transpose, preferred_element_type=out_dtype)
    fn = functools.partial(mosaic_grouped_matmul, group_sizes=sizes, cfg=cfg, **options)
    ref = functools.partial(grouped_matmul_reference, group_sizes=sizes, transpose_rhs=transpose)  # float32 out
    try:
        with plgpu.force_gpu_interpret_mode(plgpu.InterpretGPUParams(detect_races=True)):
            check_forward_and_grads(fn, ref, [randn((m, k), dtype), randn(rhs_shape, dtype)], (0, 1), dtype)
    finally:
        from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call

        interpret_pallas_call.reset_gpu_interpret_mode_state()
    assert "RACE DETECTED" not in capfd.readouterr().out


def test_forward_alone_lowers_to_one_kernel():
    assert _lower(*CASES["straddling-empty-groups"], grad=False).count("@mosaic_gpu") == 1


@pytest.mark.parametrize("seed", range(3))
def test_tile_items_partition_each_tile_among_its_groups(seed):
    """Each tile's items are its non-empty groups in order, with the rows each owns in the tile."""
    rng = np.random.default_rng(seed)
    m, block = 700, 128
    sizes = rng.integers(0, 60, 24)
    sizes[rng.integers(0, 24, 6)] = 0
    group, lo, hi, first, count = jax.tree.map(
        np.asarray, jax.jit(tile_items, static_argnums=(2, 3, 4))(jnp.asarray(sizes, jnp.int32), None, 24, m, block)
    )
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    for tile in range(-(-m // block)):
        t0, t1 = tile * block, min(tile * block + block, m)
        want = [
            (g, max(bounds[g], t0), min(bounds[g + 1], t1))
            for g in range(24)
            if max(bounds[g], t0) < min(bounds[g + 1], t1)
        ]
        got = [(group[i], lo[i], hi[i]) for i in range(first[tile], first[tile] + count[tile])]
        assert got == want, tile


def test_tiles_are_cut_to_fit_shared_memory():
    bf16, f32 = jnp.bfloat16, jnp.float32
    t = MosaicGpuGroupedMatmulTiling(128, 256, 64, 4, 132)
    assert fit_smem(t, bf16, bf16) == MosaicGpuGroupedMatmulTiling(128, 256, 64, 3, 132)
    assert fit_smem(t, bf16, f32) == MosaicGpuGroupedMatmulTiling(
        128, 128, 64, 4, 132
    )  # a float32 output tile: narrower, not 2 stages
    assert fit_smem(MosaicGpuGroupedMatmulTiling(128, 128, 64, 6, 132), bf16, bf16).stages == 6
    for tiling in (t, MosaicGpuGroupedMatmulTiling(256, 256, 128, 8, 132)):
        for out in (bf16, f32):
            assert fit_smem(tiling, bf16, out).smem_bytes(bf16, out) <= SMEM_BUDGET


M, K, N = 300, 256, 384
SIZES = jnp.array([0, 100, 50, 0, 120], jnp.int32)


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda a: mosaic_grouped_matmul(*a, jnp.int32(0)), "group_offset"),
        (lambda a: mosaic_grouped_matmul(*a, None, jnp.zeros((M, N))), "existing_out"),
        (lambda a: mosaic_grouped_matmul(*a, use_v3=True, rhs_bias=jnp.zeros((5, 1, N), jnp.bfloat16)), "rhs_bias"),
        (
            lambda a: mosaic_grouped_matmul(*a, use_v3=True, rhs_scale=jnp.ones((5, 2, 1, N), jnp.bfloat16)),
            "rhs_scale",
        ),
        (lambda a: mosaic_grouped_matmul(*a, interpret=True), "interpret"),
        (lambda a: mosaic_grouped_matmul(a[0].astype(jnp.float32), a[1].astype(jnp.float32), a[2]), "bfloat16"),
        (lambda a: mosaic_grouped_matmul(a[0][:, :192], a[1][:, :192], a[2]), "multiples of 128"),
        (lambda a: mosaic_grouped_matmul(a[0], a[1][..., :100], a[2]), "output columns"),
        (lambda a: mosaic_grouped_matmul(a[0][:, :160], a[1][:, :160, :256], a[2]), "steps of 64"),
        (lambda a: mosaic_grouped_matmul(a[0], a[1].astype(jnp.float16), a[2]), "one 16-bit dtype"),
        (lambda a: grouped_matmul_mosaic_gpu(*a), "Hopper"),
    ],
)
def test_declines_what_it_does_not_serve(call, words):
    args = (jnp.ones((M, K), jnp.bfloat16), jnp.ones((5, K, N), jnp.bfloat16), SIZES)
    with pytest.raises(NotImplementedError, match=words):
        call(args)


@pytest.mark.parametrize(
    ("params", "tiling"),
    [
        (
            FwdParams(num_warps=4, block_d=256),
            MosaicGpuGroupedMatmulTiling(128, 128, 64, 4, 132, True),
        ),  # the accumulator's registers
        (
            FwdParams(num_warps=2, block_q=256),
            MosaicGpuGroupedMatmulTiling(128, 128, 64, 4, 132, True),
        ),  # 4 warps: ping-pong
        (
            FwdParams(num_warps=16, block_q=64, block_d=32),
            MosaicGpuGroupedMatmulTiling(128, 64, 64, 4, 132),
        ),  # 8 warps, 64 wide
        (
            FwdParams(block_q=1024, block_d=1024, block_k=512, num_stages=1),
            MosaicGpuGroupedMatmulTiling(256, 128, 64, 2, 132),
        ),
    ],
)
def test_knobs_are_brought_into_what_the_kernels_take(monkeypatch, params, tiling):
    """Tile, warp and stage values outside the kernels' ranges are clamped to them, never declined."""
    monkeypatch.setattr(interface, "num_sms", lambda: 132)
    got = interface.plan_tiling(params, interface.DEFAULT_FWD, rows=M, contraction=K, cols=N, transposed=False)
    assert got == tiling
    drhs = interface.plan_tiling(params, interface.DEFAULT_DRHS, rows=K, contraction=M, cols=N, transposed=True)
    assert drhs.block_k in (64, 128) and K % drhs.block_m == 0


def test_bad_inputs_are_the_shared_checks_errors():
    with pytest.raises(ValueError, match="sum to at most"):
        mosaic_grouped_matmul(jnp.ones((M, K), jnp.bfloat16), jnp.ones((5, K, N), jnp.bfloat16), SIZES.at[0].set(999))


# ---- GPU suite: the kernels against the XLA implementation on the device ----


def _inputs(m, k, n, groups, seed, transpose=False, tail=100, empty=(0, 3)):
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.integers(0, m - tail, groups - 1))
    sizes = np.diff(np.concatenate([[0], cuts, [m - tail]]))
    for g in empty:  # empty groups: their rows go to the next group
        sizes[g + 1] += sizes[g]
        sizes[g] = 0
    rhs_shape = (groups, n, k) if transpose else (groups, k, n)
    return randn((m, k), jnp.bfloat16), randn(rhs_shape, jnp.bfloat16, scale=k**-0.5), jnp.asarray(sizes, jnp.int32)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [None, ROWS_256, PINGPONG, SPANS])
def test_gpu_matches_xla_at_moe_shapes(cfg):
    lhs, rhs, sizes = _inputs(32768, 4096, 1536, 64, seed=0)
    mosaic = jax.jit(lambda lhs, rhs: grouped_matmul(lhs, rhs, sizes, platform="pallas", cfg=cfg))
    xla = jax.jit(lambda lhs, rhs: grouped_matmul_xla(lhs, rhs, sizes))
    check_forward_and_grads(mosaic, xla, [lhs, rhs], (0, 1), jnp.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("m", "k", "n", "groups", "transpose", "out_dtype", "cfg"),
    [
        (6003, 1024, 768, 16, True, jnp.float32, None),  # M no multiple of 8, float32 output tiles
        (6003, 1024, 768, 16, True, jnp.bfloat16, NARROW_STEPS),
        (4096, 512, 256, 8, False, jnp.bfloat16, None),
        (4096, 512, 256, 8, False, jnp.bfloat16, PINGPONG),
        (6003, 1024, 768, 16, False, jnp.bfloat16, SPANS),  # row-bounded stores, M no multiple of 8
        (6003, 1024, 768, 16, True, jnp.float32, dataclasses.replace(SPANS, fwd_params=PINGPONG.fwd_params)),
        (40, 128, 64, 7, False, jnp.float16, None),  # fewer rows than a tile
    ],
)
def test_gpu_matches_xla_small_groups_and_layouts(m, k, n, groups, transpose, out_dtype, cfg):
    lhs, rhs, sizes = _inputs(m, k, n, groups, seed=m, transpose=transpose, tail=min(100, m // 10))
    if out_dtype == jnp.float16:
        lhs, rhs = lhs.astype(jnp.float16), rhs.astype(jnp.float16)
    options = dict(transpose_rhs=transpose, preferred_element_type=out_dtype)
    mosaic = jax.jit(functools.partial(grouped_matmul_mosaic_gpu, group_sizes=sizes, cfg=cfg, **options))
    xla = jax.jit(functools.partial(grouped_matmul_xla, group_sizes=sizes, transpose_rhs=transpose))  # float32
    check_forward_and_grads(mosaic, xla, [lhs, rhs], (0, 1), lhs.dtype)
    out = mosaic(lhs, rhs)
    assert float(jnp.max(jnp.abs(out[int(sizes.sum()) :].astype(jnp.float32)))) == 0.0  # rows past the groups


@pytest.mark.gpu
def test_gpu_all_groups_empty_gives_zeros():
    lhs, rhs = randn((2048, 256), jnp.bfloat16), randn((4, 256, 256), jnp.bfloat16)
    sizes = jnp.zeros((4,), jnp.int32)
    out, vjp = jax.vjp(lambda a, b: grouped_matmul_mosaic_gpu(a, b, sizes), lhs, rhs)
    dlhs, drhs = vjp(randn(out.shape, out.dtype))
    for x in (out, dlhs, drhs):
        assert float(jnp.max(jnp.abs(x.astype(jnp.float32)))) == 0.0
