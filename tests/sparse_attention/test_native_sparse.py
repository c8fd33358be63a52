"""native_sparse_attention: the XLA implementation and the public function against the reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from ejkernel.kernels._common.sparse_attention.native_sparse import clean_selection, packing
from ejkernel.kernels._xla.native_sparse_attention import native_sparse_attention_xla
from ejkernel.modules import NativeSparseAttentionConfig, native_sparse_attention
from ejkernel.ops import overlay_cache
from ejkernel.reference.native_sparse_attention import native_sparse_attention_reference
from harness import assert_close, check_forward_and_grads, randn

B, S, H, HKV, D = 2, 37, 6, 2, 16  # three query heads per key/value head


def inputs(batch=B, seq=S, heads=H, kv_heads=HKV, dim=D, value_dim=None, dtype=jnp.float32):
    q = randn((batch, seq, heads, dim), dtype)
    k = randn((batch, seq, kv_heads, dim), dtype)
    v = randn((batch, seq, kv_heads, value_dim or dim), dtype)
    return q, k, v


def random_selection(batch, seq, kv_heads, n, blocks, seed=0):
    """Indices with -1s, later blocks and repeats in them, and per-token counts (some 0)."""
    rng = np.random.default_rng(seed)
    indices = rng.integers(-1, blocks, (batch, seq, kv_heads, n)).astype(np.int32)
    counts = rng.integers(0, n + 1, (batch, seq, kv_heads)).astype(np.int32)
    return jnp.asarray(indices), jnp.asarray(counts)


def _check(floats, rest=(), dtype=jnp.float32, block_size=8):
    """XLA vs reference, forward and the gradient of every float input; `rest` (indices, counts, cu_seqlens)
    are closed over, as they are not differentiated."""
    n = len(floats)
    fn = lambda *a: native_sparse_attention_xla(*a, *(None,) * (5 - n), *rest, block_size=block_size)
    ref = lambda *a: native_sparse_attention_reference(*a, *(None,) * (5 - n), *rest, block_size=block_size)
    check_forward_and_grads(jax.jit(fn), jax.jit(ref), floats, tuple(range(n)), dtype)


def test_xla_chosen_blocks_both_gates_grouped_heads():
    q, k, v = inputs()
    _check([q, k, v, randn((B, S, H)), randn((B, S, H))], (None, 3))


def test_xla_given_blocks_with_counts_minus_ones_and_repeats():
    q, k, v = inputs(heads=4, kv_heads=4, value_dim=32, dtype=jnp.bfloat16)
    indices, counts = random_selection(B, S, 4, 4, -(-S // 8))
    _check([q, k, v], (indices, counts), jnp.bfloat16)


def test_xla_packed_sequences_with_counts_array_and_chosen_blocks():
    q, k, v = inputs(batch=1, heads=4, kv_heads=1)
    cu = jnp.array([0, 5, 20, 21, 37], jnp.int32)  # a sequence shorter than a block, and one of length 1
    counts = jnp.asarray(np.random.default_rng(1).integers(1, 4, (1, S, 1)).astype(np.int32))
    _check([q, k, v, randn((1, S, 4))], (None, counts, cu), block_size=4)


def test_xla_sliding_window_branch_packed():
    """The third branch: per packed sequence, each query over its last 6 keys, gated, with the other two."""
    q, k, v = inputs(batch=1, heads=4, kv_heads=2, value_dim=24)
    cu = jnp.array([0, 5, 21, 37], jnp.int32)
    fn = lambda *a: native_sparse_attention_xla(*a[:5], None, 2, cu, a[5], block_size=4, window_size=6)
    ref = lambda *a: native_sparse_attention_reference(*a[:5], None, 2, cu, a[5], block_size=4, window_size=6)
    gates = [randn((1, S, 4)) for _ in range(3)]
    check_forward_and_grads(jax.jit(fn), jax.jit(ref), [q, k, v, *gates], tuple(range(6)), jnp.float32)


def test_clean_selection_drops_what_is_not_visited():
    pack = packing(1, 12, 4)
    indices = jnp.array([[[[0, 2, 0, -1]]] * 12], jnp.int32).reshape(1, 12, 1, 4)
    cleaned = np.asarray(clean_selection(indices, 3, pack))[0, :, 0]
    assert cleaned[0].tolist() == [0, -1, -1, -1]  # block 2 lies after token 0's block; the repeat of 0 drops
    assert cleaned[11].tolist() == [0, 2, -1, -1]  # the count cuts the list after three entries
    with pytest.raises(ValueError, match="block_indices"):
        clean_selection(indices.at[0, 0, 0, 0].set(3), 3, pack)  # 12 tokens hold blocks 0..2 only


# ---- the public function ----


@pytest.mark.lowest
def test_public_default_block_size_jit_and_sharding():
    q, k, v = inputs(batch=2, seq=100, heads=8, kv_heads=4)
    g = randn((2, 100, 8))
    expected = native_sparse_attention_reference(q, k, v, g, g, None, 1)
    assert_close(jax.jit(lambda *a: native_sparse_attention(*a, None, 1))(q, k, v, g, g), expected)
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    spec, gate = P("data", None, "model"), P("data", None, "model")
    out = native_sparse_attention(
        q, k, v, g, g, None, 1, mesh=mesh, in_specs=(spec, spec, spec, gate, gate), out_specs=spec
    )
    assert_close(out, expected)
    with jax.set_mesh(mesh):  # the packing is made in numpy: eager JAX fails inside shard_map here
        out = native_sparse_attention(
            q, k, v, g, g, None, 1, mesh=mesh, in_specs=(spec, spec, spec, gate, gate), out_specs=spec
        )
    assert_close(out, expected)
    with pytest.raises(ValueError, match="sequence"):
        native_sparse_attention(q, k, v, mesh=mesh, in_specs=(P(None, "data"),) * 3, out_specs=P())


def test_public_block_size_argument_and_checkpointed_gradient():
    q, k, v = inputs()
    indices, counts = random_selection(B, S, HKV, 3, -(-S // 16), seed=2)
    fn = lambda q: jnp.sum(
        jax.checkpoint(lambda q: native_sparse_attention(q, k, v, None, None, indices, counts, block_size=16))(q) ** 2
    )
    ref = lambda q: jnp.sum(native_sparse_attention_reference(q, k, v, None, None, indices, counts, block_size=16) ** 2)
    assert_close(jax.grad(fn)(q), jax.grad(ref)(q), tol=1e-4)


def test_config_block_size_never_changes_the_result():
    """Upstream's `cfg.block_size` still constructs and reads back; equal to the call's (or None) it runs, any
    other value is refused, whether given as `cfg=` or met as a cache entry (here an overlay)."""
    q, k, v = inputs()
    g = randn((B, S, H))
    call = lambda **options: native_sparse_attention(q, k, v, g, g, None, 2, block_size=8, platform="xla", **options)
    expected = native_sparse_attention_reference(q, k, v, g, g, None, 2, block_size=8)
    for cfg in (NativeSparseAttentionConfig(block_size=8), NativeSparseAttentionConfig()):
        assert NativeSparseAttentionConfig.from_json(cfg.to_json()) == cfg
        assert_close(call(cfg=cfg), expected)
    stale = NativeSparseAttentionConfig(platform="xla", block_size=16)
    with pytest.raises(ValueError, match=r"cfg.block_size=16 differs from the call's block_size=8"):
        call(cfg=stale)
    with overlay_cache({"native_sparse_attention": stale}), pytest.raises(ValueError, match="block_size"):
        call()
    # Upstream's way: no block_size=, the caller's own cfg= gives it (an overlay never does: 64 stays).
    upstream = native_sparse_attention(q, k, v, g, g, None, 2, platform="xla", cfg=stale)
    assert_close(upstream, native_sparse_attention_reference(q, k, v, g, g, None, 2, block_size=16))
    with overlay_cache({"native_sparse_attention": stale}), pytest.raises(ValueError, match="block_size=64"):
        native_sparse_attention(q, k, v, g, g, None, 2, platform="xla")


@pytest.mark.parametrize("mode", ["jit", "grad"])
def test_public_sliding_window_packed_at_tile_lengths(mode):
    """Packed sequences with the sliding branch on xla, where the packing's segment ids fill whole tiles of the
    sliding branch (40 tokens): these once reached the block-sparse walk as numpy and failed on a traced index."""
    seq = 40
    q, k, v = inputs(batch=1, seq=seq, heads=4, kv_heads=2)
    gates = [randn((1, seq, 4)) for _ in range(3)]
    cu = jnp.array([0, 13, 29, seq], jnp.int32)
    options = dict(window_size=8, block_size=8)
    fn = lambda q, k, v, *g: native_sparse_attention(q, k, v, *g[:2], None, 2, cu, g[2], platform="xla", **options)
    ref = jax.jit(lambda q, k, v, *g: native_sparse_attention_reference(q, k, v, *g[:2], None, 2, cu, g[2], **options))
    args = [q, k, v, *gates]
    if mode == "grad":
        check_forward_and_grads(fn, ref, args, tuple(range(6)), jnp.float32)
    else:
        assert_close(jax.jit(fn)(*args), ref(*args))


BAD_INPUTS = [
    ("rank", lambda q, k, v: native_sparse_attention(q[0], k, v), "query"),
    ("integer dtype", lambda q, k, v: native_sparse_attention(q, k.astype(jnp.int32), v), "key"),
    ("heads not divisible", lambda q, k, v: native_sparse_attention(q[:, :, :5], k, v), "multiple"),
    ("gate shape", lambda q, k, v: native_sparse_attention(q, k, v, jnp.ones((B, S, 2))), "g_cmp"),
    (
        "float indices",
        lambda q, k, v: native_sparse_attention(q, k, v, None, None, jnp.zeros((B, S, HKV, 2))),
        "block_indices",
    ),
    (
        "index out of range",
        lambda q, k, v: native_sparse_attention(q, k, v, None, None, jnp.full((B, S, HKV, 2), 9)),
        "block_indices",
    ),
    ("negative count", lambda q, k, v: native_sparse_attention(q, k, v, None, None, None, -1), "non-negative"),
    ("bool count", lambda q, k, v: native_sparse_attention(q, k, v, None, None, None, True), "block_counts"),
    (
        "packed batch",
        lambda q, k, v: native_sparse_attention(q, k, v, None, None, None, 2, jnp.array([0, S])),
        "batch must be 1",
    ),
    (
        "packed bounds",
        lambda q, k, v: native_sparse_attention(q[:1], k[:1], v[:1], None, None, None, 2, jnp.array([0, 9])),
        "cu_seqlens",
    ),
    ("block size", lambda q, k, v: native_sparse_attention(q, k, v, block_size=0), "block_size"),
    ("config block size", lambda q, k, v: NativeSparseAttentionConfig(block_size=0), "block_size"),
    (
        "sliding gate without a window",
        lambda q, k, v: native_sparse_attention(q, k, v, None, None, None, 2, None, jnp.ones((B, S, H))),
        "window_size",
    ),
    ("window without a gate", lambda q, k, v: native_sparse_attention(q, k, v, window_size=4), "g_swa"),
]


@pytest.mark.lowest
@pytest.mark.parametrize(("case", "call", "words"), BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_inputs_name_the_argument(case, call, words):
    q, k, v = inputs()
    with pytest.raises((ValueError, TypeError)) as info:
        call(q, k, v)
    assert words in str(info.value), str(info.value)[:500]
