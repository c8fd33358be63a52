"""`multi_latent_ragged_page_attention(_v2)` (XLA) against the float32 reference.

Every case mixes decode, prefill and empty requests, starts `query_start_loc` past 0 (tokens before
and after the processed ones) and leaves one sequence past `distribution[2]`. Unused block table
entries of even rows repeat a page the row itself uses (upstream's XLA path lost the new tokens
then), those of odd rows point off the cache (-1, past the last page): neither may matter. Shapes
are tiny, with L and R not multiples of 128, so the cache rows are padded.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ejkernel.kernels._common.paged_attention.kv_cache import kv_packing
from ejkernel.modules import (
    MultiLatentRaggedPageAttentionConfig,
    MultiLatentRaggedPageAttentionV2Config,
    multi_latent_ragged_page_attention,
    multi_latent_ragged_page_attention_v2,
)
from ejkernel.ops import ConfigBase, FwdParams
from ejkernel.reference.multi_latent_ragged_page_attention import multi_latent_ragged_page_attention_reference
from ejkernel.registry import kernel_registry
from harness import assert_close, randn

LATENT, ROPE, HEADS, PAGE = 64, 32, 2, 4
Q_LENS = (1, 6, 0, 3, 2)  # decode, prefill, empty, mixed (prefill onto a context), ignored (past distribution[2])
KV_LENS = (7, 6, 5, 9, 4)
OFFSET, TAIL = 2, 3  # tokens before query_start_loc[0] and after the last processed token


def make_case(
    cache_dtype=jnp.float32, dtype=jnp.float32, q_lens=Q_LENS, kv_lens=KV_LENS, pages_per_seq=4, *, heads=HEADS,
    page=PAGE, latent=LATENT, rope=ROPE,
):  # fmt: skip
    """Positional arguments of one call, with `distribution = [0, 0, N - 1]` (the last sequence ignored)."""
    packing = kv_packing(cache_dtype)
    num_seqs = len(kv_lens)
    num_pages = num_seqs * pages_per_seq + 2
    order = iter(np.random.default_rng(len(q_lens)).permutation(num_pages).tolist())
    tables = np.zeros((num_seqs, pages_per_seq), np.int32)
    for s, kv_len in enumerate(kv_lens):
        used = -(-kv_len // page)
        tables[s, :used] = [next(order) for _ in range(used)]
        tables[s, used:] = tables[s, 0] if s % 2 == 0 else [-1, num_pages + 7][s % 4 // 2]  # live page / off the cache
    num_tokens = OFFSET + sum(q_lens) + TAIL
    loc = OFFSET + np.concatenate([[0], np.cumsum(q_lens)])
    width = -(-latent // 128) * 128 + -(-rope // 128) * 128
    return [
        randn((num_tokens, heads, latent), dtype),
        randn((num_tokens, heads, rope), dtype),
        randn((num_tokens, latent), dtype),
        randn((num_tokens, rope), dtype),
        randn((num_pages, page // packing, packing, width), cache_dtype),
        jnp.asarray(kv_lens, jnp.int32),
        jnp.asarray(tables.reshape(-1)),
        jnp.asarray(loc, jnp.int32),
        jnp.asarray([0, 0, num_seqs - 1], jnp.int32),
    ]


def check(args, options, *, op=multi_latent_ragged_page_attention, cfg=None, tol=None):
    """The public function (platform="xla") against the reference: the output, and the cache exactly."""
    out, cache = op(*args, platform="xla", cfg=cfg, **options)
    ref_out, ref_cache = multi_latent_ragged_page_attention_reference(*args, **options)
    assert out.dtype == args[0].dtype and cache.dtype == args[4].dtype and cache.shape == args[4].shape
    assert_close(out, ref_out, args[4].dtype, tol)
    assert bool(jnp.array_equal(cache, ref_cache)), "the cache holds exactly the reference's writes"
    return out, cache


CASES = {
    "f32 cache, window, soft cap": (jnp.float32, {"sliding_window": 3, "logits_soft_cap": 2.0}),
    "bf16 cache, q/k/v scales": (
        jnp.bfloat16,
        {"q_scale": 0.3, "k_scale": 1.5, "v_scale": 2.0, "softmax_scale": 0.2, "logits_soft_cap": -3.0},
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_matches_reference(case):
    cache_dtype, options = CASES[case]
    args = make_case(cache_dtype, cache_dtype)
    out, cache = check(args, options)
    loc = np.asarray(args[7])
    assert bool(jnp.all(out[: loc[0]] == 0)) and bool(jnp.all(out[loc[-2] :] == 0)), "unprocessed tokens give 0"
    # Token 0 of the prefill sequence (s = 1) sits at position 0 of its first page: `[c, 0…, r, 0…]`.
    packing = kv_packing(cache_dtype)
    row = cache[int(args[6][4]), 0, 0]
    expected = jnp.zeros_like(row).at[:LATENT].set(args[2][loc[1]].astype(cache_dtype))
    expected = expected.at[128 : 128 + ROPE].set(args[3][loc[1]].astype(cache_dtype))
    assert packing == (1 if cache_dtype == jnp.float32 else 2) and bool(jnp.array_equal(row, expected))


def test_only_the_new_rows_change():
    """Pages of the ignored sequence, spare pages and every untouched position keep their bits."""
    args = make_case()
    _, cache = check(args, {})
    changed = np.argwhere(np.asarray(jnp.any(cache != args[4], axis=-1)).reshape(cache.shape[0], -1))
    tables, lens, loc = np.asarray(args[6]).reshape(len(KV_LENS), -1), np.asarray(args[5]), np.asarray(args[7])
    written = set()
    for s in range(len(KV_LENS) - 1):
        for pos in range(lens[s] - (loc[s + 1] - loc[s]), lens[s]):
            written.add((int(tables[s, pos // PAGE]), pos % PAGE))
    assert {tuple(int(i) for i in x) for x in changed} <= written


def test_jit_traced_indices_distribution_and_block_sizes():
    """Under jit with traced index arrays and the cache donated: identical bits for every `[i, j, k]` split of
    the processed sequences (scheduling hints), and the same result for every block size (knobs)."""
    args = make_case()
    ref_out, ref_cache = multi_latent_ragged_page_attention_reference(*args)
    call = jax.jit(
        lambda *a, cfg: multi_latent_ragged_page_attention(*a, platform="xla", cfg=cfg),
        static_argnames="cfg",
        donate_argnums=4,
    )
    k = len(KV_LENS) - 1
    runs = [((i, j), None) for i, j in ((0, 0), (1, 1), (1, 3), (k, k))]
    runs += [
        ((0, 0), MultiLatentRaggedPageAttentionConfig(num_queries_per_block=3, num_kv_pages_per_block=5)),
        ((0, 0), MultiLatentRaggedPageAttentionConfig(num_queries_per_block=1, num_kv_pages_per_block=1)),
    ]
    results = []
    for split, cfg in runs:
        cache = jnp.array(args[4])
        out, new_cache = call(*args[:4], cache, *args[5:8], jnp.asarray([*split, k], jnp.int32), cfg=cfg)
        assert cache.is_deleted(), "the donated cache is consumed"
        assert_close(out, ref_out)
        assert bool(jnp.array_equal(new_cache, ref_cache))
        results.append(out)
    assert all(bool(jnp.array_equal(out, results[0])) for out in results[1:4]), "distribution: identical bits"
    for out in results[4:]:
        assert_close(out, results[0], tol=1e-6)


def test_v2_per_case_block_sizes():
    cfg = MultiLatentRaggedPageAttentionV2Config(num_queries_per_block=[4, 8, 2], num_kv_pages_per_block=(1, 2, 3))
    assert cfg.num_queries_per_block == (4, 8, 2) and hash(cfg)
    assert ConfigBase.from_json(cfg.to_json()) == cfg
    check(make_case(), {"sliding_window": 5}, op=multi_latent_ragged_page_attention_v2, cfg=cfg)
    with pytest.raises(ValueError, match=r"num_queries_per_block must be an int or a \(decode, prefill, mixed\)"):
        MultiLatentRaggedPageAttentionV2Config(num_queries_per_block=(4, 8))
    with pytest.raises(ValueError, match="num_kv_pages_per_block must be a positive int, got 0"):
        MultiLatentRaggedPageAttentionV2Config(num_kv_pages_per_block=[1, 0, 2])


def test_configs():
    fields = [f.name for f in dataclasses.fields(MultiLatentRaggedPageAttentionConfig)]
    own = ["chunk_prefill_size", "num_kv_pages_per_block", "num_queries_per_block", "vmem_limit_bytes"]
    upstream = [*own, "num_warps", "num_stages"]  # upstream's fields, in its order; then the GPU tilings
    assert fields[-8:] == [*upstream, "triton_tiling", "mosaic_tiling"] and {"platform", "backend"} <= set(fields)
    assert [f.name for f in dataclasses.fields(MultiLatentRaggedPageAttentionV2Config)] == fields
    cfg = MultiLatentRaggedPageAttentionConfig(num_queries_per_block=10, vmem_limit_bytes=1 << 20)
    assert (cfg.get("num_queries_per_block"), cfg.get("num_warps"), cfg.get("missing", 7)) == (10, 4, 7)
    assert ConfigBase.from_json(cfg.to_json()) == cfg
    for bad in (
        {"chunk_prefill_size": 0},
        {"num_queries_per_block": -1},
        {"num_kv_pages_per_block": (1, 2, 3)},  # per case: v2 only
        {"num_stages": 0},
        {"fwd_params": FwdParams(block_q=16)},
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            MultiLatentRaggedPageAttentionConfig(**bad)
    for name in ("multi_latent_ragged_page_attention", "multi_latent_ragged_page_attention_v2"):
        assert kernel_registry.get(name, "xla").__name__ == "multi_latent_ragged_page_attention_xla"


def test_grad_with_respect_to_the_queries():
    """Inference op, but `jax.grad` of a surrounding model through it works and is the reference's."""
    args = make_case(q_lens=(1, 3, 0, 2, 1))
    cotangent = randn(args[0].shape)

    def loss(op, q_nope, q_pe):
        out = op(q_nope, q_pe, *args[2:])[0]
        return jnp.sum(out * cotangent)

    public = lambda *a: multi_latent_ragged_page_attention(*a, platform="xla", sliding_window=4)
    grads = jax.jit(jax.grad(lambda *q: loss(public, *q), argnums=(0, 1)))(args[0], args[1])
    ref = lambda *a: multi_latent_ragged_page_attention_reference(*a, sliding_window=4)
    ref_grads = jax.grad(lambda *q: loss(ref, *q), argnums=(0, 1))(args[0], args[1])
    for g, rg in zip(grads, ref_grads, strict=True):
        assert_close(g, rg, tol=1e-4)


@pytest.mark.lowest
def test_easydel_call_form():
    """EasyDeL's call (`operations/kernels/multi_latent_ragged_page_attention.py:613`): a 2-D page table
    reshaped by the caller, every option by keyword, its config; `[T, 1, L]` keys squeezed."""
    args = make_case(jnp.bfloat16, jnp.bfloat16)
    q_nope, q_pe, kv, k_pe, kv_pages, context_lens, tables, query_start_loc, distribution = args
    pages_tables = tables.reshape(len(KV_LENS), -1)
    cfg = MultiLatentRaggedPageAttentionConfig(
        chunk_prefill_size=8, num_kv_pages_per_block=2, num_queries_per_block=5, vmem_limit_bytes=None, platform="auto"
    )
    options = dict(softmax_scale=0.15, logits_soft_cap=None, sliding_window=None, q_scale=None, k_scale=None)
    out, cache = multi_latent_ragged_page_attention(
        q_nope, q_pe, kv, k_pe, kv_pages, context_lens, pages_tables.reshape(-1), query_start_loc, distribution,
        **options, v_scale=None, cfg=cfg, mask_value=-0.7 * float(jnp.finfo(jnp.float32).max),
    )  # fmt: skip
    ref_out, ref_cache = multi_latent_ragged_page_attention_reference(*args, **options)
    assert_close(out, ref_out, jnp.bfloat16)
    assert bool(jnp.array_equal(cache, ref_cache))
    out_2d, cache_2d = multi_latent_ragged_page_attention_v2(
        q_nope, q_pe, kv[:, None], k_pe, kv_pages, context_lens, pages_tables, query_start_loc, distribution,
        **options, cfg=MultiLatentRaggedPageAttentionV2Config(num_queries_per_block=5, num_kv_pages_per_block=2),
    )  # fmt: skip
    assert bool(jnp.array_equal(out_2d, out)) and bool(jnp.array_equal(cache_2d, cache))


@pytest.mark.lowest
def test_heads_split_over_a_mesh():
    """`mesh=`: the query heads split over 2 devices, the latents, cache and tables whole on each; a split
    cache is refused by name."""
    from jax.sharding import PartitionSpec as P

    args = make_case()
    mesh = jax.make_mesh((2,), ("tp",), devices=jax.devices()[:2])
    heads, whole = P(None, "tp"), P()
    specs = (heads, heads) + (whole,) * 7
    out, cache = multi_latent_ragged_page_attention(*args, mesh=mesh, in_specs=specs, out_specs=(heads, whole))
    ref_out, ref_cache = multi_latent_ragged_page_attention_reference(*args)
    assert_close(out, ref_out)
    assert bool(jnp.array_equal(cache, ref_cache))
    with pytest.raises(ValueError, match="kv_cache's axis 0"):
        split_cache = (heads, heads, whole, whole, P("tp")) + (whole,) * 4
        multi_latent_ragged_page_attention(*args, mesh=mesh, in_specs=split_cache, out_specs=(heads, whole))


def _bad(index, value=None, **options):
    """A call with argument `index` replaced by `value(args)` (None: unchanged) and these options."""
    return index, value, options


BAD = {
    "queries rank": _bad(0, lambda a: a[0][0], match="queries_nope must be 3-D"),
    "keys rank": _bad(3, lambda a: a[3][:, None, None], match="keys_pe must be 2-D"),
    "keys heads": _bad(2, lambda a: jnp.stack([a[2], a[2]], 1), match="keys_values must be 2-D"),
    "cache rank": _bad(4, lambda a: a[4][0], match="kv_cache must be 4-D"),
    "token counts": _bad(2, lambda a: a[2][1:], match="keys_values must have queries_nope's"),
    "latent dims": _bad(2, lambda a: a[2][:, 1:], match="keys_values' last dim must equal queries_nope's"),
    "rope dims": _bad(3, lambda a: a[3][:, 1:], match="keys_pe's last dim must equal queries_pe's"),
    "cache width": _bad(
        4, lambda a: a[4][..., :128], match=r"kv_cache's last dim must be a128\(L\) \+ a128\(R\) = 256"
    ),
    "cache packing": _bad(4, lambda a: a[4].reshape(a[4].shape[0], -1, 2, 256), match="packing axis"),
    "lengths dtype": _bad(5, lambda a: a[5].astype(jnp.int16), match="kv_lens must be int32, got int16"),
    "tables 3-D": _bad(6, lambda a: a[6].reshape(1, -1, 1), match="block_tables must be 1-D"),
    "tables rows": _bad(6, lambda a: a[6].reshape(4, -1), match="block_tables as"),
    "distribution dtype": _bad(8, lambda a: a[8].astype(jnp.uint32), match="distribution must be int32"),
    "distribution shape": _bad(8, lambda a: a[8][:2], match=r"distribution must have shape \(3,\)"),
    "tables length": _bad(6, lambda a: a[6][1:], match="len\\(block_tables\\) must be a multiple of N"),
    "query_start_loc length": _bad(7, lambda a: a[7][1:], match="query_start_loc must have N \\+ 1"),
    "window": _bad(0, sliding_window=0, match="sliding_window must be a positive int"),
    "soft cap": _bad(0, logits_soft_cap=0.0, match="logits_soft_cap must be a non-zero number"),
    "q_scale": _bad(0, q_scale=0.0, match="q_scale must be positive"),
}


@pytest.mark.lowest
@pytest.mark.parametrize("name", BAD)
def test_bad_inputs(name):
    index, value, options = BAD[name]
    args = make_case(q_lens=(1, 1, 0, 1, 1))
    if value is not None:
        args[index] = value(args)
    with pytest.raises(ValueError, match=options.pop("match")):
        multi_latent_ragged_page_attention(*args, **options)
