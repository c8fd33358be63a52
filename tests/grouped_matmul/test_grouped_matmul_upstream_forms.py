"""grouped_matmul called as EasyDeL and upstream ejkernel call it: upstream's config fields, XLA's ragged dot
(`bypass_xla_tiling`), knob values that must never fail, mixed float dtypes, `existing_out` added to every
row, and the `use_v2` / `use_v3` flags; forward and every gradient against the reference."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from ejkernel.kernels._common.grouped_matmul import TileParams, tile_params
from ejkernel.kernels._pallas.tpu.grouped_matmul import _interface as tpu
from ejkernel.kernels._triton.grouped_matmul._interface import grouped_matmul_triton
from ejkernel.modules import GroupedMatmulConfig, grouped_matmul
from ejkernel.modules.operations import configs
from ejkernel.ops import FwdParams
from ejkernel.ops.config import ConfigBase
from ejkernel.reference.grouped_matmul import grouped_matmul_reference
from harness import check_forward_and_grads, randn

# 44 rows: empty groups (first and middle), groups no multiple of a tile, 4 rows past the last group.
SIZES = jnp.array([0, 9, 14, 0, 5, 12], jnp.int32)
M, K, N = 44, 24, 20
BYPASS = GroupedMatmulConfig(bypass_xla_tiling=True)  # EasyDeL's `_linear_moe` config
EASYDEL_PALLAS = GroupedMatmulConfig(platform="pallas", bypass_xla_tiling=True, block_m=1024, block_n=1024, block_k=512)
TINY = GroupedMatmulConfig(block_m=1, block_n=2, block_k=4, num_warps=1, num_stages=1)


def _xla(cfg):
    """A public call on the XLA platform with `cfg` (its tiles; `bypass_xla_tiling` as given)."""
    return functools.partial(grouped_matmul, platform="xla", cfg=dataclasses.replace(cfg, platform="auto"))


XLA = {"xla": _xla(GroupedMatmulConfig(block_m=16)), "xla-ragged-dot": _xla(BYPASS)}  # the public XLA paths
KERNELS = {  # run in interpret mode on this CPU, with EasyDeL's tiles (which they fit to the problem)
    "triton": functools.partial(grouped_matmul_triton, cfg=EASYDEL_PALLAS, interpret=True),
    "tpu": functools.partial(tpu.grouped_matmul_tpu, cfg=EASYDEL_PALLAS, interpret=True),
}


def _grad_dtypes(fn, args):
    out, vjp = jax.vjp(fn, *args)
    return out.dtype, [g.dtype for g in vjp(jnp.ones_like(out))]


# ---- the config ----


def test_config_takes_upstream_fields_by_keyword():
    assert configs.GroupedMatmulConfig is GroupedMatmulConfig
    cfg = GroupedMatmulConfig(platform="xla", bypass_xla_tiling=True)
    assert (cfg.platform, cfg.bypass_xla_tiling, cfg.block_m, cfg.num_stages) == ("xla", True, None, None)
    tiles = dataclasses.replace(EASYDEL_PALLAS, block_k=256)
    assert (tiles.block_m, tiles.block_n, tiles.block_k, tiles.bypass_xla_tiling) == (1024, 1024, 256, True)
    assert ConfigBase.from_json(tiles.to_json()) == tiles and len({tiles, dataclasses.replace(tiles)}) == 1
    # Flat fields fill both products' tilings in our names (384 rounded down); a product's own field stays.
    both = dict(block_q=256, block_k=512, num_warps=8, num_stages=3)
    mixed = GroupedMatmulConfig(block_m=384, block_k=512, num_warps=8, num_stages=3, fwd_params=FwdParams(block_d=32))
    assert tile_params(mixed) == (TileParams(block_d=32, **both), TileParams(**both))
    assert tile_params(GroupedMatmulConfig()) == (None, None)


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        (dict(block_m=0), "block_m must be a positive int"),
        (dict(block_k=1.5), "block_k must be a positive int"),
        (dict(num_stages=True), "num_stages must be a positive int"),
        (dict(bypass_xla_tiling="yes"), "bypass_xla_tiling must be a bool"),
        (dict(block_m=128, fwd_params=FwdParams(block_q=64)), "block_m=128 contradicts fwd_params.block_q=64"),
    ],
)
def test_config_errors_name_the_field(fields, words):
    with pytest.raises(ValueError, match=words):
        GroupedMatmulConfig(**fields)


# ---- bypass_xla_tiling: XLA's ragged dot ----


@pytest.mark.parametrize(
    ("transpose_rhs", "where"),
    [
        (True, dict(platform="xla", cfg=BYPASS)),  # EasyDeL's `_linear_moe` (out-first weights)
        (False, dict(cfg=GroupedMatmulConfig(platform="xla", bypass_xla_tiling=True))),  # its `_moe_module`
    ],
)
def test_bypass_is_xla_ragged_dot(transpose_rhs, where):
    """EasyDeL's calls with the bypass config, bfloat16 out: one ragged dot (the tiled loop has none)."""
    call = dict(preferred_element_type=jnp.bfloat16, transpose_rhs=transpose_rhs)
    fn = lambda lhs, rhs: grouped_matmul(lhs, rhs, SIZES, **call, **where)
    ref = lambda lhs, rhs: grouped_matmul_reference(lhs, rhs, SIZES, transpose_rhs=transpose_rhs)
    args = [randn((M, K), jnp.bfloat16), randn((6, N, K) if transpose_rhs else (6, K, N), jnp.bfloat16)]
    check_forward_and_grads(fn, ref, args, (0, 1), jnp.bfloat16)
    assert "ragged_dot_general" in str(jax.make_jaxpr(fn)(*args))
    tiled = lambda *a: grouped_matmul(*a, SIZES, **call, platform="xla")
    assert "ragged_dot_general" not in str(jax.make_jaxpr(tiled)(*args))


@pytest.mark.parametrize(
    ("sizes", "offset", "groups"),
    [((3, 0, 21, 0, 20), None, 5), ((0, 19, 0, 5, 11, 6), None, 6), ((7, 0, 12, 9, 3, 10), 2, 3)],
)
def test_bypass_traced_sizes_offset_and_existing_out(sizes, offset, groups):
    """Upstream's bypass test form (jitted, traced sizes, `None, existing`, bfloat16 out, use_v2=True); an
    expert-parallel shard (`group_offset`) too. existing_out (float32) is cast to bfloat16 and added."""
    run = jax.jit(
        lambda lhs, rhs, sizes, existing: grouped_matmul(
            lhs,
            rhs,
            sizes,
            offset,
            existing,
            preferred_element_type=jnp.bfloat16,
            precision=jax.lax.Precision.DEFAULT,
            platform="xla",
            cfg=BYPASS,
            use_v2=True,
        )
    )
    sizes = jnp.array(sizes, jnp.int32)
    fn = lambda lhs, rhs, existing: run(lhs, rhs, sizes, existing)
    ref = lambda *a: grouped_matmul_reference(*a[:2], sizes, offset, a[2], preferred_element_type=jnp.bfloat16)
    ref = lambda *a, ref=ref: ref(*a).astype(jnp.float32)  # (the oracle runs in float32)
    args = [randn((M, K)), randn((groups, K, N)), randn((M, N))]
    check_forward_and_grads(fn, ref, args, (0, 1, 2), jnp.bfloat16)


def test_bypass_on_global_arrays_split_over_columns():
    """Upstream's tensor-parallel form: eager global arrays (lhs's K and the weights' experts and N split over
    4 devices of automatic axes) and no `mesh=` argument; every device's output shard holds its columns."""
    mesh = jax.make_mesh((1, 4), ("ep", "tp"), (AxisType.Auto,) * 2, devices=jax.devices()[:4])
    put = lambda x, *spec: jax.device_put(x, NamedSharding(mesh, P(*spec)))
    lhs, rhs = put(randn((M, 64)), None, "tp"), put(randn((6, 64, 128)), "ep", None, "tp")
    fn = lambda lhs, rhs: grouped_matmul(lhs, rhs, SIZES, platform="xla", cfg=BYPASS)
    with jax.set_mesh(mesh):
        check_forward_and_grads(fn, lambda *a: grouped_matmul_reference(*a, SIZES), [lhs, rhs], (0, 1), jnp.float32)
        out = fn(lhs, rhs)
    assert out.sharding.is_equivalent_to(NamedSharding(mesh, P(None, "tp")), 2)


# ---- knob values: performance only, never a failure ----


@pytest.mark.parametrize(
    ("impl", "cfg"),
    [("xla", EASYDEL_PALLAS), ("xla", TINY), ("triton", TINY)],
    ids=["xla-large", "xla-tiny", "triton-tiny"],
)
def test_any_knob_value_runs(impl, cfg):
    """Tiles larger than the problem (EasyDeL's block_k=512 > K) or below what a kernel takes are fitted to it.
    (The kernels with EasyDeL's large tiles: `test_kernels_mixed_dtypes_existing_out`; the TPU kernel's
    small tiles, compiled: `test_tpu_compiled_blocks_fit_the_tpu_tiling`.)"""
    fn = {
        "xla": _xla(dataclasses.replace(cfg, bypass_xla_tiling=False)),
        "triton": functools.partial(grouped_matmul_triton, cfg=cfg, interpret=True),
    }[impl]
    check_forward_and_grads(
        lambda lhs, rhs: fn(lhs, rhs, SIZES),
        lambda lhs, rhs: grouped_matmul_reference(lhs, rhs, SIZES),
        [randn((M, K)), randn((6, K, N))],
        (0, 1),
        jnp.float32,
    )


def test_tpu_compiled_blocks_fit_the_tpu_tiling():
    """Compiled, each block is a multiple of its granule (8 along a tile's second-minor axis, 128 along its
    minor one) or its whole dimension, whatever the config asks."""
    small, large = FwdParams(block_q=1, block_k=4, block_d=2), FwdParams(block_q=1024, block_k=512, block_d=1024)
    assert tpu.tiling(small, 44, 300, 1000, False) == tpu.TpuGroupedMatmulTiling(8, 128, 128, False)
    assert tpu.tiling(small, 300, 44, 1000, False, tpu.TGMM_GRANULES) == tpu.TpuGroupedMatmulTiling(128, 8, 128, False)
    assert tpu.tiling(large, 44, 300, 1000, False) == tpu.TpuGroupedMatmulTiling(44, 300, 1000, False)
    assert tpu.tiling(small, 44, 300, 1000, tpu.resolve_interpret(None)).block_m == 1  # interpret: as given


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="on a GPU platform='pallas' runs the Mosaic GPU kernels")
def test_pallas_on_a_cpu_host_is_a_clear_error():
    with pytest.raises(ValueError, match=r"platform='pallas'.*cpu"):
        grouped_matmul(randn((M, K)), randn((6, K, N)), SIZES, cfg=EASYDEL_PALLAS)


# ---- mixed float dtypes and existing_out ----


@pytest.mark.parametrize("impl", XLA)
def test_bfloat16_lhs_with_float32_rhs(impl):
    """gpt-oss's MoE call: multiplied in float32, float32 out (also for preferred_element_type=None), each
    gradient in its own input's dtype."""
    fn = lambda lhs, rhs: XLA[impl](lhs, rhs, SIZES, preferred_element_type=None)
    args = [randn((M, K), jnp.bfloat16), randn((6, K, N))]
    check_forward_and_grads(fn, lambda *a: grouped_matmul_reference(*a, SIZES), args, (0, 1), jnp.bfloat16)
    assert _grad_dtypes(fn, args) == (jnp.float32, [jnp.bfloat16, jnp.float32])


@pytest.mark.parametrize("impl", XLA)
def test_existing_out_is_added_to_every_row(impl):
    """A shard of groups 1..3 with a float32 existing_out and bfloat16 out: owned rows are the product plus
    existing_out, the others existing_out; its gradient is the cotangent, in its own dtype."""
    call = dict(preferred_element_type=jnp.bfloat16)
    fn = lambda lhs, rhs, existing: XLA[impl](lhs, rhs, SIZES, jnp.int32(1), existing, **call)
    ref = lambda *a: grouped_matmul_reference(*a[:2], SIZES, 1, a[2], **call).astype(jnp.float32)
    args = [randn((M, K)), randn((3, K, N)), randn((M, N))]
    check_forward_and_grads(fn, ref, args, (0, 1, 2), jnp.bfloat16)
    out, vjp = jax.vjp(lambda existing: fn(*args[:2], existing), args[2])
    cotangent = randn(out.shape, out.dtype)
    assert vjp(cotangent)[0].dtype == jnp.float32
    assert bool(jnp.all(vjp(cotangent)[0] == cotangent.astype(jnp.float32)))


@pytest.mark.parametrize("impl", KERNELS)
def test_kernels_mixed_dtypes_existing_out(impl):
    """Both forms at once through the kernels (one interpret-mode run each): bfloat16 lhs, float32 rhs and
    existing_out, a shard of groups 1..3, bfloat16 out; gradients in their inputs' dtypes."""
    call = dict(preferred_element_type=jnp.bfloat16)
    fn = lambda lhs, rhs, existing: KERNELS[impl](lhs, rhs, SIZES, jnp.int32(1), existing, **call)
    ref = lambda *a: grouped_matmul_reference(*a[:2], SIZES, 1, a[2], **call).astype(jnp.float32)
    args = [randn((M, K), jnp.bfloat16), randn((3, K, N)), randn((M, N))]
    check_forward_and_grads(fn, ref, args, (0, 1, 2), jnp.bfloat16)
    assert _grad_dtypes(fn, args) == (jnp.bfloat16, [jnp.bfloat16, jnp.float32, jnp.float32])


# ---- upstream's test call forms ----


@pytest.mark.parametrize("flags", [{}, dict(use_v2=True), dict(use_v3=True), dict(interpret=True)])
def test_upstream_existing_out_and_version_flags(flags):
    call = lambda lhs, rhs, existing: grouped_matmul(
        lhs, rhs, SIZES, None, existing, do_padding=False, platform="xla", **flags
    )
    ref = lambda lhs, rhs, existing: grouped_matmul_reference(lhs, rhs, SIZES, None, existing)
    check_forward_and_grads(call, ref, [randn((M, K)), randn((6, K, N)), randn((M, N))], (0, 1, 2), jnp.float32)


def test_upstream_v3_scale_bias_and_existing_out():
    def call(lhs, rhs, scale, bias, existing):
        options = dict(do_padding=False, rhs_scale=scale, rhs_bias=bias, use_v3=True, platform="xla")
        return grouped_matmul(lhs, rhs, SIZES, None, existing, **options)

    ref = lambda *a: grouped_matmul_reference(*a[:2], SIZES, None, a[4], rhs_scale=a[2], rhs_bias=a[3])
    args = [randn((M, K)), randn((6, K, N)), randn((6, 2, 1, N)), randn((6, 1, N)), randn((M, N))]
    check_forward_and_grads(call, ref, args, (0, 1, 2, 3, 4), jnp.float32)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        (dict(use_v2=True, use_v3=True), "use_v2 and use_v3 are mutually exclusive"),
        (dict(rhs_scale=jnp.ones((6, 2, 1, N))), "rhs_scale is a grouped_matmulv3 option"),
    ],
)
def test_upstream_flag_errors(options, words):
    with pytest.raises(ValueError, match=words):
        grouped_matmul(jnp.ones((M, K)), jnp.ones((6, K, N)), SIZES, platform="xla", **options)
