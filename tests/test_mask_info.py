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
@pytest.mark.parametrize("dtype", [np.bool_, np.int32])
def test_from_attention_mask_dense(shape, dtype):
    mask = random_bool(shape)
    mask[0, ..., 2, :] = False  # an empty query row (in every head)
    mask[1, ..., :, 4] = False  # an empty key column
    mi = MaskInfo.from_attention_mask(mask.astype(dtype))
    assert mi.has_dense_mask and not mi.has_segments
    full = mask if mask.ndim == 4 else mask[:, None]
    np.testing.assert_array_equal(mask_of(mi), oracle(dense=full))
    q, kv = mi.get_or_compute_segment_ids()
    # Inferred ids: -1 exactly where a query (key) attends nothing; equal ids where rows (columns) are equal.
    merged = full.any(axis=1)
    np.testing.assert_array_equal(np.asarray(q) >= 0, merged.any(axis=2))
    np.testing.assert_array_equal(np.asarray(kv) >= 0, merged.any(axis=1))
    for b, i, i2 in itertools.product(range(merged.shape[0]), range(merged.shape[1]), range(merged.shape[1])):
        if merged[b, i].any() and merged[b, i2].any():
            assert (q[b, i] == q[b, i2]) == (merged[b, i] == merged[b, i2]).all()
    assert int(q[0, 2]) == -1 and int(kv[1, 4]) == -1
    np.testing.assert_array_equal(mi.q_lengths(), full.any(axis=(1, 3)).sum(1))


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
    "float mask": (
        lambda: MaskInfo.from_attention_mask(np.ones((2, 4, 4), np.float32)),
        TypeError,
        r"mask must be boolean or integer.*float32",
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
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_errors(case):
    call, error, message = ERRORS[case]
    with pytest.raises(error, match=message):
        call()
