"""Mosaic GPU block-sparse attention (flash attention's kernels walking the block table).

On this CPU host: forward and gradient kernels lower to Mosaic GPU for CUDA at several configurations;
they run in Mosaic GPU interpret mode (`mosaic_gpu_interpret`) against the reference, races detected;
the packed table lists say what the block table says; the kernels decline what they do not serve.
GPU suite: forward and every gradient against the XLA path on a Hopper GPU.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export
from sparse_cases import block_mask, qkv, sorted_segments

from ejkernel import kernel_registry
from ejkernel.kernels._common.sparse_attention.block_table import build_block_table
from ejkernel.kernels._common.sparse_attention.masks import SparseMask
from ejkernel.kernels._pallas.gpu.blocksparse_attention._interface import (
    blocksparse_attention_mosaic_gpu,
    mosaic_blocksparse,
)
from ejkernel.kernels._pallas.gpu.blocksparse_attention._walks import column_lists, launch_order, row_lists
from ejkernel.kernels._xla.blocksparse_attention import blocksparse_attention_xla
from ejkernel.modules import blocksparse_attention
from ejkernel.ops import BwdParams, FwdParams
from ejkernel.reference.blocksparse_attention import blocksparse_attention_reference
from harness import GRAD_TOLERANCE, assert_close, check_forward_and_grads, randn
from mosaic_gpu_interpret import check_in_fresh_process, interpret_mode


def random_blocks(q_len: int, kv_len: int, density: float, empty_rows=(1,), seed: int = 0, block: int = 128):
    """A mask builder of a random pattern of `block`-sized tiles (positions alone: a constant block table),
    with the query blocks `empty_rows` attending nothing."""
    tiles = np.random.default_rng(seed).random((-(-q_len // block), -(-kv_len // block))) < density
    tiles[list(empty_rows)] = False
    return lambda i, j: tiles[np.asarray(i) // block, np.asarray(j) // block]


# ---- lowering for CUDA ----

# (query shape, key/value shape [B, H, S, D], options, sinks, fwd params, bwd params, kernels:
#  3 = forward, dQ, dK/dV; 2 = forward and the fused backward)
CASES = {
    # head dim 128: the overlapped forward, two backward kernels; a query block with nothing to attend
    "random-blocks-empty-rows-d128": (
        (1, 2, 512, 128),
        (1, 1, 512, 128),
        {"mask_builder": random_blocks(512, 512, 0.4), "causal": False},
        False,
        None,
        None,
        3,
    ),
    # head dim 64: the fused backward (dQ added by TMA reductions); partial diagonal blocks, padded keys;
    # two query tiles per forward CTA
    "causal-window-gqa-sinks-d64-padded-paired": (
        (2, 4, 500, 64),
        (2, 2, 300, 64),
        {"causal": True, "sliding_window": (150, 0)},
        True,
        FwdParams(block_m=256),
        None,
        2,
    ),
    # 256-row table tiles over 64-row forward steps and 128-row backward steps, soft cap, chunks,
    # per-head tables (a dense mask constant on the tiles), three stages
    "soft-cap-chunks-per-head-table-256-tiles": (
        (1, 2, 512, 128),
        (1, 2, 640, 128),
        {
            "attention_mask": block_mask(1, 2, 512, 640, 256, density=0.6, empty_rows=(0,)),
            "causal": False,
            "chunk_size": 300,
            "logits_soft_cap": 20.0,
        },
        False,
        FwdParams(block_q=256, block_k=256, block_n=64, num_stages=3),
        BwdParams(block_k=128, block_q=128),
        3,
    ),
}


def _lower(q_shape, kv_shape, options, sinks, fwd, bwd):
    def loss(q, k, v, aux):
        out = mosaic_blocksparse(q, k, v, aux, softmax_scale=0.1, fwd_params=fwd, bwd_params=bwd, **options)
        return jnp.sum(out.astype(jnp.float32))

    argnums = (0, 1, 2, 3) if sinks else (0, 1, 2)
    shapes = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in (q_shape, kv_shape, kv_shape)]
    aux = jax.ShapeDtypeStruct((q_shape[1],), jnp.float32) if sinks else None
    return export.export(jax.jit(jax.value_and_grad(loss, argnums)), platforms=["cuda"])(*shapes, aux).mlir_module()


@pytest.mark.parametrize("case", CASES)
def test_forward_and_gradients_lower_for_cuda(case):
    *call, kernels = CASES[case]
    assert _lower(*call).count("@mosaic_gpu") == kernels


def test_segment_ids_known_only_at_run_time_lower_for_cuda():
    """Traced segment ids: the table is built inside the program (lists as long as the number of blocks)."""

    def loss(q, k, v, q_seg, kv_seg):
        out = mosaic_blocksparse(q, k, v, q_segment_ids=q_seg, kv_segment_ids=kv_seg, causal=True)
        return jnp.sum(out.astype(jnp.float32))

    shapes = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in ((2, 4, 300, 64), (2, 2, 300, 64), (2, 2, 300, 64))]
    segments = [jax.ShapeDtypeStruct((2, 300), jnp.int32)] * 2
    module = export.export(jax.jit(jax.grad(loss, (0, 1, 2))), platforms=["cuda"])(*shapes, *segments).mlir_module()
    assert module.count("@mosaic_gpu") == 2


# ---- interpret mode: the schedule, the barrier protocol and the numbers, run on this CPU ----

# Few CTAs of few steps (interpret mode simulates every warpgroup, barrier and copy): a query block that
# attends nothing, partial and full blocks, per-head tables of grouped heads, sinks, segment ids with
# padded queries (rows that attend nothing). Head dim 64 runs the fused backward (its dQ reductions
# included), head dim 128 the overlapped forward and the two backward kernels.
INTERPRET_CASES = {
    "gqa-per-head-table-empty-rows-sinks-d64-fused": (
        (1, 2, 1, 256, 256, 64),
        {"attention_mask": block_mask(1, 2, 256, 256, 128, density=0.6, empty_rows=(0,), seed=2), "causal": False},
        True,
    ),
    "causal-window-segments-padded-keys-d128": (
        (1, 1, 1, 256, 200, 128),
        {
            "causal": True,
            "sliding_window": (90, 0),
            "q_segment_ids": sorted_segments(1, 256, 3, pad=20, seed=4),
            "kv_segment_ids": sorted_segments(1, 200, 3, seed=5),
        },
        False,
    ),
}


def interpret_check(case: str) -> None:
    """Forward and every gradient of `INTERPRET_CASES[case]` in interpret mode against the reference
    (raises AssertionError); a race shows as "RACE DETECTED" on stdout."""
    (batch, heads, kv_heads, q_len, kv_len, dim), options, sinks = INTERPRET_CASES[case]
    q, k, v = qkv(batch, heads, kv_heads, q_len, kv_len, dim, dtype=jnp.bfloat16)
    args = [q, k, v] + ([randn((heads,))] if sinks else [])
    cotangent = randn((batch, heads, q_len, dim), jnp.bfloat16)
    ref = functools.partial(blocksparse_attention_reference, softmax_scale=0.125, **options)
    ref_out, ref_vjp = jax.vjp(ref, *[x.astype(jnp.float32) for x in args])
    expected = jax.block_until_ready((ref_out, ref_vjp(cotangent.astype(jnp.float32))))
    with interpret_mode():  # (the kernels alone: nothing else is dispatched beside them)
        out, vjp = jax.vjp(functools.partial(mosaic_blocksparse, softmax_scale=0.125, **options), *args)
        out, grads = jax.block_until_ready((out, vjp(cotangent)))
    assert_close(out, expected[0], jnp.bfloat16)
    for i, (g, r) in enumerate(zip(grads, expected[1], strict=True)):
        assert_close(g, r, jnp.bfloat16, GRAD_TOLERANCE[jnp.dtype(jnp.bfloat16)], name=f"grad of argument {i}")


@pytest.mark.long
def test_interpret_mode_matches_reference():
    """`interpret_check` of every case, in one fresh Python process (started again if the interpreter hangs)."""
    check_in_fresh_process(__file__, INTERPRET_CASES)


# ---- the packed lists ----


@pytest.mark.parametrize("per_head", [False, True])
def test_packed_lists_say_what_the_table_says(per_head):
    """Forward rows `[count, edges, blocks...]` and dK/dV columns (a key/value head's query heads one after
    another, entries `head * nQ + block`) against the block table, for a table that is concrete (numpy
    lists) and one built while tracing (jax lists, as long as the number of blocks)."""
    batch, heads, kv_heads, q_len, kv_len, block = 2, 4, 2, 700, 500, 128
    dense = block_mask(batch, heads if per_head else 1, q_len, kv_len, 64, density=0.5, empty_rows=(2,), seed=3)
    mask = SparseMask(None, None, dense, True, (300, 40), None)
    table = build_block_table(mask, q_len=q_len, kv_len=kv_len, block_q=block, block_k=block)
    traced = jax.jit(lambda d: row_lists(build_block_table(mask._replace(attention_mask=d), **t)), static_argnums=())
    t = dict(q_len=q_len, kv_len=kv_len, block_q=block, block_k=block)
    group = heads // kv_heads
    rows, cols = np.asarray(row_lists(table)), np.asarray(column_lists(table, group))
    blocks, counts, edges = (np.asarray(x) for x in (table.kv_blocks, table.kv_counts, table.kv_edges))
    assert np.array_equal(rows[..., 0], counts) and np.array_equal(rows[..., 1], edges)
    for index in np.ndindex(*counts.shape):
        assert rows[index][2 : 2 + counts[index]].tolist() == blocks[index][: counts[index]].tolist()
    q_blocks, q_counts, q_edges = (np.asarray(x) for x in (table.q_blocks, table.q_counts, table.q_edges))
    n_q = table.num_q_blocks
    for b, kv_h, kb in np.ndindex(*cols.shape[:3]):
        col = cols[b, kv_h, kb]
        first, col_edges, entries = col[: group + 1], col[group + 1 : 2 * group + 1], col[2 * group + 1 :]
        for g in range(group):
            h = kv_h * group + g if per_head else 0
            listed = entries[first[g] : first[g + 1]]
            assert (listed // n_q == g).all()
            assert (listed % n_q).tolist() == q_blocks[b, h, kb, : q_counts[b, h, kb]].tolist()
            assert col_edges[g] == q_edges[b, h, kb]
    assert np.array_equal(np.asarray(traced(dense))[..., :2], rows[..., :2])
    # CTAs launch longest first: a permutation of the 128-row tiles (two per table tile here), most steps first
    order = launch_order(counts, 2)
    steps = np.repeat(counts, 2, axis=-1)
    assert np.array_equal(np.sort(order, axis=-1), np.broadcast_to(np.arange(steps.shape[-1]), steps.shape))
    assert (np.diff(np.take_along_axis(steps, order, axis=-1), axis=-1) <= 0).all()
    assert np.array_equal(np.asarray(jax.jit(lambda c: launch_order(c, 2))(counts)), order)


# ---- what it declines ----

Q, K = jnp.ones((1, 2, 256, 128), jnp.bfloat16), jnp.ones((1, 1, 256, 128), jnp.bfloat16)
DECLINES = [
    ("bias", lambda: mosaic_blocksparse(Q, K, K, None, jnp.ones((1, 2, 256, 256), jnp.bfloat16)), "bias"),
    (
        "float32",
        lambda: mosaic_blocksparse(Q.astype(jnp.float32), K.astype(jnp.float32), K.astype(jnp.float32)),
        "float32",
    ),
    ("head dim 96", lambda: mosaic_blocksparse(Q[..., :96], K[..., :96], K[..., :96]), "head dims"),
    ("value dim", lambda: mosaic_blocksparse(Q, K, K[..., :64]), "head dims"),
    (
        "64-row table tiles",
        lambda: mosaic_blocksparse(Q, K, K, fwd_params=FwdParams(block_q=64, block_k=64)),
        "block tables",
    ),
    (
        "a mask that varies within tiles",
        lambda: mosaic_blocksparse(Q, K, K, attention_mask=block_mask(1, 1, 256, 256, 32), causal=False),
        "constant on its",
    ),
    (
        "a mask known only at run time",
        lambda: jax.jit(lambda m: mosaic_blocksparse(Q, K, K, attention_mask=m, causal=False))(
            block_mask(1, 1, 256, 256, 128)
        ),
        "run time",
    ),
    (
        "a forward step wider than the table's",
        lambda: mosaic_blocksparse(Q[..., :64], K[..., :64], K[..., :64], fwd_params=FwdParams(block_n=256)),
        "exceeds",
    ),
    (
        "fused backward of 128-row query steps",
        lambda: mosaic_blocksparse(Q, K, K, fused_backward=True, bwd_params=BwdParams(block_q=128)),
        "fused",
    ),
    ("one stage", lambda: mosaic_blocksparse(Q, K, K, fwd_params=FwdParams(num_stages=1)), "num_stages"),
    (
        "two query tiles, 3 stages",
        lambda: mosaic_blocksparse(Q, K, K, fwd_params=FwdParams(block_m=256, num_stages=3)),
        "ring",
    ),
    (
        "two query tiles of an odd number",
        lambda: mosaic_blocksparse(Q[:, :, :128], K, K, fwd_params=FwdParams(block_m=256)),
        "even",
    ),
    ("no Hopper GPU here", lambda: blocksparse_attention_mosaic_gpu(Q, K, K), "Hopper"),
    ("bias before the device", lambda: blocksparse_attention_mosaic_gpu(Q, K, K, None, Q[:, :, :, :1]), "bias"),
]


@pytest.mark.parametrize(("case", "call", "words"), DECLINES, ids=[d[0] for d in DECLINES])
def test_declines_what_it_does_not_serve(case, call, words):
    with pytest.raises(NotImplementedError, match=words):
        call()


def test_registered_above_triton():
    ranked = [
        (i.platform.value, i.priority) for i in kernel_registry.candidates("blocksparse_attention", backend="gpu")
    ]
    assert [p for p, _ in ranked][:3] == ["pallas", "triton", "xla"], ranked


# ---- GPU suite: against the XLA path on a Hopper GPU ----

GPU_CASES = {
    "random-blocks-empty-rows-d128": (
        (2, 8, 2, 2048, 2048, 128),
        {"mask_builder": random_blocks(2048, 2048, 0.25, empty_rows=(3, 9)), "causal": False},
        False,
        None,
    ),
    "causal-window-sinks-padded-d64": (
        (2, 8, 4, 1900, 1900, 64),
        {"causal": True, "sliding_window": (700, 0)},
        True,
        None,
    ),
    "segments-with-padding-causal-d128": (
        (2, 8, 8, 2048, 2048, 128),
        {
            "causal": True,
            "q_segment_ids": sorted_segments(2, 2048, 5, pad=200, seed=6),
            "kv_segment_ids": sorted_segments(2, 2048, 5, pad=200, seed=6),
        },
        False,
        None,
    ),
    "soft-cap-chunks-256-tiles-cross-lengths": (
        (1, 4, 4, 1000, 1500, 128),
        {"causal": False, "chunk_size": 600, "logits_soft_cap": 20.0},
        False,
        {"fwd_params": FwdParams(block_q=256, block_k=256), "bwd_params": BwdParams(num_stages=3)},
    ),
    "fused-backward-d128-small-steps": (
        (1, 8, 2, 2048, 2048, 128),
        {
            "mask_builder": random_blocks(2048, 2048, 0.3, empty_rows=(0,), seed=5),
            "causal": False,
            "fused_backward": True,
        },
        True,
        {"fwd_params": FwdParams(block_n=64, num_stages=3)},
    ),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES)
def test_gpu_matches_xla(case):
    (batch, heads, kv_heads, q_len, kv_len, dim), options, sinks, params = GPU_CASES[case]
    q, k, v = qkv(batch, heads, kv_heads, q_len, kv_len, dim, dtype=jnp.bfloat16)
    args = [q, k, v] + ([randn((heads,))] if sinks else [])
    params = params or {}
    mosaic = functools.partial(blocksparse_attention_mosaic_gpu, **params, **options)
    xla_options = {name: x for name, x in options.items() if name != "fused_backward"}
    xla = functools.partial(blocksparse_attention_xla, **xla_options)
    check_forward_and_grads(jax.jit(mosaic), jax.jit(xla), args, tuple(range(len(args))), jnp.bfloat16)


@pytest.mark.gpu
def test_gpu_public_op_empty_rows_and_auto():
    """`platform="pallas"` runs these kernels; rows with nothing to attend are exact zeros with zero, finite
    gradients; `auto` takes these kernels (ranked above Triton)."""
    q, k, v = qkv(1, 4, 4, 1024, 1024, 128, dtype=jnp.bfloat16)
    builder = random_blocks(1024, 1024, 0.5, empty_rows=(2, 5))

    def loss(q, k, v):
        out = blocksparse_attention(q, k, v, mask_builder=builder, causal=False, platform="pallas")
        return jnp.sum(out.astype(jnp.float32) ** 2), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, (0, 1, 2), has_aux=True))(q, k, v)
    rows = np.r_[256:384, 640:768]
    assert bool(jnp.all(out[:, :, rows] == 0)) and bool(jnp.all(grads[0][:, :, rows] == 0))
    assert all(bool(jnp.all(jnp.isfinite(g.astype(jnp.float32)))) for g in grads)
    expected = blocksparse_attention_xla(q, k, v, mask_builder=builder, causal=False)
    assert_close(out, expected, jnp.bfloat16)
    assert kernel_registry.get("blocksparse_attention").__name__ == "blocksparse_attention_mosaic_gpu"
