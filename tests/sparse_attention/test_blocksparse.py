"""blocksparse_attention: the block table, the XLA implementation and the public function against the reference."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from sparse_cases import block_mask, qkv, sorted_segments

from ejkernel.kernels._common.sparse_attention.block_table import build_block_table
from ejkernel.kernels._common.sparse_attention.masks import SparseMask
from ejkernel.kernels._xla.blocksparse_attention import blocksparse_attention_xla
from ejkernel.modules import BlockSparseAttentionConfig, blocksparse_attention
from ejkernel.ops import FwdParams
from ejkernel.reference.blocksparse_attention import blocksparse_attention_reference
from ejkernel.types import MaskInfo
from harness import assert_close, check_forward_and_grads, randn

TILES = FwdParams(block_q=16, block_k=16)
SMALL = BlockSparseAttentionConfig(platform="xla", fwd_params=TILES)


def _brute_force_blocks(allowed, q_len, kv_len, bq, bk):
    """(any, all) per tile of a dense [..., Sq, Sk] mask, padded rows ignored and padded keys masked."""
    n_q, n_k = -(-q_len // bq), -(-kv_len // bk)
    hit = np.zeros((*allowed.shape[:-2], n_q, n_k), bool)
    full = np.zeros_like(hit)
    for i in range(n_q):
        for j in range(n_k):
            tile = allowed[..., i * bq : (i + 1) * bq, j * bk : (j + 1) * bk]
            hit[..., i, j] = tile.any(axis=(-1, -2))
            full[..., i, j] = tile.all(axis=(-1, -2)) & (tile.shape[-1] == bk)
    return hit, full


def _check_table(table, hit, full):
    """Lists (partial tiles first, then full ones, each ascending) in both directions, and their counts."""
    for blocks, counts, edges, hits, fulls in (
        (table.kv_blocks, table.kv_counts, table.kv_edges, hit, full),
        (table.q_blocks, table.q_counts, table.q_edges, np.swapaxes(hit, -1, -2), np.swapaxes(full, -1, -2)),
    ):
        partial = hits & ~fulls
        assert np.array_equal(np.asarray(counts), hits.sum(-1))
        assert np.array_equal(np.asarray(edges), partial.sum(-1))
        assert blocks.shape[-1] == max(1, hits.sum(-1).max())  # concrete masks: lists as long as the longest
        for index in np.ndindex(*hits.shape[:-1]):
            expected = np.flatnonzero(partial[index]).tolist() + np.flatnonzero(fulls[index] & hits[index]).tolist()
            assert np.asarray(blocks)[index][: len(expected)].tolist() == expected


def test_block_table_lists_exactly_the_nonempty_blocks():
    q_len, kv_len, bq, bk = 45, 70, 16, 8
    i, j = np.arange(q_len)[:, None], np.arange(kv_len)[None, :]
    positional = SparseMask(None, None, None, True, (9, 3), 12)
    rules = (j <= i) & (j >= i - 9) & (i // 12 == j // 12)
    table = build_block_table(positional, q_len=q_len, kv_len=kv_len, block_q=bq, block_k=bk)
    assert isinstance(table.kv_blocks, np.ndarray)  # positional rules alone: a constant table
    _check_table(table, *_brute_force_blocks(rules[None, None], q_len, kv_len, bq, bk))

    dense = np.asarray(block_mask(2, 3, q_len, kv_len, 8, empty_rows=(0, 3), seed=1)) & (np.arange(kv_len) % 5 > 0)
    seg = np.asarray(sorted_segments(2, q_len, pad=6, seed=2))
    kv_seg = np.asarray(sorted_segments(2, kv_len, seed=3))
    mask = SparseMask(jnp.asarray(seg), jnp.asarray(kv_seg), jnp.asarray(dense), False, (30, 30), None)
    allowed = dense & (seg[:, None, :, None] == kv_seg[:, None, None, :]) & (seg[:, None, :, None] >= 0)
    allowed &= (j >= i - 30) & (j <= i + 30)
    table = build_block_table(mask, q_len=q_len, kv_len=kv_len, block_q=bq, block_k=bk)
    _check_table(table, *_brute_force_blocks(allowed, q_len, kv_len, bq, bk))
    assert table.needs_dense_mask  # not constant on the tiles: the kernels must read it


def test_tile_constant_dense_mask_stays_in_the_table():
    mask = SparseMask(None, None, block_mask(1, 2, 40, 40, 8), False, None, None)
    table = build_block_table(mask, q_len=40, kv_len=40, block_q=8, block_k=8)
    assert not table.needs_dense_mask and not table.kv_edges.any()
    assert build_block_table(mask, q_len=40, kv_len=40, block_q=8, block_k=16).needs_dense_mask


def _check_xla(q, k, v, aux=None, bias=None, dtype=jnp.float32, traced_mask=False, **options):
    """The XLA implementation (jitted, 16 x 16 tiles) against the reference, forward and every gradient."""
    args = [q, k, v, aux, bias]
    argnums = tuple(i for i, a in enumerate(args) if a is not None)
    mask = options.pop("attention_mask", None)

    def fn(q, k, v, aux, bias):
        return blocksparse_attention_xla(q, k, v, aux, bias, attention_mask=mask, fwd_params=TILES, **options)

    if traced_mask:  # the mask arrives traced: the table is built inside the program
        fn = lambda q, k, v, aux, bias, fn=fn: jax.jit(
            lambda mask, *a: blocksparse_attention_xla(*a, attention_mask=mask, fwd_params=TILES, **options)
        )(mask, q, k, v, aux, bias)
    ref = functools.partial(blocksparse_attention_reference, attention_mask=mask, **options)
    check_forward_and_grads(jax.jit(fn), jax.jit(ref), args, argnums, dtype)


def test_xla_gqa_causal_soft_cap_sinks_bias():
    q, k, v = qkv(2, 4, 2, 63, 63, 16)
    _check_xla(q, k, v, randn((4,)), randn((1, 4, 63, 63)), logits_soft_cap=3.0)


def test_xla_random_block_mask_with_empty_rows_segments_window_cross_lengths():
    q, k, v = qkv(2, 4, 2, 37, 63, 16, value_dim=32, dtype=jnp.bfloat16)
    mask = block_mask(2, 4, 37, 63, 16, empty_rows=(1,))
    seg_q, seg_k = sorted_segments(2, 37, num_segments=2, pad=4), sorted_segments(2, 63, num_segments=2, seed=1)
    _check_xla(
        q,
        k,
        v,
        randn((3,), jnp.bfloat16),  # shared sinks
        dtype=jnp.bfloat16,
        causal=False,
        attention_mask=mask,
        q_segment_ids=seg_q,
        kv_segment_ids=seg_k,
        sliding_window=(40, 20),
    )


def test_xla_mqa_chunked_window_with_a_traced_mask():
    q, k, v = qkv(1, 3, 1, 50, 50, 8)
    mask = jax.random.bernoulli(jax.random.PRNGKey(5), 0.7, (1, 1, 50, 50))
    _check_xla(q, k, v, attention_mask=mask, chunk_size=20, sliding_window=(7, 0), traced_mask=True)


# ---- the public function ----


def _public_vs_reference(q, k, v, expected_options, **options):
    out = blocksparse_attention(q, k, v, cfg=SMALL, **options)
    assert_close(out, blocksparse_attention_reference(q, k, v, **expected_options))
    return out


S = 40
SEG = sorted_segments(2, S, pad=5, seed=7)
PAD = jnp.arange(S)[None] < jnp.array([[30], [S]])
DENSE = jax.random.bernoulli(jax.random.PRNGKey(8), 0.6, (2, S, S))
BUILDER_MASK = (np.arange(S)[:, None] // 8 + np.arange(S)[None, :] // 8) % 3 != 1
MASK_FORMS = {
    "mask_info segments, chunked (causal)": (
        dict(mask_info=MaskInfo.from_segments(SEG).apply_chunked(12), causal=False),
        dict(q_segment_ids=SEG, kv_segment_ids=SEG, chunk_size=12, causal=True),
    ),
    "mask_info dense and window": (
        dict(mask_info=MaskInfo.from_attention_mask(DENSE).apply_sliding_window(6), causal=False),
        dict(attention_mask=DENSE[:, None], sliding_window=(6, 6), causal=False),
    ),
    "attention_mask padding [B, S] and int window": (
        dict(attention_mask=PAD, sliding_window=5),
        dict(q_segment_ids=jnp.where(PAD, 0, -1), kv_segment_ids=jnp.where(PAD, 0, -1), sliding_window=(5, 5)),
    ),
    "attention_mask [B, Sq, Sk] with mask_info segments": (
        dict(attention_mask=DENSE, mask_info=MaskInfo.from_segments(SEG)),
        dict(attention_mask=DENSE[:, None], q_segment_ids=SEG, kv_segment_ids=SEG),
    ),
    "mask_builder": (
        dict(mask_builder=lambda i, j: (i // 8 + j // 8) % 3 != 1, chunk_size=16),
        dict(attention_mask=BUILDER_MASK[None, None], chunk_size=16),
    ),
}


@pytest.mark.parametrize("form", MASK_FORMS)
def test_every_mask_form_matches_the_reference(form):
    options, expected = MASK_FORMS[form]
    _public_vs_reference(*qkv(2, 4, 2, S, S, 16), expected, **options)


def test_fully_masked_rows_are_zero_forward_and_backward_with_purify():
    q, k, v = qkv(2, 2, 2, S, S, 16)
    sinks = randn((2,))
    seg = jnp.where(jnp.arange(S)[None] < 25, 0, -1).repeat(2, 0)

    def loss(q, k, v, sinks, purify):
        out = blocksparse_attention(q, k, v, sinks, mask_info=MaskInfo.from_segments(seg), purify=purify, cfg=SMALL)
        return jnp.sum(out**2), out

    for purify in (False, True):
        (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True)(q, k, v, sinks, purify)
        assert bool(jnp.all(out[:, :, 25:] == 0))
        assert all(bool(jnp.all(jnp.isfinite(g))) for g in grads)
        assert bool(jnp.all(grads[0][:, :, 25:] == 0)) and bool(jnp.all(grads[1][:, :, 25:] == 0))


def test_jit_vmap_checkpoint():
    q, k, v = qkv(2, 4, 2, S, S, 16)
    fn = functools.partial(blocksparse_attention, sliding_window=(9, 0), cfg=SMALL)
    expected = blocksparse_attention_reference(q, k, v, sliding_window=(9, 0))
    assert_close(jax.jit(jax.vmap(fn))(q[None], k[None], v[None])[0], expected)
    grad = jax.grad(lambda q: jnp.sum(jax.checkpoint(fn)(q, k, v) ** 2))(q)
    ref = jax.grad(lambda q: jnp.sum(blocksparse_attention_reference(q, k, v, sliding_window=(9, 0)) ** 2))(q)
    assert_close(grad, ref, tol=1e-4)


@pytest.mark.lowest
def test_sharded_over_batch_and_heads_equals_unsharded():
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    q, k, v = qkv(2, 8, 4, 24, 24, 16)
    sinks = randn((8,))
    seg = sorted_segments(2, 24, pad=3, seed=9)
    spec = P("data", "model")
    options = dict(mask_info=MaskInfo.from_segments(seg), chunk_size=10, cfg=SMALL)
    out = blocksparse_attention(
        q, k, v, sinks, mesh=mesh, in_specs=(spec, spec, spec, P("model")), out_specs=spec, **options
    )
    assert_close(out, blocksparse_attention(q, k, v, sinks, **options))
    with pytest.raises(ValueError, match="own keys"):
        blocksparse_attention(q, k, v, mesh=mesh, in_specs=(P(), P(None, None, "model"), P()), out_specs=P())


BAD_INPUTS = [
    ("rank", lambda q, k, v: blocksparse_attention(q[0], k, v), "query"),
    ("integer dtype", lambda q, k, v: blocksparse_attention(q.astype(jnp.int32), k, v), "query"),
    ("heads not divisible", lambda q, k, v: blocksparse_attention(q[:, :3], k, v), "multiple"),
    ("bias shape", lambda q, k, v: blocksparse_attention(q, k, v, None, jnp.ones((2, 3, S, S))), "bias"),
    ("negative window", lambda q, k, v: blocksparse_attention(q, k, v, sliding_window=-2), "sliding_window"),
    ("chunk size", lambda q, k, v: blocksparse_attention(q, k, v, chunk_size=0), "chunk_size"),
    ("soft cap", lambda q, k, v: blocksparse_attention(q, k, v, logits_soft_cap=-1.0), "logits_soft_cap"),
    ("mask shape", lambda q, k, v: blocksparse_attention(q, k, v, attention_mask=jnp.ones((2, 3, S, S))), "mask"),
    ("scalar mask", lambda q, k, v: blocksparse_attention(q, k, v, attention_mask=True), "attention_mask"),
    (
        "builder shape",
        lambda q, k, v: blocksparse_attention(q, k, v, mask_builder=lambda i, j: i[:3] < j),
        "mask_builder",
    ),
    (
        "segment shape",
        lambda q, k, v: blocksparse_attention(q, k, v, mask_info=MaskInfo.from_segments(SEG[:, :9])),
        "q_len",
    ),
    (
        "in_specs count",
        lambda q, k, v: blocksparse_attention(
            q, k, v, mesh=jax.make_mesh((8,), ("d",)), in_specs=(P(),), out_specs=P()
        ),
        "in_specs",
    ),
]


@pytest.mark.lowest
@pytest.mark.parametrize(("case", "call", "words"), BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_inputs_name_the_argument(case, call, words):
    q, k, v = qkv(2, 4, 2, S, S, 16)
    with pytest.raises((ValueError, TypeError)) as info:
        call(q, k, v)
    assert words in str(info.value), str(info.value)[:500]


@pytest.mark.parametrize(
    ("option", "words"),
    [({"qkv_layouts": ()}, "qkv_layouts"), ({"sequence_parallelism_mesh_axis_name": "sp"}, "ring_attention")],
)
def test_refused_options_say_which(option, words):
    q, k, v = qkv(1, 2, 2, 8, 8, 16)
    with pytest.raises(NotImplementedError, match=words):
        blocksparse_attention(q, k, v, **option)


def test_fused_backward_is_served_by_the_xla_backward():
    q, k, v = qkv(1, 2, 2, 20, 20, 16)
    grad = jax.grad(lambda q: jnp.sum(blocksparse_attention(q, k, v, fused_backward=True, cfg=SMALL) ** 2))(q)
    assert_close(grad, jax.grad(lambda q: jnp.sum(blocksparse_attention_reference(q, k, v) ** 2))(q), tol=1e-4)
