"""grouped_matmul: the XLA implementation and the public function against the reference; options, sharding, errors."""

import functools
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from ejkernel.kernels._common.grouped_matmul import max_row_spans, max_work_items, row_spans, work_items
from ejkernel.kernels._xla.grouped_matmul._interface import grouped_matmul_xla
from ejkernel.modules import GroupedMatmul, GroupedMatmulConfig, grouped_matmul
from ejkernel.ops import FwdParams, Invocation
from ejkernel.quantization import quantize_array
from ejkernel.reference.grouped_matmul import grouped_matmul_reference
from harness import assert_close, check_forward_and_grads, randn

SMALL = GroupedMatmulConfig(platform="xla", fwd_params=FwdParams(block_q=16))  # several tiles per call
# 100 rows: empty groups (first, middle, last), sizes that are no multiple of 16, 3 rows past the groups.
SIZES = jnp.array([0, 7, 30, 0, 1, 16, 43, 0], jnp.int32)
M, K, N = 100, 24, 40


def _check(lhs, rhs, *rest, argnums=(0, 1), sizes=SIZES, offset=None, **options):
    """XLA (jitted, 16-row tiles) vs the reference (jitted: the sizes and offset are closed over)."""
    fn = jax.jit(lambda lhs, rhs, *a: grouped_matmul_xla(lhs, rhs, sizes, offset, *a, cfg=SMALL, **options))
    ref = jax.jit(lambda lhs, rhs, *a: grouped_matmul_reference(lhs, rhs, sizes, offset, *a, **options))
    check_forward_and_grads(fn, ref, [lhs, rhs, *rest], argnums, lhs.dtype)


@pytest.mark.lowest
@pytest.mark.parametrize(("dtype", "transpose_rhs"), [(jnp.float32, False), (jnp.bfloat16, True)])
def test_matches_reference(dtype, transpose_rhs):
    rhs_shape = (8, N, K) if transpose_rhs else (8, K, N)
    _check(randn((M, K), dtype), randn(rhs_shape, dtype), transpose_rhs=transpose_rhs)


def test_group_offset_and_existing_out():
    """This shard holds groups 2..5: existing_out is added to every row (rows of other groups, and past the
    last, keep it as it is)."""
    existing = randn((M, N))
    _check(randn((M, K)), randn((4, K, N)), existing, offset=jnp.int32(2), argnums=(0, 1, 2))


def test_vmap_over_experts_shards():
    """A vmapped call (one group layout per row of the batch) equals the calls one by one, with gradients."""
    sizes = jnp.stack([SIZES, jnp.roll(SIZES, 3)])
    fn = jax.vmap(lambda lhs, rhs, sizes: grouped_matmul(lhs, rhs, sizes, cfg=SMALL))
    ref = lambda lhs, rhs: jnp.stack([grouped_matmul_reference(lhs[i], rhs[i], sizes[i]) for i in range(2)])
    check_forward_and_grads(
        lambda lhs, rhs: fn(lhs, rhs, sizes), ref, [randn((2, M, K)), randn((2, 8, K, N))], (0, 1), jnp.float32
    )


def test_v3_scale_and_bias():
    fn = jax.jit(lambda *a: grouped_matmul_xla(*a[:2], SIZES, rhs_scale=a[2], rhs_bias=a[3], use_v3=True, cfg=SMALL))
    ref = jax.jit(lambda *a: grouped_matmul_reference(*a[:2], SIZES, rhs_scale=a[2], rhs_bias=a[3]))
    args = [randn((M, K)), randn((8, K, N)), randn((8, 3, 1, N)), randn((8, 1, N))]
    check_forward_and_grads(fn, ref, args, (0, 1, 2, 3), jnp.float32)


def test_v3_int8_rhs_and_bf16_output():
    lhs = randn((M, K), jnp.bfloat16)
    rhs = jax.random.randint(jax.random.PRNGKey(7), (8, K, N), -127, 128, jnp.int8)
    scale = jnp.abs(randn((8, 2, 1, N))) / 64
    fn = jax.jit(functools.partial(grouped_matmul, use_v3=True, preferred_element_type=jnp.bfloat16, cfg=SMALL))
    out = fn(lhs, rhs, SIZES, rhs_scale=scale)
    assert out.dtype == jnp.bfloat16
    ref = jax.jit(lambda lhs, rhs, scale: grouped_matmul_reference(lhs, rhs, SIZES, rhs_scale=scale))
    assert_close(out, ref(lhs, rhs, scale))


def test_schedule_covers_every_row_once():
    """Per tile, the written row ranges of its items tile it exactly; computed rows are the owned ones."""
    sizes, block = jnp.array([5, 0, 17, 3, 0, 40, 1, 0], jnp.int32), 16
    schedule = jax.jit(work_items, static_argnums=(2, 3, 4))
    for offset, local in ((0, 8), (2, 3), (6, 2)):
        items = jax.tree.map(np.asarray, schedule(sizes, jnp.int32(offset), local, 70, block))
        assert len(items.tile) == max_work_items(70, block, local)
        written = np.zeros(70, int)
        computed = np.full(70, -1)
        for t, g, lo, hi, wlo, whi in zip(*items, strict=True):
            assert t * block <= wlo <= lo <= hi <= whi <= min(t * block + block, 70)
            written[wlo:whi] += 1
            computed[lo:hi] = g
        assert (written == 1).all()
        bounds = np.concatenate([[0], np.cumsum(np.asarray(sizes))])
        expected = np.full(70, -1)
        for g in range(local):
            expected[bounds[offset + g] : bounds[offset + g + 1]] = g
        np.testing.assert_array_equal(computed, expected)


@pytest.mark.parametrize("align", [1, 8])
def test_row_spans_write_every_row_once_from_its_own_group(align):
    """Each row is written once: by a span of its group (the span read only rows in [0, M), or with `align`
    from a multiple of it) or, outside the local groups, as a zero-filling span; every group but its first
    (aligned) and last span is whole."""
    sizes, block, m = jnp.array([5, 0, 17, 3, 0, 40, 1, 0], jnp.int32), 16, 70
    schedule = jax.jit(row_spans, static_argnums=(2, 3, 4, 5))
    bounds = np.concatenate([[0], np.cumsum(np.asarray(sizes))])
    for offset, local in ((0, 8), (2, 3), (6, 2)):
        spans = jax.tree.map(np.asarray, schedule(sizes, jnp.int32(offset), local, m, block, align))
        assert len(spans.start) == max_row_spans(m, block, local, align)
        written, by = np.zeros(m, int), np.full(m, -2)
        for start, group, lo, hi in zip(*spans, strict=True):
            assert start >= 0 and start % align == 0 and (align > 1 or start + block <= m)
            if hi > lo:
                assert start <= lo < hi <= start + block
            written[lo:hi] += 1
            by[lo:hi] = group
        assert (written == 1).all()
        expected = np.full(m, -1)
        for g in range(local):
            g_lo, g_hi = bounds[offset + g], bounds[offset + g + 1]
            expected[g_lo:g_hi] = g
            count = np.sum((spans.group == g) & (spans.write_hi > spans.write_lo))
            assert count == -(-(g_hi - g_lo // align * align) // block) if g_hi > g_lo else count == 0
        np.testing.assert_array_equal(by, expected)


@pytest.mark.parametrize(
    ("backend", "kind", "mode", "platform", "options"),
    [
        ("gpu", "NVIDIA H100 80GB HBM3", "forward", "triton", {}),  # inference on an H100: Triton's forward (a
        # preference: where it declines, auto's order; `test_dispatch`'s preferred-platform tests)
        ("gpu", "NVIDIA H200", "forward", "auto", {}),  # elsewhere auto's order (the Mosaic GPU forward first)
        ("gpu", "NVIDIA H100 80GB HBM3", "train", "auto", {}),  # training: auto's order (Mosaic GPU first)
        ("cpu", "cpu", "forward", "auto", {}),
        ("gpu", "NVIDIA H100 80GB HBM3", "forward", "auto", {"fp8_lhs": True}),  # the Mosaic GPU FP8 forward first
    ],
)
def test_heuristic_prefers_triton_for_h100_inference(monkeypatch, backend, kind, mode, platform, options):
    module = importlib.import_module("ejkernel.modules.operations.grouped_matmul")  # not the function
    monkeypatch.setattr(module, "current_backend", lambda: module.Backend(backend))
    monkeypatch.setattr(module, "describe_device", lambda: {"device_kind": kind})
    args = (jnp.zeros((64, 16), jnp.bfloat16), jnp.zeros((4, 16, 8), jnp.bfloat16), jnp.full((4,), 16, jnp.int32))
    cfg = GroupedMatmul().heuristic_cfg(Invocation("grouped_matmul", args, options, "auto", mode))
    assert cfg.platform == platform


@pytest.mark.parametrize(
    ("fmt", "platform"),
    [(dict(mode="mxfp4"), "auto"), (dict(mode="affine", bits=4), "auto"), (dict(mode="affine", bits=8), "auto")],
)
def test_heuristic_keeps_auto_for_quantized_weights(monkeypatch, fmt, platform):
    """Forward calls on quantized weights keep auto's order: the Mosaic GPU 4-bit forward first, which declines the
    formats it does not decode (8-bit ones: `test_grouped_matmul_mosaic_four_bit`), so Triton serves those."""
    module = importlib.import_module("ejkernel.modules.operations.grouped_matmul")
    monkeypatch.setattr(module, "current_backend", lambda: module.Backend("gpu"))
    rhs = quantize_array(jnp.ones((4, 64, 8)), axis="row", **fmt)
    args = (jnp.zeros((64, 64), jnp.bfloat16), rhs, jnp.full((4,), 16, jnp.int32))
    cfg = GroupedMatmul().heuristic_cfg(Invocation("grouped_matmul", args, {}, "auto", "forward"))
    assert cfg.platform == platform


def test_public_function_jit_traced_sizes_and_checkpoint():
    lhs, rhs = randn((M, K)), randn((8, K, N))
    fn = jax.jit(lambda lhs, rhs, sizes: grouped_matmul(lhs, rhs, sizes, cfg=SMALL))
    assert_close(fn(lhs, rhs, SIZES), grouped_matmul_reference(lhs, rhs, SIZES))
    other = jnp.array([50, 0, 0, 0, 0, 0, 0, 50], jnp.int32)  # same compiled function, new sizes
    assert_close(fn(lhs, rhs, other), grouped_matmul_reference(lhs, rhs, other))
    loss = lambda f: jax.jit(jax.grad(lambda rhs: jnp.sum(jnp.tanh(f(lhs, rhs)))))
    grad = loss(jax.checkpoint(lambda lhs, rhs: grouped_matmul(lhs, rhs, SIZES, cfg=SMALL)))(rhs)
    assert_close(grad, loss(lambda lhs, rhs: grouped_matmul_reference(lhs, rhs, SIZES))(rhs))


def test_autotuning_stand_in_for_traced_group_sizes_shares_the_rows():
    """Under jit the group sizes are a tracer: the tuner times the op on sizes that share every row among the
    groups (the generic zeros would leave every row in no group: an empty problem)."""
    lhs, rhs = randn((100, 16)), randn((8, 16, 32))
    captured = {}

    def trace(sizes):
        with jax.ensure_compile_time_eval():
            captured["args"] = GroupedMatmul().tuning_inputs(Invocation("grouped_matmul", (lhs, rhs, sizes), {}))[0]
        return sizes

    jax.jit(trace)(jnp.zeros((8,), jnp.int32))
    sizes = captured["args"][2]
    assert sizes.dtype == jnp.int32 and int(sizes.sum()) == 100 and int(sizes.min()) == 12


@pytest.mark.lowest
def test_expert_parallel_shards_with_offsets_and_callback():
    """Each of 8 devices holds 2 experts (group_offset 0, 2, ...); a psum joins the shards' rows."""
    mesh = jax.make_mesh((8,), ("ep",))
    sizes = jnp.array([9, 0, 4, 12, 3, 0, 0, 20, 5, 6, 1, 0, 7, 2, 8, 10], jnp.int32)
    lhs, rhs = randn((M, K)), randn((16, K, N))
    offsets = jnp.arange(0, 16, 2, dtype=jnp.int32)
    sharded = functools.partial(
        grouped_matmul,
        mesh=mesh,
        in_specs=(P(), P("ep"), P(), P("ep")),
        out_specs=P(),
        out_shard_callback=lambda out: jax.lax.psum(out, "ep"),
    )
    assert_close(sharded(lhs, rhs, sizes, offsets), grouped_matmul_reference(lhs, rhs, sizes))
    loss = lambda f: jax.grad(lambda lhs, rhs: jnp.sum(jnp.sin(f(lhs, rhs))), argnums=(0, 1))
    with jax.set_mesh(mesh):  # reductions of explicitly sharded results need the mesh in context
        grads = loss(lambda lhs, rhs: sharded(lhs, rhs, sizes, offsets))(lhs, rhs)
    expected = loss(lambda lhs, rhs: grouped_matmul_reference(lhs, rhs, sizes))(lhs, rhs)
    for grad, ref in zip(grads, expected, strict=True):
        assert_close(grad, ref)


@pytest.mark.lowest
@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda a: grouped_matmul(*a, use_v2=True, use_v3=True), ValueError, "use_v2 and use_v3 are mutually"),
        (lambda a: grouped_matmul(*a, rhs_bias=jnp.zeros((8, 1, N))), ValueError, "grouped_matmulv3.*use_v3"),
        (lambda a: grouped_matmul(a[0][:, :5], *a[1:]), ValueError, "contraction"),
        (lambda a: grouped_matmul(a[0].astype(jnp.int32), *a[1:]), Exception, "lhs"),
        (lambda a: grouped_matmul(a[0], a[1].astype(jnp.int8), a[2]), TypeError, "integer with rhs_scale"),
        (lambda a: grouped_matmul(*a[:2], a[2].at[0].set(200)), ValueError, "sum to at most"),
        (lambda a: grouped_matmul(*a[:2], a[2].at[0].set(-1)), ValueError, "non-negative"),
        (lambda a: grouped_matmul(*a, 1), ValueError, r"group_offset = 1 is outside \[0, 0\]"),
        (lambda a: grouped_matmul(a[0], a[1][:3], a[2]), ValueError, "group_offset"),
        (lambda a: grouped_matmul(*a, None, jnp.zeros((M, N), jnp.int32)), Exception, "existing_out"),
        (lambda a: grouped_matmul(*a, None, jnp.zeros((M, N + 1))), Exception, "existing_out"),
        (lambda a: grouped_matmul(*a, use_v3=True, rhs_scale=jnp.ones((8, 5, 1, N))), ValueError, "divide K"),
        (lambda a: grouped_matmul(*a, transpose_rhs=True), ValueError, "transpose_rhs"),
        (lambda a: grouped_matmul(*a, platform="cuda"), ValueError, "grouped_matmul"),
    ],
)
def test_bad_input_names_the_argument(call, error, words):
    with pytest.raises(error, match=words):
        call((jnp.ones((M, K)), jnp.ones((8, K, N)), SIZES))
