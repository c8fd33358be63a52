"""Ring attention on simulated CPU devices (rings of 2, 3 and 4) against the dense reference: forward, gradients.

Covers the three calling modes (inside a user's shard_map, mesh=/in_specs=/out_specs=, `with
jax.set_mesh`), both layouts (contiguous; mirrored for causal calls that shard the sequence themselves),
MHA / GQA / MQA, causal, windows, soft cap, sinks, segments with padding, and the errors.
"""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

from ejkernel.kernels._common.attention_call import AttentionCall
from ejkernel.kernels._common.flash_attention.forward import attention_forward
from ejkernel.kernels._common.flash_attention.tiles import AttentionSpec
from ejkernel.kernels._common.ring import RingSpec, from_mirrored, to_mirrored
from ejkernel.modules import RingAttentionConfig, ring_attention
from ejkernel.ops import FwdParams
from ejkernel.reference.flash_attention import flash_attention_reference
from ejkernel.types import MaskInfo
from harness import assert_close, check_forward_and_grads, randn

ring_module = importlib.import_module("ejkernel.modules.operations.ring_attention")  # the module, not the function

B, S, H, D = 2, 64, 4, 16
SEQ = P(None, "sp")


def ring_mesh(axis_types=AxisType.Auto):
    """Four of the simulated devices: a ring longer than two (the mirrored layout's traced diagonal), at half the
    trace and compile time of eight."""
    return jax.make_mesh((4,), ("sp",), axis_types=(axis_types,), devices=jax.devices()[:4])


def qkv(kv_heads, length=S, dtype=jnp.float32):
    return (
        randn((B, length, H, D), dtype),
        randn((B, length, kv_heads, D), dtype),
        randn((B, length, kv_heads, D), dtype),
    )


def segments(length=S):
    """Three segments per row, cut at different places in each row, and trailing padding (-1)."""
    ids = np.zeros((B, length), np.int32)
    ids[0, 20:] = 1
    ids[0, 45:] = 2
    ids[1, 9:] = 1
    ids[1, 37:] = 2
    ids[:, length - 5 :] = -1
    return jnp.asarray(ids)


def reference(q, k, v, aux=None, seg=None, **kw):
    return flash_attention_reference(
        q, k, v, None, aux, q_segment_ids=seg, kv_segment_ids=seg, softmax_scale=D**-0.5, **kw
    )


def check(fn, ref, args, dtype=jnp.float32):
    """Forward and the VJP of every float argument (q, k, v and the sinks when given), jitted."""
    check_forward_and_grads(jax.jit(fn), jax.jit(ref), args, tuple(range(len(args))), dtype)


# ---- inside a user's shard_map: contiguous layout --------------------------------------------------

SHARD_MAP_CASES = {
    "mha": dict(kv_heads=4, kw={}),
    "mqa-causal-softcap-sinks": dict(kv_heads=1, kw={"causal": True, "logits_soft_cap": 2.0}, sinks=H),
    "gqa-segments-window-shared-sinks": dict(kv_heads=2, kw={"sliding_window": (6, 17)}, sinks=3, segments=True),
}


@pytest.mark.parametrize("case", SHARD_MAP_CASES)
def test_inside_user_shard_map(case):
    c = SHARD_MAP_CASES[case]
    q, k, v = qkv(c["kv_heads"])
    if "logits_soft_cap" in c["kw"]:
        q = q * 3.0
    args = [q, k, v] + ([randn((c["sinks"],))] if "sinks" in c else [])
    seg = segments() if c.get("segments") else jnp.zeros((B, S), jnp.int32)
    has_seg = c.get("segments", False)
    mesh = ring_mesh()

    def body(seg, q, k, v, *aux):
        mask = MaskInfo.from_segments(seg) if has_seg else None
        return ring_attention(q, k, v, *aux, mask_info=mask, axis_name="sp", **c["kw"])

    def fn(*a):
        specs = (SEQ, SEQ, SEQ, SEQ) + (P(),) * (len(a) - 3)
        return jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=SEQ)(seg, *a)

    def ref(q, k, v, *aux):
        return reference(q, k, v, aux[0] if aux else None, seg if has_seg else None, **c["kw"])

    check(fn, ref, args)


def test_bias_inside_user_shard_map():
    """Inside the caller's shard_map a bias is the local query rows against every key of the ring."""
    q, k, v = qkv(2)
    bias = randn((B, H, S, S))

    def body(q, k, v, bias):
        return ring_attention(q, k, v, None, bias, axis_name="sp", causal=True)

    rows = P(None, None, "sp")
    fn = jax.shard_map(body, mesh=ring_mesh(), in_specs=(SEQ, SEQ, SEQ, rows), out_specs=SEQ)
    expected = flash_attention_reference(q, k, v, bias, softmax_scale=D**-0.5, causal=True)
    assert_close(jax.jit(fn)(q, k, v, bias), expected)


# ---- mesh= / in_specs= / out_specs= ----------------------------------------------------------------


def test_mesh_causal_mirrored_gqa_segments_sinks():
    """Causal: mirrored layout; batch over "dp" as the specs say, the sequence over "sp"."""
    mesh = jax.make_mesh((2, 4), ("dp", "sp"), axis_types=(AxisType.Auto,) * 2)
    q, k, v = qkv(2, length=128)
    aux = randn((H,))
    seg = segments(128)
    mask = MaskInfo.from_segments(seg)
    spec = P("dp", "sp")
    cfg = RingAttentionConfig(fwd_params=FwdParams(block_q=8, block_k=4))  # several tiles per step

    def fn(q, k, v, aux):
        return ring_attention(
            q, k, v, aux, mask_info=mask, causal=True, cfg=cfg, mesh=mesh, in_specs=(spec,) * 3 + (P(),), out_specs=spec
        )

    check(fn, lambda q, k, v, aux: reference(q, k, v, aux, seg, causal=True), [q, k, v, aux])


@pytest.mark.parametrize("layout", ["mirrored", "contiguous"])
def test_mesh_bias_sliced_per_step(layout):
    """A per-head bias and one broadcast over heads: forward and every gradient, dbias included."""
    mesh = jax.make_mesh((4,), ("sp",), axis_types=(AxisType.Auto,), devices=jax.devices()[:4])
    q, k, v = qkv(2, length=32)
    bias = randn((B, H, 32, 32)) if layout == "mirrored" else randn((1, 1, 32, 32))
    causal = layout == "mirrored"

    def fn(q, k, v, bias):
        specs = (SEQ, SEQ, SEQ, None, P())  # upstream's one spec per slot; the bias spec is worked out
        return ring_attention(q, k, v, None, bias, causal=causal, mesh=mesh, in_specs=specs, out_specs=SEQ)

    def ref(q, k, v, bias):
        return flash_attention_reference(q, k, v, bias, softmax_scale=D**-0.5, causal=causal)

    check(fn, ref, [q, k, v, bias])


def test_mesh_causal_mirrored_on_an_odd_ring_with_window():
    """Three devices: the middle one keeps both its halves (its mirror is itself)."""
    mesh = jax.make_mesh((3,), ("sp",), axis_types=(AxisType.Auto,), devices=jax.devices()[:3])
    q, k, v = qkv(2, length=48)
    kw = dict(causal=True, sliding_window=(20, 0))

    def fn(q, k, v):
        return ring_attention(q, k, v, mesh=mesh, in_specs=(SEQ,) * 3, out_specs=SEQ, **kw)

    check(fn, lambda q, k, v: reference(q, k, v, **kw), [q, k, v])


@pytest.mark.lowest
def test_mesh_non_causal_contiguous_mqa_int_window_chunk_size():
    """Specs that leave the sequence unsharded: ring_attention shards it over "sp" itself."""
    mesh = ring_mesh(AxisType.Explicit)
    q, k, v = qkv(1)

    def fn(q, k, v):
        return ring_attention(q, k, v, sliding_window=9, chunk_size=4, mesh=mesh, in_specs=(P(),) * 3, out_specs=P())

    check(fn, lambda q, k, v: reference(q, k, v, sliding_window=(9, 9)), [q, k, v])


def test_set_mesh_causal_window_under_jit_bfloat16():
    mesh = ring_mesh(AxisType.Explicit)
    q, k, v = qkv(2, dtype=jnp.bfloat16)
    with jax.set_mesh(mesh):
        # Explicit axes: the output's type says it is sharded; replicate it for the harness's cotangent.
        fn = lambda q, k, v: jax.sharding.reshard(ring_attention(q, k, v, causal=True, sliding_window=(20, 3)), P())
        check(fn, lambda q, k, v: reference(q, k, v, causal=True, sliding_window=(20, 0)), [q, k, v], jnp.bfloat16)


def test_set_mesh_keeps_the_batch_sharding_of_explicit_inputs():
    mesh = jax.make_mesh((2, 4), ("dp", "sp"))
    q, k, v = qkv(4)
    with jax.set_mesh(mesh):
        q, k, v = (jax.device_put(x, P("dp")) for x in (q, k, v))
        out = jax.jit(lambda q, k, v: ring_attention(q, k, v, causal=True))(q, k, v)
    assert out.sharding.spec[:2] == ("dp", "sp")
    assert_close(out, reference(q, k, v, causal=True))


@pytest.mark.lowest
def test_legacy_mesh_context():
    """`with mesh:` (deprecated by JAX, named by API.md) works like `jax.set_mesh`."""
    q, k, v = qkv(2)
    with pytest.warns(DeprecationWarning), ring_mesh():
        out = ring_attention(q, k, v, causal=True)
    assert_close(out, reference(q, k, v, causal=True))


# ---- layouts and the per-step kernel ---------------------------------------------------------------


@pytest.mark.parametrize("n", [8, 5])
def test_mirrored_reorder_places_chunks_and_inverts(n):
    chunk = 3
    x = jnp.arange(2 * n * chunk, dtype=jnp.float32).reshape(1, -1)
    mesh = jax.make_mesh((n,), ("sp",), axis_types=(AxisType.Auto,), devices=jax.devices()[:n])

    def body(x):
        pieces = to_mirrored(x, "sp", n)
        return jnp.concatenate(pieces, axis=1), from_mirrored(pieces, "sp", n)

    z, back = jax.shard_map(body, mesh=mesh, in_specs=SEQ, out_specs=(SEQ, SEQ))(x)
    chunks = np.asarray(z).reshape(n, 2, chunk)[:, :, 0] // chunk
    np.testing.assert_array_equal(chunks, [[2 * d, 2 * n - 1 - 2 * d] for d in range(n)])
    np.testing.assert_array_equal(np.asarray(back), np.asarray(x))


@pytest.mark.parametrize("mirrored_keys", [False, True])
def test_diagonal_is_where_query_and_key_pieces_share_positions(mirrored_keys):
    """`RingSpec.diagonal` against the chunks the pieces hold, on every ring up to 6, device, step and pair."""
    spec = RingSpec("sp", "mirrored", causal=True, window=None)
    for n in range(1, 7):
        for d in range(n):
            queries = [2 * d, 2 * n - 1 - 2 * d]
            for s in range(n):
                owner = (d - s) % n  # whose keys device d holds at step s
                keys = [2 * owner, 2 * n - 1 - 2 * owner] if mirrored_keys else [2 * owner, 2 * owner + 1]
                for a in range(2):
                    for b in range(2):
                        got = spec.diagonal(s, a, b, n, d, mirrored_keys)
                        assert bool(got) == (queries[a] == keys[b]), (n, d, s, a, b)


def test_block_forward_with_position_offsets():
    """One step's block: queries at 40.., keys at 24.. of a longer sequence (causal + window)."""
    q, k, v = randn((1, 16, 2, 8)), randn((1, 20, 2, 8)), randn((1, 20, 2, 8))
    spec = AttentionSpec(0.3, True, (10, 0), None, 0.0, True, jax.lax.Precision.DEFAULT, jnp.float32, (8, 8), (8, 8))
    out, lse, _ = attention_forward(spec, q, k, v, None, None, None, None, None, None, jnp.int32(40), jnp.int32(24))
    i = 40 + jnp.arange(16)[:, None]
    j = 24 + jnp.arange(20)[None, :]
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * 0.3
    s = jnp.where((j <= i) & (j >= i - 10), s, -jnp.inf)
    expected_lse = jax.nn.logsumexp(s, axis=-1)
    rows = jnp.isfinite(expected_lse)  # rows 16.. see no key of this block
    p = jnp.where(rows[..., None], jnp.exp(s - jnp.where(rows, expected_lse, 0.0)[..., None]), 0.0)
    assert_close(out, jnp.einsum("bhqk,bkhd->bqhd", p, v))
    np.testing.assert_allclose(np.where(rows, lse, 0.0), np.where(rows, expected_lse, 0.0), rtol=1e-5, atol=1e-5)
    assert bool(jnp.all(lse[~rows] == -jnp.inf))


@pytest.mark.parametrize("layout", ["contiguous", "mirrored"])
def test_triton_per_step_kernels_in_interpret_mode(layout):
    """The Triton ring (a GPU implementation) called directly on 2 devices, its kernels interpreted (the traced
    diagonals of longer rings are the driver's, tested on 4 devices with XLA steps).

    Pallas interpret mode cannot yet type-check varying manual axes (`check_vma=True`), so this
    shard_map turns the check off; on a GPU the kernels' output types carry them.
    """
    from ejkernel.kernels._triton.ring_attention._interface import ring_attention_triton

    mesh = jax.make_mesh((2,), ("sp",), axis_types=(AxisType.Auto,), devices=jax.devices()[:2])
    causal = layout == "mirrored"
    q, k, v = randn((1, 64, 2, D)), randn((1, 64, 1, D)), randn((1, 64, 1, D))
    q = q * 3.0
    aux = randn((2,))
    seg = segments()[:1]
    kw = dict(softmax_scale=D**-0.5, causal=causal, logits_soft_cap=2.0 if causal else None)

    def body(seg, q, k, v, aux):
        call = AttentionCall.of(q, q_segment_ids=seg, kv_segment_ids=seg, **kw)
        return ring_attention_triton(q, k, v, aux, None, call, axis_name="sp", layout=layout, interpret=True)

    def fn(q, k, v, aux):
        specs = (SEQ, SEQ, SEQ, SEQ, P())
        return jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=SEQ, check_vma=False)(seg, q, k, v, aux)

    def ref(q, k, v, aux):
        return flash_attention_reference(q, k, v, None, aux, q_segment_ids=seg, kv_segment_ids=seg, **kw)

    check(fn, ref, [q, k, v, aux])


def test_auto_tries_the_mosaic_gpu_steps_first():
    """Hopper's Mosaic GPU ring, then cuDNN's (the same calls, any GPU), Triton's, and XLA's."""
    platforms = [impl.platform.value for impl in ring_module.IMPLEMENTATIONS]
    assert platforms == ["pallas", "cuda", "triton", "xla"]


def test_mosaic_gpu_per_step_kernels_lower_for_cuda():
    """The Mosaic GPU ring on 2 devices, mirrored and causal, lowered for CUDA with its gradient (its kernels
    run on a GPU only: `test_gpu_ring_matches_flash_attention`)."""
    from ejkernel.kernels._common.ring import RingSpec, run_ring
    from ejkernel.kernels._pallas.gpu.ring_attention._interface import MosaicGpuBlock

    mesh = jax.make_mesh((2,), ("sp",), axis_types=(AxisType.Auto,), devices=jax.devices()[:2])
    block = MosaicGpuBlock(softmax_scale=0.1, causal=True, fwd_params=None)
    spec = RingSpec(axis_name="sp", layout="mirrored", causal=True, window=None)

    def loss(q, k, v):
        ring = jax.shard_map(
            lambda q, k, v: run_ring(block, spec, 2, q, k, v), mesh=mesh, in_specs=(SEQ,) * 3, out_specs=SEQ
        )
        return jnp.sum(ring(q, k, v).astype(jnp.float32))

    shapes = [jax.ShapeDtypeStruct((1, 512, 4, 128), jnp.bfloat16)] + [
        jax.ShapeDtypeStruct((1, 512, 2, 128), jnp.bfloat16)
    ] * 2
    module = jax.jit(jax.grad(loss, (0, 1, 2))).trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()
    # Of the 8 pairs of two pieces over two steps, one in each direction is hidden on both devices (not traced), 4
    # are visible on one device only (inside a `lax.cond`), the rest on both: a Mosaic GPU forward and a cuDNN
    # backward for each of the 7 traced.
    assert module.count("@mosaic_gpu") == 7
    assert module.count("@__cudnn$fmhaSoftmaxBackward") == 7
    assert module.count("stablehlo.case") == 8


# (query length, key length, heads, kv heads, head dim, diagonal block): the step's forward merged onto a running
# result of earlier keys. Head dim 128 runs the overlapped forward, 64 the ping-pong one.
ONTO_CASES = {"diagonal-d128-gqa": (128, 128, 2, 1, 128, True), "full-d64": (128, 192, 2, 2, 64, False)}


def interpret_check(case: str) -> None:
    """The Mosaic GPU step's `forward_onto` in interpret mode: merged onto an empty result, then onto that one,
    against attention over both key blocks (the ring's order: an earlier block, then this one)."""
    from ejkernel.kernels._pallas.gpu.ring_attention._interface import MosaicGpuBlock
    from mosaic_gpu_interpret import interpret_mode

    q_len, k_len, heads, kv_heads, dim, diagonal = ONTO_CASES[case]
    q = randn((1, q_len, heads, dim), jnp.bfloat16)
    k, v = (randn((1, 2 * k_len, kv_heads, dim), jnp.bfloat16) for _ in range(2))
    block = MosaicGpuBlock(softmax_scale=dim**-0.5, causal=True, fwd_params=None)
    empty = (jnp.zeros(q.shape, q.dtype), jnp.full((1, heads, q_len), -jnp.inf, jnp.float32))
    halves = [(k[:, :k_len], v[:, :k_len], False), (k[:, k_len:], v[:, k_len:], diagonal)]
    result = empty
    with interpret_mode():
        for k_block, v_block, diag in halves:
            result = block.forward_onto(result, q, k_block, v_block, None, None, 0, 0, diag)
        out = jax.block_until_ready(result[0])
    # the second block's keys on the queries' positions (the diagonal's mask), the first before them
    rows, cols = np.arange(q_len)[:, None], np.arange(2 * k_len)[None, :] - k_len
    allowed = (cols <= rows) if diagonal else np.ones_like(cols + rows, bool)
    bias = jnp.where(jnp.asarray(allowed), 0.0, -jnp.inf)[None, None]
    f32 = lambda x: x.astype(jnp.float32)
    expected = flash_attention_reference(f32(q), f32(k), f32(v), bias, softmax_scale=dim**-0.5)
    assert out.dtype == jnp.bfloat16
    assert_close(out, expected, dtype=jnp.bfloat16)
    full = jax.nn.logsumexp(
        jnp.einsum("bqhd,bkhd->bhqk", f32(q), jnp.repeat(f32(k), heads // kv_heads, 2)) * dim**-0.5 + bias, -1
    )
    assert_close(result[1], full, dtype=jnp.bfloat16, name="lse")


@pytest.mark.long
def test_mosaic_gpu_step_merges_onto_a_running_result_in_interpret_mode():
    """`interpret_check` of every case, in one fresh Python process."""
    from mosaic_gpu_interpret import check_in_fresh_process

    check_in_fresh_process(__file__, list(ONTO_CASES))


# ---- errors ----------------------------------------------------------------------------------------


def _mesh_call(q, k, v, **kw):
    mesh = kw.pop("mesh", ring_mesh())
    specs = kw.pop("in_specs", (SEQ,) * 3)
    return ring_attention(q, k, v, mesh=mesh, in_specs=specs, out_specs=SEQ, **kw)


def _under_mesh_without_sp(q, k, v):
    with jax.set_mesh(jax.make_mesh((8,), ("x",))):
        return ring_attention(q, k, v, axis_name="sp")


ERRORS = [
    ("axis not in mesh", lambda q, k, v: _mesh_call(q, k, v, axis_name="seq"), ValueError, "axis_name='seq'"),
    ("no sp axis", lambda q, k, v: _mesh_call(q, k, v, mesh=jax.make_mesh((8,), ("x",))), ValueError, "axis_name"),
    ("unbound, context mesh without it", lambda q, k, v: _under_mesh_without_sp(q, k, v), ValueError, "not bound"),
    ("length % n", lambda q, k, v: _mesh_call(q[:, :62], k[:, :62], v[:, :62]), ValueError, "divisible by 4"),
    ("length % 2n causal", lambda q, k, v: _mesh_call(q[:, :60], k, v, causal=True), ValueError, "divisible by 8"),
    ("partial mesh", lambda q, k, v: ring_attention(q, k, v, mesh=ring_mesh()), ValueError, "in_specs"),
    ("partial specs", lambda q, k, v: ring_attention(q, k, v, in_specs=(SEQ,) * 3), ValueError, "mesh"),
    ("spec count", lambda q, k, v: _mesh_call(q, k, v, in_specs=(SEQ,) * 2), ValueError, "in_specs"),
    (
        "sequence over another axis",
        lambda q, k, v: _mesh_call(q, k, v, mesh=jax.make_mesh((2, 4), ("dp", "sp")), in_specs=(P(None, "dp"),) * 3),
        ValueError,
        "sequence",
    ),
    (
        "spec for a tensor not passed",
        lambda q, k, v: _mesh_call(q, k, v, in_specs=(SEQ,) * 3 + (P("sp"),)),
        ValueError,
        "not passed",
    ),
    (
        "mask_builder",
        lambda q, k, v: ring_attention(q, k, v, mask_builder=lambda *a: None),
        NotImplementedError,
        "mask_builder",
    ),
    (
        "fused_backward",
        lambda q, k, v: ring_attention(q, k, v, fused_backward=True),
        NotImplementedError,
        "fused_backward",
    ),
    ("chunk_size", lambda q, k, v: _mesh_call(q, k, v, chunk_size=12), ValueError, "chunk_size"),
]


@pytest.mark.lowest
@pytest.mark.parametrize(("case", "call", "error", "words"), ERRORS, ids=[e[0] for e in ERRORS])
def test_errors_name_the_argument(case, call, error, words):
    q, k, v = qkv(2)
    with pytest.raises(error) as info:
        call(q, k, v)
    assert words in str(info.value), str(info.value)[:500]


# ---- GPU suite: every GPU implementation against the XLA ring and one-device flash attention ----------


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("platform", ["auto", "triton", "cuda", "pallas"])
def test_gpu_ring_matches_flash_attention(platform, causal):
    """On every local GPU: bf16 GQA with sinks, forward and gradients, against one-device XLA flash attention."""
    from ejkernel.modules import flash_attention

    n = jax.device_count()
    mesh = jax.make_mesh((n,), ("sp",), axis_types=(AxisType.Auto,))
    length = 1024 * n
    q = randn((2, length, 8, 128), jnp.bfloat16)
    k, v = randn((2, length, 2, 128), jnp.bfloat16), randn((2, length, 2, 128), jnp.bfloat16)
    aux = randn((8,), jnp.bfloat16)

    def ring(*a):
        return ring_attention(
            *a, causal=causal, platform=platform, mesh=mesh, in_specs=(SEQ,) * 3 + (P(),), out_specs=SEQ
        )

    def flash(q, k, v, aux):
        return flash_attention(q, k, v, None, None, None, aux, causal=causal, platform="xla")

    out, vjp = jax.vjp(jax.jit(ring), q, k, v, aux)
    ref_out, ref_vjp = jax.vjp(jax.jit(flash), q, k, v, aux)
    assert_close(out, ref_out, jnp.bfloat16)
    g = randn(out.shape, jnp.bfloat16)
    for name, a, b in zip(["dq", "dk", "dv", "daux"], vjp(g), ref_vjp(g), strict=True):
        assert_close(a, b, jnp.bfloat16, tol=4e-2, name=name)
