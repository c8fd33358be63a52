"""MaskInfo: each constructor and transform against a pair-by-pair numpy oracle, the canonical form
kernels receive, pytree behaviour under jit / vmap / shard_map, and clear errors on bad input."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from ejkernel.types import CanonicalMask, MaskInfo
from harness import fresh_key


def oracle(q_seg=None, kv_seg=None, dense=None, *, causal=False, window=None, chunk=None, kv_lens=None, types=None):
    """The expected mask [B, 1|H, Sq, Sk], decided one (query, key) pair at a time."""
    if dense is not None:
        dense = np.asarray(dense, bool)
        batch, heads, q_len, kv_len = dense.shape
    else:
        q_seg, kv_seg = np.asarray(q_seg), np.asarray(kv_seg)
        (batch, q_len), kv_len, heads = q_seg.shape, kv_seg.shape[1], 1
    out = np.zeros((batch, heads, q_len, kv_len), bool)
    for b, h, i, j in itertools.product(range(batch), range(heads), range(q_len), range(kv_len)):
        hard = dense[b, h, i, j] if dense is not None else q_seg[b, i] >= 0 and q_seg[b, i] == kv_seg[b, j]
        if kv_lens is not None:
            hard = hard and j < kv_lens[b]
        soft = (
            (not causal or j <= i)
            and (window is None or i - window[0] <= j <= i + window[1])
            and (chunk is None or i // chunk == j // chunk)
        )
        if types is not None and types[b, i] != 0 and types[b, i] == types[b, j]:
            soft = True
        out[b, h, i, j] = hard and soft
    return out


def random_ints(shape, low, high):
    """Integers in [low, high) from a fresh key. Every draw is one `jax.random.bits` of a fixed size,
    so tests pay for a single random-number compilation."""
    size = int(np.prod(shape))
    bits = np.asarray(jax.random.bits(fresh_key(), (4096,)))[:size].astype(np.int64)
    return (low + bits % (high - low)).reshape(shape)


def random_bool(shape, p=0.6):
    return random_ints(shape, 0, 1000) < p * 1000


def random_segments(batch, length, num_segments=3):
    """Contiguous segments 0..num_segments-1 followed by a padding tail (-1); at least one valid token."""
    ids = np.sort(random_ints((batch, length), 0, num_segments), axis=-1)
    valid = random_ints((batch, 1), 1, length + 1)
    return np.where(np.arange(length) < valid, ids, -1).astype(np.int32)


def combine(c: CanonicalMask, q_len, kv_len):
    """Rebuild the mask from a kernel's canonical view: the AND of every field that is set."""
    out = np.ones((1, 1, q_len, kv_len), bool)
    if c.q_segment_ids is not None:
        q, kv = np.asarray(c.q_segment_ids)[:, None, :, None], np.asarray(c.kv_segment_ids)[:, None, None, :]
        out = out & (q == kv) & (q >= 0)
    if c.attention_mask is not None:
        out = out & np.asarray(c.attention_mask)
    i, j = np.arange(q_len)[:, None], np.arange(kv_len)[None, :]
    if c.causal:
        out = out & (j <= i)
    if c.sliding_window is not None:
        out = out & (j >= i - c.sliding_window[0]) & (j <= i + c.sliding_window[1])
    return out


def mask_of(mi):
    return np.asarray(mi.get_or_compute_attention_mask())


# ---------------------------------------------------------------------------------- constructors


def test_from_segments_self_attention():
    seg = random_segments(3, 9)
    mi = MaskInfo.from_segments(jnp.asarray(seg))
    assert mi.has_segments and not mi.has_dense_mask and not mi.causal and mi.sliding_window is None
    np.testing.assert_array_equal(mask_of(mi), oracle(seg, seg))
    q, kv = mi.get_or_compute_segment_ids()
    assert q.dtype == kv.dtype == jnp.int32
    np.testing.assert_array_equal(q, seg)
    np.testing.assert_array_equal(kv, seg)
    np.testing.assert_array_equal(mi.q_lengths(), (seg >= 0).sum(1))
    np.testing.assert_array_equal(mi.kv_lengths(), (seg >= 0).sum(1))


def test_from_segments_cross_attention_and_dtype():
    q_seg, kv_seg = random_segments(2, 7), random_segments(2, 11)
    mi = MaskInfo.from_segments(q_seg, kv_seg)  # numpy input is accepted
    expected = oracle(q_seg, kv_seg)
    np.testing.assert_array_equal(mask_of(mi), expected)
    as_float = mi.get_or_compute_attention_mask(jnp.float32)
    assert as_float.dtype == jnp.float32
    np.testing.assert_array_equal(as_float, expected.astype(np.float32))
    np.testing.assert_array_equal(mi.kv_lengths(), (kv_seg >= 0).sum(1))


@pytest.mark.parametrize("shape", [(2, 7, 9), (2, 1, 7, 9), (2, 3, 7, 9)])
@pytest.mark.parametrize("dtype", [np.bool_, np.int32, np.float32])
def test_from_attention_mask_dense(shape, dtype):
    mask = random_bool(shape)
    mask[0, ..., 2, :] = False  # an empty query row (in every head)
    mask[1, ..., :, 4] = False  # an empty key column
    mi = MaskInfo.from_attention_mask(mask.astype(dtype))
    full = mask if mask.ndim == 4 else mask[:, None]
    np.testing.assert_array_equal(mask_of(mi), oracle(dense=full))
    # Stored ids are padding-style and only describe the mask: a query is real if it attends anywhere
    # (in any head), a key if anyone attends to it. Kernels get the dense mask alone.
    assert mi.has_dense_mask and mi.has_segments
    q, kv = mi.get_or_compute_segment_ids()
    np.testing.assert_array_equal(q, np.where(full.any(axis=(1, 3)), 0, -1))
    np.testing.assert_array_equal(kv, np.where(full.any(axis=(1, 2)), 0, -1))
    assert int(q[0, 2]) == -1 and int(kv[1, 4]) == -1
    c = mi.canonical(num_heads=3)
    assert c.q_segment_ids is None and c.kv_segment_ids is None
    np.testing.assert_array_equal(c.attention_mask, full)
    np.testing.assert_array_equal(mi.q_lengths(), full.any(axis=(1, 3)).sum(1))


@pytest.mark.parametrize("per_head", [False, True])
def test_segment_ids_inferred_from_a_dense_mask(per_head):
    """A dense mask held without ids (`MaskInfo(_attention_mask=...)`): ids inferred by grouping equal
    rows (columns), -1 for a query (key) that attends nothing; `materialize_segment_ids` stores them."""
    full = random_bool((2, 3, 7, 9))
    full[0, :, 2, :] = False
    mi = MaskInfo(_attention_mask=jnp.asarray(full))
    assert not mi.has_segments
    stored = mi.materialize_segment_ids(per_head=per_head)
    assert stored.has_segments and stored.materialize_segment_ids() is stored
    q, kv = stored.get_or_compute_segment_ids()
    assert q.dtype == kv.dtype == jnp.int32
    if not per_head:
        np.testing.assert_array_equal(q, mi.q_segment_ids)
    assert q.shape == ((2, 3, 7) if per_head else (2, 7))
    merged = full if per_head else full.any(axis=1, keepdims=True)
    q, kv = np.asarray(q).reshape(merged.shape[:-1]), np.asarray(kv).reshape(*merged.shape[:2], 9)
    np.testing.assert_array_equal(q >= 0, merged.any(axis=3))
    np.testing.assert_array_equal(kv >= 0, merged.any(axis=2))
    # Two real queries share an id exactly when their rows are equal.
    real = merged.any(axis=3)
    same_rows = (merged[..., :, None, :] == merged[..., None, :, :]).all(-1)
    both = real[..., :, None] & real[..., None, :]
    np.testing.assert_array_equal((q[..., :, None] == q[..., None, :])[both], same_rows[both])
    # The ids describe the mask; they never change it (grouped ids are not comparable across q and kv).
    np.testing.assert_array_equal(mask_of(stored), full)
    np.testing.assert_array_equal(mask_of(stored.apply_causal()), mask_of(mi.apply_causal()))
    assert stored.canonical(3).q_segment_ids is None


def test_from_attention_mask_padding_2d():
    valid = random_bool((2, 8), p=0.7)
    mi = MaskInfo.from_attention_mask(jnp.asarray(valid))
    assert mi.has_segments
    seg = np.where(valid, 0, -1)
    np.testing.assert_array_equal(mask_of(mi), oracle(seg, seg))
    np.testing.assert_array_equal(mi.q_lengths(), valid.sum(1))


def test_from_cu_seqlens():
    q_lens = random_ints((3,), 0, 8)
    kv_lens = random_ints((3,), 1, 11)
    cu_q, cu_k = (jnp.asarray(np.concatenate([[0], np.cumsum(n)])) for n in (q_lens, kv_lens))
    mi = MaskInfo.from_cu_seqlens(cu_q, cu_k, q_len=8, kv_len=11)
    q_seg = np.where(np.arange(8) < q_lens[:, None], 0, -1)
    kv_seg = np.where(np.arange(11) < kv_lens[:, None], 0, -1)
    np.testing.assert_array_equal(mask_of(mi.apply_causal()), oracle(q_seg, kv_seg, causal=True))
    np.testing.assert_array_equal(mi.q_lengths(), q_lens)
    np.testing.assert_array_equal(mi.kv_lengths(), kv_lens)
    same = MaskInfo.from_cu_seqlens(cu_q, q_len=8)  # keys default to the queries
    np.testing.assert_array_equal(mask_of(same), oracle(q_seg, q_seg))
    longer_keys = MaskInfo.from_cu_seqlens(cu_q, q_len=8, kv_len=10)
    padded = np.pad(q_seg, ((0, 0), (0, 2)), constant_values=-1)
    np.testing.assert_array_equal(mask_of(longer_keys), oracle(q_seg, padded))


def test_from_random():
    shape = (2, 3, 6, 9)  # one shape throughout: a single random-number compilation
    mi = MaskInfo.from_random(2, 6, 9, num_heads=3, sparsity=0.7, key=fresh_key())
    mask = mask_of(mi)
    assert mask.shape == shape and mask.any(axis=-1).all()
    assert 0.15 < mask.mean() < 0.55
    other = mask_of(MaskInfo.from_random(2, 6, 9, num_heads=3, sparsity=0.7, key=fresh_key()))
    assert (mask != other).any()
    single = mask_of(MaskInfo.from_random(2, 6, 9, num_heads=3, sparsity=1.0, key=fresh_key()))
    assert (single.sum(-1) == 1).all()
    assert mask_of(MaskInfo.from_random(2, 6, 9, num_heads=3, sparsity=0.0, key=fresh_key())).all()
    # Upstream's form: a seed, the same mask for the same seed.
    seeded = MaskInfo.from_random(batch_size=2, q_len=6, kv_len=9, sparsity=0.7, seed=3)
    assert mask_of(seeded).shape == (2, 1, 6, 9)
    np.testing.assert_array_equal(mask_of(seeded), mask_of(MaskInfo.from_random(2, 6, 9, 0.7, 3)))


# ------------------------------------------------------------------------------------ transforms

CASES = {
    "causal": [("causal",)],
    "window-pair": [("window", (3, 1))],
    "windows-intersect": [("window", 4), ("window", (2, 5))],
    "chunked": [("chunk", 4)],
    "kv-lengths-twice": [("kv_lengths",), ("kv_lengths",)],
    "token-types": [("types",)],
    "causal-chunked": [("causal",), ("chunk", 3)],
    "causal-types": [("causal",), ("types",)],
    "everything": [("causal",), ("window", (2, 0)), ("chunk", 3), ("kv_lengths",), ("types",)],
}


def build_source(source):
    """(MaskInfo, oracle keyword arguments) of a fresh random source."""
    if source == "segments":
        seg = random_segments(2, 10)
        return MaskInfo.from_segments(seg), {"q_seg": seg, "kv_seg": seg}
    if source == "cross":
        q_seg, kv_seg = random_segments(2, 6), random_segments(2, 10)
        return MaskInfo.from_segments(q_seg, kv_seg), {"q_seg": q_seg, "kv_seg": kv_seg}
    dense = random_bool((2, 2, 10, 10))
    return MaskInfo.from_attention_mask(dense), {"dense": dense}


def apply_case(mi, expected, steps, batch, kv_len):
    for name, *arg in steps:
        if name == "causal":
            mi, expected["causal"] = mi.apply_causal(), True
        elif name == "window":
            mi = mi.apply_sliding_window(arg[0])
            left, right = (arg[0], arg[0]) if isinstance(arg[0], int) else arg[0]
            old = expected.get("window") or (left, right)
            expected["window"] = (min(left, old[0]), min(right, old[1]))
        elif name == "chunk":  # chunked attention is causal within each chunk
            mi, expected["chunk"], expected["causal"] = mi.apply_chunked(arg[0]), arg[0], True
        elif name == "kv_lengths":
            lengths = random_ints((batch,), 0, kv_len + 1)
            mi = mi.apply_kv_lengths(lengths)
            old = expected.get("kv_lens")
            expected["kv_lens"] = lengths if old is None else np.minimum(old, lengths)
        elif name == "types":
            types = random_ints((batch, kv_len), 0, 3)
            mi, expected["types"] = mi.apply_token_type_ids(types), types
    return mi, expected


@pytest.mark.parametrize(
    ("source", "case"),
    [
        (source, case)
        for case, steps in CASES.items()
        for source in ("segments", "cross", "dense")
        if source != "cross" or all(s[0] != "types" for s in steps)  # token types need Sq == Sk
    ],
)
def test_transforms(source, case):
    steps = CASES[case]
    mi, expected = build_source(source)
    q_len, kv_len = (6, 10) if source == "cross" else (10, 10)
    mi, expected = apply_case(mi, expected, steps, 2, kv_len)
    want = oracle(**expected)
    np.testing.assert_array_equal(mask_of(mi), want)
    # The canonical view says the same mask, and carries a dense one only when it must.
    c = mi.canonical(num_heads=2)
    np.testing.assert_array_equal(np.broadcast_to(combine(c, q_len, kv_len), want.shape), want)
    needs_dense = source == "dense" or any(s[0] in ("chunk", "types") for s in steps)
    assert (c.attention_mask is not None) == needs_dense
    assert (c.q_segment_ids is not None) == (source != "dense")


def test_transforms_return_new_objects_and_record_static_fields():
    mi = MaskInfo.from_segments(random_segments(2, 6))
    out = mi.apply_causal().apply_sliding_window(3).apply_chunked(2)
    assert not mi.causal and mi.sliding_window is None and mi.chunk_size is None
    assert out.causal and out.sliding_window == (3, 3) and out.chunk_size == 2
    assert out.apply_chunked(2).chunk_size == 2
    leaves, treedef = jax.tree_util.tree_flatten(out)
    assert len(leaves) == 2  # only arrays are leaves; the flags live in the tree definition
    assert jax.tree_util.tree_unflatten(treedef, leaves).sliding_window == (3, 3)


def test_canonical_fields():
    seg = random_segments(2, 8)
    lengths = np.array([3, 8])
    c = MaskInfo.from_segments(seg).apply_causal().apply_sliding_window((4, 0)).apply_kv_lengths(lengths)
    c = c.canonical(num_heads=4)
    assert c.attention_mask is None and c.causal and c.sliding_window == (4, 0)
    np.testing.assert_array_equal(c.q_segment_ids, seg)
    np.testing.assert_array_equal(c.kv_segment_ids, np.where(np.arange(8) < lengths[:, None], seg, -1))
    chunked = MaskInfo.from_segments(seg).apply_causal().apply_chunked(4).canonical(4)
    assert chunked.attention_mask.shape == (2, 1, 8, 8) and chunked.causal
    typed = MaskInfo.from_segments(seg).apply_causal().apply_sliding_window(2)
    typed = typed.apply_token_type_ids(np.ones((2, 8), np.int32)).canonical(4)
    assert not typed.causal and typed.sliding_window is None and typed.attention_mask is not None
    dense = MaskInfo.from_attention_mask(random_bool((2, 4, 8, 8))).apply_causal().canonical(4)
    assert dense.q_segment_ids is None and dense.kv_segment_ids is None and dense.causal
    assert dense.attention_mask.shape == (2, 4, 8, 8) and dense.attention_mask.dtype == jnp.bool_


# ------------------------------------------------------------- EasyDeL's forms (API.md 4.3.4)


def causal_padded(valid):
    """[B, 1, S, S]: real tokens [B, S] attend real tokens at or before them."""
    size = valid.shape[1]
    return valid[:, None, :, None] & valid[:, None, None, :] & np.tril(np.ones((size, size), bool))


def bias_of(mask, dtype):
    return np.where(mask, 0.0, float(jnp.finfo(dtype).min))


def test_constructor_keywords():
    dense = random_bool((2, 2, 5, 6))
    # As operations/kernels/vanilla_attention.py:197 and modules/gemma4/modeling_gemma4.py:793 build one.
    np.testing.assert_array_equal(MaskInfo(_attention_mask=jnp.asarray(dense)).attention_mask, dense)
    as_int = MaskInfo(_attention_mask=jnp.asarray(dense, jnp.int32) * 3)  # nonzero = attend
    np.testing.assert_array_equal(mask_of(as_int.apply_causal()), dense & np.tril(np.ones((5, 6), bool)))
    seg = random_segments(2, 5)
    cu, pos = jnp.array([0, 3, 5]), np.tile(np.arange(5, dtype=np.int32), (2, 1))
    mi = MaskInfo(
        _q_segment_ids=jnp.asarray(seg),
        _kv_segment_ids=jnp.asarray(seg),
        _cu_seqlens_q=cu,
        _cu_seqlens_kv=cu,
        q_positions=pos,
        kv_positions=pos,
        causal_mask_baked_in=True,
        batch_axis_name="dp",
        qheads_axis_name=None,
        kvheads_axis_name=("tp", "ep"),
        sequence_axis_name=None,
    )
    np.testing.assert_array_equal(mask_of(mi), oracle(seg, seg))  # the flag is informational only
    assert mi.baked_in_masks == {"causal": True, "sliding_window": False, "chunked": False, "token_type_ids": False}
    np.testing.assert_array_equal(mi.cu_seqlens_q, cu)
    np.testing.assert_array_equal(mi.cu_seqlens_kv, cu)
    assert (mi.batch_axis_name, mi.qheads_axis_name, mi.kvheads_axis_name) == ("dp", None, ("tp", "ep"))
    plain = MaskInfo.from_segments(seg)
    axes = plain.batch_axis_name, plain.qheads_axis_name, plain.kvheads_axis_name, plain.sequence_axis_name
    assert axes == (("dp", "fsdp"), "tp", "tp", "sp")
    assert plain.cu_seqlens_q is None and not any(plain.baked_in_masks.values())
    assert not hasattr(plain, "_causal_baked")  # EasyDeL probes for it; upstream has no such field


def test_dynamic_init():
    valid = random_bool((2, 8), p=0.7)
    given = MaskInfo.from_segments(random_segments(2, 8))
    assert MaskInfo.dynamic_init(mask_info=given, input_ids=np.zeros((3, 5), np.int32), attention_mask=valid) is given
    # As modules/llama/modeling_llama.py:434 calls it; the model then applies causality.
    mi = MaskInfo.dynamic_init(
        mask_info=None, input_ids=np.zeros((2, 8), np.int32), inputs_embeds=None, attention_mask=valid.astype(np.int32)
    )
    assert mi.has_segments and not mi.has_dense_mask and not mi.causal
    np.testing.assert_array_equal(mi.q_segment_ids, np.where(valid, 0, -1))
    np.testing.assert_array_equal(mask_of(mi.apply_causal()), causal_padded(valid))
    np.testing.assert_array_equal(mask_of(MaskInfo.dynamic_init(attention_mask=valid * 2.5)), mask_of(mi))  # nonzero
    traced = jax.jit(lambda m: MaskInfo.dynamic_init(attention_mask=m).apply_causal().attention_mask)(valid)
    np.testing.assert_array_equal(traced, causal_padded(valid))
    everyone = np.ones((2, 8), bool)
    for shaped in (dict(input_ids=np.zeros((2, 8), np.int32)), dict(inputs_embeds=np.zeros((2, 8, 4), np.float32))):
        np.testing.assert_array_equal(mask_of(MaskInfo.dynamic_init(**shaped).apply_causal()), causal_padded(everyone))
    dense = random_bool((2, 1, 8, 8))
    np.testing.assert_array_equal(mask_of(MaskInfo.dynamic_init(attention_mask=dense)), dense)
    np.testing.assert_array_equal(mask_of(MaskInfo.dynamic_init(attention_mask=dense[:, 0])), dense)


def test_from_attention_mask_keyword_float_and_inverted():
    cross = random_bool((2, 5, 7)).astype(np.float32)
    # As modules/roberta/modeling_roberta.py:1451 calls it.
    mi = MaskInfo.from_attention_mask(attention_mask=cross[:, None, :, :])
    np.testing.assert_array_equal(mi.attention_mask, cross[:, None] != 0)
    blocked = MaskInfo.from_attention_mask(cross, mask_is_valid=False)  # PyTorch style: nonzero = blocked
    np.testing.assert_array_equal(blocked.attention_mask, cross[:, None] == 0)
    np.testing.assert_array_equal(blocked.q_segment_ids, np.where((cross == 0).any(-1), 0, -1))
    padding = np.array([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]], np.float32)
    pad = MaskInfo.from_attention_mask(padding, mask_is_valid=False, sequence_axis_name=None, batch_axis_name="dp")
    assert pad.has_segments and not pad.has_dense_mask
    assert (pad.sequence_axis_name, pad.batch_axis_name, pad.qheads_axis_name) == (None, "dp", "tp")
    np.testing.assert_array_equal(pad.q_segment_ids, np.where(padding == 0, 0, -1))
    positions = np.tile(np.arange(7, dtype=np.int32), (2, 1))
    with_positions = MaskInfo.from_attention_mask(cross, positions[:, :5], kv_positions=positions)  # generation.py
    np.testing.assert_array_equal(with_positions.get_or_compute_positions()[1], positions)


def test_transforms_set_baked_in_flags():
    mi = MaskInfo.from_segments(random_segments(2, 8))
    types = np.ones((2, 8), np.int32)
    made = {
        "causal": [mi.apply_causal(), mi.apply_causal(offset=1)],
        "sliding_window": [mi.apply_sliding_window(2), mi.apply_sliding_window(2, offset=1)],
        "chunked": [mi.apply_chunked(4), mi.apply_chunked(4, offset=1)],
        "token_type_ids": [mi.apply_token_type_ids(types)],
    }
    for key, outs in made.items():
        for out in outs:
            assert out.baked_in_masks == {name: name == key for name in made}
    assert not any(mi.apply_kv_lengths(np.array([3, 8])).baked_in_masks.values())
    every = mi.apply_causal().apply_sliding_window(3).apply_chunked(2).apply_token_type_ids(types)
    assert all(every.baked_in_masks.values()) and every.sliding_window_baked_in
    # Informational only: setting the flags changes neither the mask nor what kernels get.
    flagged = mi.replace(causal_mask_baked_in=True, sliding_window_baked_in=True, chunked_mask_baked_in=True)
    np.testing.assert_array_equal(mask_of(flagged), mask_of(mi))
    c = flagged.canonical(2)
    assert not c.causal and c.sliding_window is None and c.attention_mask is None


def test_q_attention_mask():
    seg = random_segments(3, 7)
    q_mask = MaskInfo.from_segments(seg, random_segments(3, 4)).apply_causal().q_attention_mask
    assert q_mask.dtype == jnp.int32 and q_mask.shape == (3, 7)
    np.testing.assert_array_equal(q_mask, (seg >= 0).astype(np.int32))
    dense = random_bool((3, 2, 7, 5))
    dense[0, :, 3] = False
    q_mask = MaskInfo.from_attention_mask(dense).q_attention_mask
    assert q_mask.dtype == jnp.int32
    np.testing.assert_array_equal(q_mask, dense.any(axis=(1, 3)).astype(np.int32))


@pytest.mark.parametrize("dtype", [np.dtype("float32"), jnp.bfloat16, jnp.float16, None])
def test_create_bias(dtype):
    valid = random_bool((2, 6), p=0.7)
    mi = MaskInfo.dynamic_init(attention_mask=valid).apply_causal().apply_sliding_window((2, 0))
    window = np.tril(np.ones((6, 6), bool), 0) & np.triu(np.ones((6, 6), bool), -2)
    want = jnp.dtype(jnp.float32 if dtype is None else dtype)
    bias = mi.bias if dtype is None else mi.create_bias(dtype)  # as layers/attention/_flexible.py:1246
    assert bias.dtype == want and bias.shape == (2, 1, 6, 6)
    np.testing.assert_array_equal(np.asarray(bias, np.float32), bias_of(causal_padded(valid) & window, want))


def test_materialize():
    seg = random_segments(2, 6)
    mi = MaskInfo.from_segments(seg).apply_causal()
    assert mi.materialize_segment_ids() is mi
    held = mi.materialize_attention_mask(jnp.float32)
    assert held.has_dense_mask and held.attention_mask.dtype == jnp.float32
    np.testing.assert_array_equal(held.attention_mask, oracle(seg, seg, causal=True))
    np.testing.assert_array_equal(held.q_segment_ids, seg)
    assert held.materialize_attention_mask() is held and held.causal_mask_baked_in


def test_replace_with_a_cut_mask_as_the_window_path_does():
    """layers/attention/_flexible.py:1078: EasyDeL applies the window itself, cuts the keys, and
    replaces the mask without cutting the kv ids. The mask given is the mask afterwards."""
    valid = np.ones((2, 10), bool)
    valid[1, :3] = False  # left padding
    mi = MaskInfo.dynamic_init(attention_mask=valid).apply_causal()
    i, j = np.arange(10)[:, None], np.arange(10)[None, :]
    cut = (np.asarray(mi.attention_mask) & (j >= i - 3))[..., 6:]  # the last 4 keys, as prefill keeps
    out = mi.replace(attention_mask=jnp.asarray(cut), sliding_window_baked_in=True)
    np.testing.assert_array_equal(out.attention_mask, cut)  # causality is not applied again to cut keys
    assert out.sliding_window_baked_in and out.causal_mask_baked_in and not out.causal
    np.testing.assert_array_equal(out.create_bias(jnp.float32), bias_of(cut, jnp.float32))
    np.testing.assert_array_equal(out.q_segment_ids, np.where(valid, 0, -1))  # kept: its length matches
    assert out.kv_segment_ids.shape == (2, 4)  # dropped, then inferred from the new mask
    np.testing.assert_array_equal(np.asarray(out.kv_segment_ids) >= 0, cut.any(axis=(1, 2)))
    c = out.canonical(2)
    assert c.q_segment_ids is None and not c.causal and c.sliding_window is None
    np.testing.assert_array_equal(c.attention_mask, cut)


def test_replace_with_cut_kv_ids_and_positions_as_decoding_does():
    """operations/kernels/decode_attention.py:172: mask, kv ids and kv positions cut alike, per row."""
    seg = random_segments(2, 12)
    pos = np.tile(np.arange(12, dtype=np.int32) + 100, (2, 1))
    mi = MaskInfo.from_segments(seg, seg, pos, pos).apply_causal()
    start, width = np.array([2, 5]), 6
    take = lambda x: np.stack([x[b, ..., start[b] : start[b] + width] for b in range(2)])
    mask, kv_ids, kv_pos = take(np.asarray(mi.attention_mask)), take(seg), take(pos)
    out = mi.replace(attention_mask=mask, sliding_window_baked_in=True, kv_segment_ids=kv_ids, kv_positions=kv_pos)
    np.testing.assert_array_equal(out.attention_mask, mask)
    np.testing.assert_array_equal(out.kv_segment_ids, kv_ids)
    np.testing.assert_array_equal(out.kv_positions, kv_pos)
    np.testing.assert_array_equal(out.q_segment_ids, seg)
    np.testing.assert_array_equal(out.q_positions, pos)
    lengths = np.array([3, 6])  # transforms applied afterwards act on the new mask
    np.testing.assert_array_equal(
        mask_of(out.apply_kv_lengths(lengths)), mask & (np.arange(6) < lengths[:, None, None, None])
    )


def test_replace_rules():
    seg = random_segments(2, 6)
    cu = jnp.array([0, 4, 6])
    mi = MaskInfo(
        _q_segment_ids=jnp.asarray(seg), _kv_segment_ids=jnp.asarray(seg), _cu_seqlens_q=cu, _cu_seqlens_kv=cu
    )
    same = mi.replace(attention_mask=None, q_segment_ids=None, cu_seqlens_q=None)  # upstream's names: None keeps
    np.testing.assert_array_equal(mask_of(same), oracle(seg, seg))
    np.testing.assert_array_equal(same.cu_seqlens_q, cu)
    zeros = np.zeros((2, 6), np.int32)
    swapped = mi.replace(q_segment_ids=zeros)  # ids are this mask's source: the mask follows them
    assert swapped.cu_seqlens_q is None and swapped.cu_seqlens_kv is None  # cleared: the ids changed
    np.testing.assert_array_equal(mask_of(swapped), oracle(zeros, seg))
    kept = mi.replace(q_segment_ids=zeros, cu_seqlens_q=np.array([0, 6, 12]))
    np.testing.assert_array_equal(kept.cu_seqlens_q, [0, 6, 12])
    assert kept.cu_seqlens_kv is None
    # Any field is set as given, None included.
    with_pos = mi.replace(q_positions=jnp.asarray(zeros), batch_axis_name=("dp",), sequence_axis_name=None)
    assert with_pos.replace(q_positions=None).q_positions is None
    assert with_pos.batch_axis_name == ("dp",) and with_pos.sequence_axis_name is None
    # A 3-D mask becomes [B, 1, Sq, Sk] and is the whole mask: no pending transform applies on top.
    dense = random_bool((2, 6, 6))
    busy = mi.apply_causal().apply_kv_lengths(np.array([2, 6])).apply_token_type_ids(zeros + 1)
    out = busy.replace(attention_mask=dense.astype(np.float32))
    np.testing.assert_array_equal(out.attention_mask, dense[:, None])
    assert out.kv_length_limit is None and out.token_type_ids is None and out.cu_seqlens_q is None
    assert out.token_type_ids_baked_in and out.causal_mask_baked_in  # flags are left as they were
    np.testing.assert_array_equal(out.kv_segment_ids, np.where(np.arange(6) < [[2], [6]], seg, -1))
    # Fields given in the same call win over those resets.
    causal_too = mi.replace(attention_mask=dense, causal=True)
    np.testing.assert_array_equal(mask_of(causal_too), dense[:, None] & np.tril(np.ones((6, 6), bool)))


def test_pytree_keeps_flags_and_axis_names_static():
    def build():
        mask = random_bool((2, 1, 6, 6))
        return MaskInfo.from_attention_mask(mask, batch_axis_name=["dp"], qheads_axis_name="mp").apply_sliding_window(2)

    mi = build()
    assert mi.batch_axis_name == ("dp",)  # a list of axes is kept as a (hashable) tuple
    leaves, treedef = jax.tree_util.tree_flatten(mi)
    assert len(leaves) == 3 and all(isinstance(x, jax.Array) for x in leaves)  # ids and mask only
    back = jax.tree_util.tree_unflatten(treedef, leaves)
    assert back.sliding_window_baked_in and back.qheads_axis_name == "mp" and back.sliding_window == (2, 2)
    np.testing.assert_array_equal(mask_of(back), mask_of(mi))
    assert back.canonical(1).q_segment_ids is None  # the ids still only describe the mask
    traces = []

    @jax.jit
    def bias(m):
        traces.append((m.baked_in_masks, m.qheads_axis_name))  # static: plain Python values while tracing
        return m.create_bias(jnp.float32), m

    out, returned = bias(mi)
    np.testing.assert_array_equal(out, bias_of(mask_of(mi), jnp.float32))
    assert returned.sliding_window_baked_in and returned.batch_axis_name == ("dp",)
    other = build()
    np.testing.assert_array_equal(bias(other)[0], bias_of(mask_of(other), jnp.float32))
    assert len(traces) == 1  # new arrays, same flags: no retrace
    bias(mi.replace(sliding_window_baked_in=False))
    bias(mi.replace(qheads_axis_name="tp"))
    assert len(traces) == 3 and not traces[1][0]["sliding_window"] and traces[2][1] == "tp"


# ------------------------------------------------------------------------- jit, vmap, shard_map


def rich_mask_info(batch, length):
    """Segments with every transform that keeps them (plus token types): the widest pytree."""
    seg = random_segments(batch, length)
    lengths = random_ints((batch,), 1, length + 1)
    types = random_ints((batch, length), 0, 3)
    return (
        MaskInfo.from_segments(seg)
        .apply_causal()
        .apply_sliding_window((3, 1))
        .apply_kv_lengths(lengths)
        .apply_token_type_ids(types)
    )


def test_jit():
    mi = rich_mask_info(2, 9)
    compute = jax.jit(lambda m: m.get_or_compute_attention_mask())
    np.testing.assert_array_equal(compute(mi), mask_of(mi))
    # Static fields are part of the cache key: the same function sees a changed flag.
    plain = MaskInfo.from_segments(mi.q_segment_ids)
    np.testing.assert_array_equal(compute(plain), mask_of(plain))
    np.testing.assert_array_equal(compute(plain.apply_chunked(3)), mask_of(plain.apply_chunked(3)))
    # A MaskInfo goes through jit and comes back out with its flags.
    back = jax.jit(lambda m: m)(mi)
    assert isinstance(back, MaskInfo) and back.causal and back.sliding_window == (3, 1)
    np.testing.assert_array_equal(mask_of(back), mask_of(mi))

    # Built and transformed from traced arrays: concrete-only checks step aside.
    @jax.jit
    def from_cu(cu, lengths):
        m = MaskInfo.from_cu_seqlens(cu, q_len=6).apply_kv_lengths(lengths).apply_causal()
        return m.get_or_compute_attention_mask(), m.q_lengths(), m.kv_lengths()

    cu, lengths = jnp.array([0, 4, 10]), jnp.array([2, 6])
    mask, q_lens, kv_lens = from_cu(cu, lengths)
    eager = MaskInfo.from_cu_seqlens(cu, q_len=6).apply_kv_lengths(lengths).apply_causal()
    np.testing.assert_array_equal(mask, mask_of(eager))
    np.testing.assert_array_equal(q_lens, [4, 6])
    np.testing.assert_array_equal(kv_lens, [2, 6])


def test_vmap():
    mi = rich_mask_info(3, 8)
    full = mask_of(mi)
    per_row = jax.vmap(lambda m: m.get_or_compute_attention_mask())(mi)
    np.testing.assert_array_equal(per_row, full)
    np.testing.assert_array_equal(jax.vmap(lambda m: m.kv_lengths())(mi), mi.kv_lengths())
    dense = MaskInfo.from_attention_mask(random_bool((3, 2, 5, 7))).apply_sliding_window(1)
    per_row = jax.vmap(lambda m: m.get_or_compute_attention_mask())(dense)
    np.testing.assert_array_equal(per_row, mask_of(dense))
    # A transform applied per row: shapes are checked against the row's (unbatched) shape.
    seg = random_segments(3, 8)
    lengths = jnp.array([2, 8, 5])
    rows = jax.vmap(lambda m, n: m.apply_kv_lengths(n).get_or_compute_attention_mask())(
        MaskInfo.from_segments(seg), lengths
    )
    np.testing.assert_array_equal(rows, oracle(seg, seg, kv_lens=np.asarray(lengths)))
    # The MaskInfo broadcast (in_axes=None) over a batched argument.
    scores = random_ints((4, 3, 1, 8, 8), -50, 50).astype(np.float32)
    masked = jax.vmap(lambda s, m: jnp.where(m.get_or_compute_attention_mask(), s, 0.0), in_axes=(0, None))(scores, mi)
    np.testing.assert_array_equal(masked, np.where(full, scores, 0.0))


def test_shard_map():
    assert jax.device_count() == 8, "tests expect XLA_FLAGS=--xla_force_host_platform_device_count=8"
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("x",))
    mi = rich_mask_info(8, 6)
    dense = MaskInfo.from_attention_mask(random_bool((8, 2, 4, 6))).apply_causal()

    def local(m, d):
        masks = m.get_or_compute_attention_mask(), d.get_or_compute_attention_mask()
        return *masks, m.q_lengths(), m.apply_chunked(2)

    mask, dense_mask, q_lens, chunked = jax.shard_map(
        local, mesh=mesh, in_specs=(P("x"), P("x")), out_specs=P("x"), check_vma=False
    )(mi, dense)
    np.testing.assert_array_equal(mask, mask_of(mi))
    np.testing.assert_array_equal(q_lens, mi.q_lengths())
    assert isinstance(chunked, MaskInfo) and chunked.chunk_size == 2
    np.testing.assert_array_equal(mask_of(chunked), mask_of(mi.apply_chunked(2)))
    np.testing.assert_array_equal(dense_mask, mask_of(dense))


# ---------------------------------------------------------------------------------------- errors

SEG = np.zeros((2, 5), np.int32)
SEGMENTS = MaskInfo.from_segments(SEG)
ERRORS = {
    "float segment ids": (
        lambda: MaskInfo.from_segments(np.zeros((2, 5), np.float32)),
        TypeError,
        r"q_segment_ids must hold integers, got dtype float32",
    ),
    "bool segment ids": (
        lambda: MaskInfo.from_segments(SEG, np.ones((2, 5), bool)),
        TypeError,
        r"kv_segment_ids must hold integers",
    ),
    "segment rank": (
        lambda: MaskInfo.from_segments(np.zeros(5, np.int32)),
        ValueError,
        r"q_segment_ids must have shape \[batch, q_len\] = \(\?, \?\), got \(5,\)",
    ),
    "segment batch": (
        lambda: MaskInfo.from_segments(SEG, np.zeros((3, 5), np.int32)),
        ValueError,
        r"kv_segment_ids must have shape \[batch, kv_len\] = \(2, \?\), got \(3, 5\)",
    ),
    "complex mask": (
        lambda: MaskInfo.from_attention_mask(np.ones((2, 4, 4), np.complex64)),
        TypeError,
        r"attention_mask must be boolean, integer or float.*complex64",
    ),
    "mask rank": (
        lambda: MaskInfo.from_attention_mask(np.ones((1, 2, 1, 4, 4), bool)),
        ValueError,
        r"mask must have shape .*got \(1, 2, 1, 4, 4\)",
    ),
    "cu decreasing": (
        lambda: MaskInfo.from_cu_seqlens(np.array([0, 3, 2]), q_len=4),
        ValueError,
        r"cu_seqlens_q must rise from 0 without decreasing, got \[0, 3, 2\]",
    ),
    "cu too long": (
        lambda: MaskInfo.from_cu_seqlens(np.array([0, 2, 7]), q_len=4),
        ValueError,
        r"cu_seqlens_q: each of its lengths \[2, 5\] must be <= 4 \(the length of the axis\)",
    ),
    "cu not from 0": (
        lambda: MaskInfo.from_cu_seqlens(np.array([3, 5, 7]), q_len=4),
        ValueError,
        r"cu_seqlens_q must rise from 0 without decreasing, got \[3, 5, 7\]",
    ),
    "cu rank": (
        lambda: MaskInfo.from_cu_seqlens(np.zeros((2, 3), np.int32), q_len=4),
        ValueError,
        r"cu_seqlens_q must have shape \[batch \+ 1\]",
    ),
    "cu float": (
        lambda: MaskInfo.from_cu_seqlens(np.array([0.0, 2.0]), q_len=4),
        TypeError,
        r"cu_seqlens_q must hold integers",
    ),
    "cu batch": (
        lambda: MaskInfo.from_cu_seqlens(np.array([0, 2, 3]), np.array([0, 1]), q_len=4),
        ValueError,
        r"cu_seqlens_k must have batch \+ 1 = 3 entries like cu_seqlens_q, got 2",
    ),
    "cu no q_len": (lambda: MaskInfo.from_cu_seqlens(np.array([0, 2])), ValueError, r"q_len .* is required"),
    "cu bad kv_len": (
        lambda: MaskInfo.from_cu_seqlens(np.array([0, 2]), q_len=4, kv_len=0),
        ValueError,
        r"kv_len must be a positive integer, got 0",
    ),
    "negative window": (lambda: SEGMENTS.apply_sliding_window(-1), ValueError, r"window must be non-negative, got -1"),
    "negative window side": (
        lambda: SEGMENTS.apply_sliding_window((1, -2)),
        ValueError,
        r"window must be non-negative, got \(1, -2\)",
    ),
    "window triple": (
        lambda: SEGMENTS.apply_sliding_window((1, 2, 3)),
        TypeError,
        r"window must be an int or a \(left, right\) pair",
    ),
    "window bool": (lambda: SEGMENTS.apply_sliding_window(True), TypeError, r"window must be an int"),
    "chunk zero": (lambda: SEGMENTS.apply_chunked(0), ValueError, r"chunk_size must be a positive integer"),
    "chunk twice": (
        lambda: SEGMENTS.apply_chunked(4).apply_chunked(8),
        ValueError,
        r"chunk_size 4 is already applied, got 8",
    ),
    "kv_lengths batch": (
        lambda: SEGMENTS.apply_kv_lengths(np.array([1, 2, 3])),
        ValueError,
        r"kv_lengths must have shape \[batch\] = \(2\), got \(3,\)",
    ),
    "kv_lengths float": (
        lambda: SEGMENTS.apply_kv_lengths(np.array([1.0, 2.0])),
        TypeError,
        r"kv_lengths must hold integers",
    ),
    "kv_lengths negative": (
        lambda: SEGMENTS.apply_kv_lengths(np.array([1, -2])),
        ValueError,
        r"kv_lengths must be non-negative, got \[1, -2\]",
    ),
    "types shape": (
        lambda: SEGMENTS.apply_token_type_ids(np.zeros((2, 6), np.int32)),
        ValueError,
        r"token_type_ids must have shape \[batch, seq\] = \(2, 5\), got \(2, 6\)",
    ),
    "types cross": (
        lambda: MaskInfo.from_segments(SEG, np.zeros((2, 7), np.int32)).apply_token_type_ids(SEG),
        ValueError,
        r"token_type_ids need q_len == kv_len, got 5 and 7",
    ),
    "types twice": (
        lambda: SEGMENTS.apply_token_type_ids(SEG).apply_token_type_ids(SEG),
        ValueError,
        r"token_type_ids are already applied",
    ),
    "canonical heads": (
        lambda: MaskInfo.from_attention_mask(np.ones((2, 3, 4, 4), bool)).canonical(2),
        ValueError,
        r"attention_mask has 3 heads, expected 1 or num_heads=2",
    ),
    "canonical zero heads": (lambda: SEGMENTS.canonical(0), ValueError, r"num_heads must be a positive integer"),
    "random sparsity": (
        lambda: MaskInfo.from_random(1, 4, sparsity=1.5),
        ValueError,
        r"sparsity must be in \[0, 1\], got 1.5",
    ),
    "random batch": (
        lambda: MaskInfo.from_random(0, 4),
        ValueError,
        r"batch_size must be a positive integer, got 0",
    ),
    "no source": (lambda: MaskInfo().get_or_compute_attention_mask(), ValueError, r"MaskInfo has no source"),
    "dynamic_init nothing": (lambda: MaskInfo.dynamic_init(), ValueError, r"dynamic_init needs mask_info"),
    "dynamic_init input_ids rank": (
        lambda: MaskInfo.dynamic_init(input_ids=np.zeros((2, 3, 4), np.int32)),
        ValueError,
        r"input_ids must have 2 dimensions",
    ),
    "bias int dtype": (lambda: SEGMENTS.create_bias(jnp.int32), TypeError, r"create_bias needs a float dtype"),
    "materialize nothing": (lambda: MaskInfo().materialize_segment_ids(), ValueError, r"neither segment ids"),
    "replace unknown": (lambda: SEGMENTS.replace(mask=SEG), TypeError, r"unknown fields \['mask'\]"),
    "replace mask rank": (
        lambda: SEGMENTS.replace(attention_mask=np.ones((2, 5), bool)),
        ValueError,
        r"attention_mask must have shape \[batch, q_len, kv_len\]",
    ),
    "replace ids length": (
        lambda: SEGMENTS.replace(attention_mask=np.ones((2, 5, 4), bool), kv_segment_ids=SEG),
        ValueError,
        r"kv_segment_ids must have length 4 like the attention_mask, got \(2, 5\)",
    ),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_errors(case):
    call, error, message = ERRORS[case]
    with pytest.raises(error, match=message):
        call()
