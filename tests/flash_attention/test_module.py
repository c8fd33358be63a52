"""The public `flash_attention`: argument normalisation, masks, padding, paging, errors, sharding."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from ejkernel.modules import FlashAttentionConfig, blocksparse_attention, flash_attention
from ejkernel.ops import FwdParams
from ejkernel.reference.flash_attention import flash_attention_reference
from ejkernel.types import MaskInfo
from harness import assert_close, check_forward_and_grads, randn

B, S, H, HKV, D = 2, 40, 4, 2, 16
SMALL = FlashAttentionConfig(platform="xla", fwd_params=FwdParams(block_q=16, block_k=16))


def qkv(q_len=S, kv_len=S, dtype=jnp.float32):
    return randn((B, q_len, H, D), dtype), randn((B, kv_len, HKV, D), dtype), randn((B, kv_len, HKV, D), dtype)


def reference(q, k, v, **kw):
    return flash_attention_reference(q, k, v, softmax_scale=D**-0.5, **kw)


@pytest.mark.lowest
def test_defaults_match_reference_forward_and_grads():
    q, k, v = qkv()
    fn = lambda q, k, v: flash_attention(q, k, v, causal=True, cfg=SMALL)
    check_forward_and_grads(fn, lambda q, k, v: reference(q, k, v, causal=True), [q, k, v], (0, 1, 2), jnp.float32)


def test_int_window_means_both_sides_and_softcap_and_sinks():
    q, k, v = qkv()
    sinks = randn((H,))
    out = flash_attention(q, k, v, None, None, None, sinks, sliding_window=5, logits_soft_cap=7.0, cfg=SMALL)
    expected = reference(q, k, v, softmax_aux=sinks, sliding_window=(5, 5), logits_soft_cap=7.0)
    assert_close(out, expected)


def test_cum_seqlens_pad_rows_and_zero_padded_queries():
    q, k, v = qkv()
    cum = jnp.array([0, 25, 65], jnp.int32)  # row 0: 25 tokens, row 1: all 40
    out = flash_attention(q, k, v, None, cum, cum, cfg=SMALL)
    seg = jnp.where(jnp.arange(S)[None] < jnp.array([[25], [40]]), 0, -1)
    assert_close(out, reference(q, k, v, q_segment_ids=seg, kv_segment_ids=seg))
    assert bool(jnp.all(out[0, 25:] == 0))


def test_mask_info_segments_causal_window_combine():
    q, k, v = qkv()
    seg = jax.random.randint(jax.random.PRNGKey(3), (B, S), -1, 3).sort(axis=1)
    mask = MaskInfo.from_segments(seg).apply_causal().apply_sliding_window((6, 0))
    fn = lambda q, k, v: flash_attention(q, k, v, mask_info=mask, cfg=SMALL)
    ref = lambda q, k, v: reference(q, k, v, q_segment_ids=seg, kv_segment_ids=seg, causal=True, sliding_window=(6, 0))
    check_forward_and_grads(fn, ref, [q, k, v], (0, 1, 2), jnp.float32)


def test_mask_info_dense_mask():
    q, k, v = qkv()
    dense = jax.random.bernoulli(jax.random.PRNGKey(4), 0.6, (B, 1, S, S))
    out = flash_attention(q, k, v, mask_info=MaskInfo.from_attention_mask(dense), cfg=SMALL)
    assert_close(out, reference(q, k, v, attention_mask=dense))


def test_bias_broadcast_and_gradient():
    q, k, v = qkv()
    bias = randn((1, H, S, S))
    fn = lambda q, bias: flash_attention(q, k, v, bias, cfg=SMALL)
    check_forward_and_grads(fn, lambda q, bias: reference(q, k, v, bias=bias), [q, bias], (0, 1), jnp.float32)


def test_dropout_is_deterministic_per_seed():
    q, k, v = qkv()
    run = lambda seed: flash_attention(q, k, v, dropout_prob=0.25, dropout_seed=seed, cfg=SMALL)
    assert_close(run(7), reference(q, k, v, dropout_prob=0.25, dropout_seed=jnp.uint32(7)))
    assert bool(jnp.all(run(7) == run(7))) and not bool(jnp.all(run(7) == run(8)))


def test_paged_kv_via_block_tables():
    q = randn((B, 8, H, D))
    block, pages = 4, 12
    k_cache, v_cache = randn((pages, block, HKV, D)), randn((pages, block, HKV, D))
    tables = jnp.array([[3, 0, 7], [11, 5, 2]], jnp.int32)
    out = flash_attention(q, k_cache, v_cache, None, None, None, None, tables, causal=True, cfg=SMALL)
    k = k_cache[tables].reshape(B, 12, HKV, D)
    v = v_cache[tables].reshape(B, 12, HKV, D)
    assert_close(out, reference(q, k, v, causal=True))


def test_masks_under_x64():
    """With `jax_enable_x64` (loop indices and Python ints become int64), dense and chunked masks still run,
    in flash attention and block-sparse attention alike."""
    q, k, v = qkv()
    dense = MaskInfo.from_attention_mask(jnp.ones((B, S, S), bool)).apply_causal()
    chunked = MaskInfo.from_segments(jnp.zeros((B, S), jnp.int32)).apply_chunked(4)
    expected = {m: flash_attention(q, k, v, mask_info=m, cfg=SMALL) for m in (dense, chunked)}
    bsa = lambda: blocksparse_attention(*(jnp.swapaxes(x, 1, 2) for x in (q, k, v)), chunk_size=4, platform="xla")
    expected_bsa = bsa()
    with jax.enable_x64(True):
        for mask, out in expected.items():
            assert_close(flash_attention(q, k, v, mask_info=mask, cfg=SMALL), out)
        assert_close(bsa(), expected_bsa)


def test_xla_only_options_and_auto_fallback():
    q, k, v = qkv()
    unnormalised = flash_attention(q, k, v, normalize_output=False)  # auto: only xla accepts it
    assert unnormalised.shape == q.shape and bool(jnp.all(jnp.isfinite(unnormalised)))


def test_jit_vmap_checkpoint():
    q, k, v = qkv()
    fn = functools.partial(flash_attention, causal=True, cfg=SMALL)
    batched = jax.jit(jax.vmap(fn))(q[None], k[None], v[None])[0]
    assert_close(batched, reference(q, k, v, causal=True))
    g = jax.grad(lambda q: jnp.sum(jax.checkpoint(fn)(q, k, v) ** 2))(q)
    assert_close(g, jax.grad(lambda q: jnp.sum(reference(q, k, v, causal=True) ** 2))(q), tol=1e-4)


@pytest.mark.lowest
def test_sharded_over_batch_and_heads_equals_unsharded():
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    q, k, v = randn((2, 24, 8, D)), randn((2, 24, 4, D)), randn((2, 24, 4, D))
    seg = jnp.where(jnp.arange(24)[None] < jnp.array([[20], [24]]), 0, -1)
    spec = P("data", None, "model", None)
    out = flash_attention(
        q, k, v, mask_info=MaskInfo.from_segments(seg), causal=True, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec
    )
    assert_close(out, flash_attention(q, k, v, mask_info=MaskInfo.from_segments(seg), causal=True))


def test_sharded_sequence_is_refused_with_a_pointer_to_ring_attention():
    mesh = jax.make_mesh((2, 4), ("data", "sp"))
    q, k, v = qkv(q_len=24, kv_len=24)
    seq = P(None, "sp")
    with pytest.raises(ValueError, match="ring_attention"):
        flash_attention(q, k, v, mesh=mesh, in_specs=(P(), seq, seq), out_specs=P())
    with pytest.raises(ValueError, match="ring_attention"):
        flash_attention(q, k, v, causal=True, mesh=mesh, in_specs=(seq, P(), P()), out_specs=seq)


PAST = jnp.array([[0, 9], [1, 0]], jnp.int32)  # page 9 of a cache of B pages
BAD_INPUTS = [
    ("rank", lambda q, k, v: flash_attention(q[0], k, v), "query"),
    ("head dim mismatch", lambda q, k, v: flash_attention(q, k[..., :8], v), "dim"),
    ("heads not divisible", lambda q, k, v: flash_attention(q[:, :, :3], k, v), "multiple"),
    ("integer dtype", lambda q, k, v: flash_attention(q.astype(jnp.int32), k, v), "query"),
    ("negative window", lambda q, k, v: flash_attention(q, k, v, sliding_window=-1), "sliding_window"),
    ("dropout >= 1", lambda q, k, v: flash_attention(q, k, v, dropout_prob=1.0, dropout_seed=0), "dropout_prob"),
    ("cum_seqlens size", lambda q, k, v: flash_attention(q, k, v, None, jnp.array([0, 4], jnp.int32)), "cum_seqlens"),
    ("soft cap", lambda q, k, v: flash_attention(q, k, v, logits_soft_cap=0.0), "logits_soft_cap"),
    ("partial mesh", lambda q, k, v: flash_attention(q, k, v, in_specs=(P(),) * 3), "mesh"),
    ("unknown platform", lambda q, k, v: flash_attention(q, k, v, platform="metal"), "platform"),
    ("page past the cache", lambda q, k, v: flash_attention(q, k, v, None, None, None, None, PAST), "block_tables"),
    ("empty sinks", lambda q, k, v: flash_attention(q, k, v, None, None, None, jnp.zeros((0,))), "softmax_aux"),
    ("float seed", lambda q, k, v: flash_attention(q, k, v, dropout_prob=0.1, dropout_seed=jnp.array(1.5)), "seed"),
]


@pytest.mark.lowest
@pytest.mark.parametrize(("case", "call", "words"), BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_inputs_name_the_argument(case, call, words):
    q, k, v = qkv()
    with pytest.raises((ValueError, TypeError)) as info:
        call(q, k, v)
    assert words in str(info.value), str(info.value)[:500]


def test_fully_masked_rows_are_zero_with_finite_grads():
    q, k, v = qkv()
    seg_q = jnp.full((B, S), -1).at[:, :10].set(0)
    seg_k = jnp.zeros((B, S), jnp.int32)
    mask = MaskInfo.from_segments(seg_q, seg_k)
    fn = lambda q, k, v: flash_attention(q, k, v, None, None, None, jnp.ones((H,)), mask_info=mask, cfg=SMALL)
    out = fn(q, k, v)
    assert bool(jnp.all(out[:, 10:] == 0))
    grads = jax.grad(lambda *a: jnp.sum(fn(*a) ** 2), argnums=(0, 1, 2))(q, k, v)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in grads)
    assert bool(jnp.all(grads[0][:, 10:] == 0))
    np.testing.assert_array_equal(np.asarray(out.shape), (B, S, H, D))


def test_paged_kv_sharded_over_batch_and_heads():
    mesh = jax.make_mesh((2, 2), ("data", "model"))
    q = randn((B, 8, H, D))
    k_cache, v_cache = randn((12, 4, HKV, D)), randn((12, 4, HKV, D))
    tables = jnp.array([[3, 0, 7], [11, 5, 2]], jnp.int32)
    spec, cache_spec = P("data", None, "model", None), P(None, None, "model", None)
    out = flash_attention(
        q,
        k_cache,
        v_cache,
        None,
        None,
        None,
        None,
        tables,
        causal=True,
        mesh=mesh,
        in_specs=(spec, cache_spec, cache_spec, P("data", None)),
        out_specs=spec,
    )
    assert_close(out, flash_attention(q, k_cache, v_cache, None, None, None, None, tables, causal=True))


def test_huge_windows_reach_every_backend_clamped_to_the_lengths(monkeypatch):
    """Kernels compute positions in int32: a window side like 2**40 arrives as at most Sq + Sk."""
    from ejkernel import Backend, Platform, kernel_registry
    from ejkernel.registry import Implementation

    seen = []
    xla = kernel_registry.get("flash_attention", "xla")

    def spy(*args, **kwargs):
        seen.append(kwargs["call"].sliding_window)  # the AttentionCall
        return xla(*args, **kwargs)

    spy_impl = Implementation("flash_attention", Platform.XLA, Backend.ANY, 1000, spy)
    monkeypatch.setitem(kernel_registry._impls, "flash_attention", [spy_impl])
    q, k, v = qkv()
    out = flash_attention(q, k, v, causal=True, sliding_window=(2**40, 2**31 - 1), platform="xla")
    assert seen == [(2 * S, 2 * S)]
    assert_close(out, reference(q, k, v, causal=True))


def test_return_lse_matches_reference_and_merges():
    """`return_lse`: the rows' log-sum-exp (sinks included) with its gradient; two halves of the keys merge to
    the whole; the Mosaic platform declines it; the pair shards like the output."""
    from ejkernel.modules import merge_attention_states

    q, k, v = qkv(kv_len=2 * S)
    sinks = randn((H,))
    both = lambda fn: lambda q, k, v, s: jnp.concatenate([x.astype(jnp.float32).ravel() for x in fn(q, k, v, s)])
    ours = both(lambda q, k, v, s: flash_attention(q, k, v, None, None, None, s, return_lse=True, cfg=SMALL))
    ref = both(lambda q, k, v, s: reference(q, k, v, softmax_aux=s, return_lse=True))
    check_forward_and_grads(ours, ref, [q, k, v, sinks], (0, 1, 2, 3), jnp.float32)

    halves = [flash_attention(q, k[:, a:b], v[:, a:b], return_lse=True) for a, b in ((0, 27), (27, 2 * S))]
    merged = merge_attention_states(*halves[0], *halves[1])
    for got, expected in zip(merged, flash_attention(q, k, v, return_lse=True), strict=True):
        assert_close(got, expected)
    from ejkernel import kernel_registry
    from ejkernel.modules import FlashAttention

    pallas = next(i for i in kernel_registry.list_implementations("flash_attention") if i.platform == "pallas")
    with pytest.raises(NotImplementedError, match="return_lse"):  # before the kernel is reached
        FlashAttention().call_impl(pallas, (q, k, v, None, None), {"return_lse": True}, SMALL)
    mesh = jax.make_mesh((2,), ("x",), devices=jax.devices()[:2])
    heads = P(None, None, "x")
    sharded = flash_attention(q, k, v, return_lse=True, mesh=mesh, in_specs=(heads,) * 3, out_specs=(heads, heads))
    for got, expected in zip(sharded, reference(q, k, v, return_lse=True), strict=True):
        assert_close(got, expected)


@pytest.mark.parametrize(
    ("backend", "mode", "window", "seq", "head_dim", "platform"),
    [
        ("gpu", "forward", (16, 0), S, D, "pallas"),  # windowed calls on a GPU: the Mosaic GPU kernels first
        ("gpu", "train", (16, 0), S, D, "pallas"),
        ("gpu", "forward", None, 1024, 128, "pallas"),  # head-dim-128 forwards of 1024 queries and keys or more
        ("gpu", "forward", None, 512, 128, "auto"),
        ("gpu", "forward", None, (1, 8192), 128, "auto"),  # a decode step over a long cache: not measured
        ("gpu", "train", None, 2048, 128, "pallas"),  # head-dim-128 training over 2048 keys or fewer
        ("gpu", "train", None, 4096, 128, "auto"),
        ("gpu", "forward", None, 1024, 64, "triton"),  # head dim 64: Triton's forward, the Mosaic GPU training pair
        ("gpu", "train", None, 4096, 64, "pallas"),  # causal, as every row here
        ("gpu", "train", None, 8192, 64, "auto"),
        ("gpu", "forward", None, 1024, D, "auto"),
        ("cpu", "forward", (16, 0), 1024, 128, "auto"),
    ],
)
def test_heuristic_prefers_the_kernel_measured_ahead_of_cudnn(
    monkeypatch, backend, mode, window, seq, head_dim, platform
):
    import importlib

    from ejkernel.kernels._common.attention_call import AttentionCall
    from ejkernel.modules import FlashAttention
    from ejkernel.ops import Invocation

    module = importlib.import_module("ejkernel.modules.operations.flash_attention")  # not the function
    monkeypatch.setattr(module, "current_backend", lambda: module.Backend(backend))
    q_len, kv_len = seq if isinstance(seq, tuple) else (seq, seq)
    shapes = [(1, q_len, H, head_dim), (1, kv_len, HKV, head_dim), (1, kv_len, HKV, head_dim)]
    q, k, v = (jax.ShapeDtypeStruct(shape, jnp.float32) for shape in shapes)
    call = AttentionCall.of(q, causal=True, sliding_window=window)
    inv = Invocation("flash_attention", (q, k, v, None, None), {"call": call}, "auto", mode)
    assert FlashAttention().heuristic_cfg(inv).platform == platform
    if head_dim == 64:  # a kind of call not timed at head dim 64 (here soft-capped) keeps `auto`'s order
        capped = AttentionCall.of(q, causal=True, sliding_window=window, logits_soft_cap=30.0)
        inv = Invocation("flash_attention", (q, k, v, None, None), {"call": capped}, "auto", mode)
        assert FlashAttention().heuristic_cfg(inv).platform == "auto"
        # upstream's raw keyword options passed to the executor with q, k, v alone route alike
        raw = Invocation("flash_attention", (q, k, v), {"causal": True, "sliding_window": window}, "auto", mode)
        assert FlashAttention().heuristic_cfg(raw).platform == platform
