"""The six serving ops through their public functions (XLA) against the float32 reference.

Forward and the gradient of every float input a model could train (queries, caches, sinks, biases),
on shuffled page tables where sequences share prefix pages, with the edge cases of issue 23: empty
sequences, contexts of 0 and of exact page multiples, ignored sequences (past `num_seqs` /
`distribution[2]`), page size 1, a single token. Small tiles (`SMALL`) make each call walk several
query tiles and key steps.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from paged_cases import CASES, FLOAT_ARGS, OPS, jitted_reference, output_of, unified_case

import ejkernel.modules as modules
from ejkernel.modules.operations.page_attention import PagedAttentionConfig
from ejkernel.ops import FwdParams, Invocation
from ejkernel.reference import paged_attention as reference
from ejkernel.utils import make_dummy_rpa_inputs
from harness import assert_close, check_forward_and_grads, randn

SMALL = PagedAttentionConfig(fwd_params=FwdParams(block_q=4, block_k=8))


def _config(op, cfg):
    """`cfg` as the op's own config class (the public functions take only their own)."""
    name = "".join(part.capitalize() for part in op.split("_")) + "Config"
    return None if cfg is None else getattr(modules, name)(fwd_params=cfg.fwd_params, num_splits=cfg.num_splits)


def check_op(op, args, options, *, cfg=SMALL, dtype=jnp.float32, argnums=None):
    """Public function (jitted, XLA) vs reference: forward and the VJP of the float arguments."""
    public = functools.partial(getattr(modules, op), platform="xla", cfg=_config(op, cfg), **options)
    argnums = tuple(i for i in (argnums or FLOAT_ARGS[op]) if args[i] is not None)
    fn = jax.jit(lambda *a: output_of(op)(public(*a)))
    check_forward_and_grads(fn, jitted_reference(op, options), args, argnums, dtype)


# Each op once, forward and every gradient, with most of its features on at once.
FULL = {
    "page_attention": ({}, {"sliding_window": 19, "attn_logits_soft_cap": 2.0}),
    "prefill_page_attention": ({"chunk": 13, "context": 32}, {"sliding_window": 9}),  # context: 4 whole pages
    "ragged_page_attention_v2": ({}, {"sliding_window": 6, "logits_soft_cap": 3.0}),  # 1 ignored sequence
    "ragged_page_attention_v3": (
        {"mixed": (1, 2, 4)},  # 1 decode, 1 prefill, 2 mixed, 1 ignored sequence
        {"q_scale": 0.5, "k_scale": 1.5, "v_scale": 2.0, "sliding_window": 7, "softmax_scale": None},
    ),
    "ragged_decode_attention": ({"rank": 4}, {"sliding_window": (5, 2), "logits_soft_cap": 1.5}),
    "unified_attention": ({}, {"logits_soft_cap": 2.0}),  # ALiBi, query-query bias, sinks
}


@pytest.mark.lowest
@pytest.mark.parametrize("op", OPS)
def test_matches_reference(op):
    case, options = FULL[op]
    args, base = CASES[op](np.random.default_rng(OPS.index(op)), **case)
    check_op(op, args, {**base, **options})


FORWARD = {
    "prefill chunk == context": ("prefill_page_attention", {"chunk": 16, "context": 16}, {}, SMALL),
    "v2 bf16, bf16 compute": (
        "ragged_page_attention_v2",
        {"dtype": jnp.bfloat16},
        {"compute_dtype": jnp.bfloat16},
        None,
    ),
    "decode int window, defaults": ("ragged_decode_attention", {}, {"sliding_window": 4}, None),
    "unified non-causal, page size 1": ("unified_attention", {"page": 1, "qq": False}, {"causal": False}, SMALL),
    "unified single token": ("unified_attention", {"q_lens": (1,), "kv_lens": (1,), "qq": False}, {}, None),
}


@pytest.mark.parametrize("feature", FORWARD)
def test_forward_edge_cases(feature):
    op, case, options, cfg = FORWARD[feature]
    args, base = CASES[op](np.random.default_rng(len(feature)), **case)
    options = {**base, **options}
    out = output_of(op)(getattr(modules, op)(*args, cfg=_config(op, cfg), **options))  # eager: values checked too
    assert_close(out, jitted_reference(op, options)(*args), out.dtype)


def test_v3_writes_the_cache_in_place_under_donation():
    args, _ = CASES["ragged_page_attention_v3"](np.random.default_rng(3), mixed=(1, 2, 4))
    _, expected = jax.jit(lambda *a: reference.ragged_page_attention_v3_reference(*args[:3], a[0], *args[4:]))(args[3])
    call = jax.jit(lambda *a: modules.ragged_page_attention_v3(*a, platform="xla"), donate_argnums=3)
    cache = args[3]
    pointer = cache.unsafe_buffer_pointer()
    out, new_cache = call(*args)
    assert bool(jnp.all(new_cache == expected)), "the cache holds exactly the new keys/values (sequence 4: none)"
    assert cache.is_deleted() and new_cache.unsafe_buffer_pointer() == pointer, "the donated cache is reused"
    assert bool(jnp.all(out[int(args[6][4]) :] == 0)), "the ignored sequence's query rows are 0"


def test_v3_q_scale_saturates_to_a_float8_cache():
    """Queries quantised to a float8 cache saturate (no NaN past its range) and the output keeps their dtype."""
    args, _ = CASES["ragged_page_attention_v3"](np.random.default_rng(8), dtype=jnp.float8_e4m3fn)
    args[0] = randn(args[0].shape, jnp.bfloat16, scale=100.0)  # q / q_scale reaches past float8's 448
    options = {"q_scale": 0.1, "k_scale": 0.02}
    out, _ = modules.ragged_page_attention_v3(*args, platform="xla", **options)
    assert out.dtype == jnp.bfloat16
    assert_close(out, jitted_reference("ragged_page_attention_v3", options)(*args))


def test_empty_sequences_give_zeros_and_zero_gradients():
    q, kc, vc, lens, tables = CASES["page_attention"](np.random.default_rng(5), kv_lens=(0, 0))[0]
    loss = jax.jit(jax.value_and_grad(lambda q: jnp.sum(modules.page_attention(q, kc, vc, lens, tables) ** 2)))
    out, grad = loss(q)
    assert float(out) == 0.0 and bool(jnp.all(grad == 0))


@pytest.mark.lowest
def test_vmap_and_sharded_heads():
    """vmap over two independent batches; unified_attention with its heads split over 2 devices."""
    cases = [CASES["ragged_decode_attention"](np.random.default_rng(s), batch=2)[0] for s in (1, 2)]
    stacked = [jnp.stack(xs) for xs in zip(*cases, strict=True)]
    out = jax.jit(jax.vmap(modules.ragged_decode_attention))(*stacked)
    for b, args in enumerate(cases):
        assert_close(out[b], jitted_reference("ragged_decode_attention", {})(*args))

    args, _ = unified_case(np.random.default_rng(11), heads=8, kv_heads=2)
    heads, cache, per_head = P(None, "x"), P(None, None, "x"), P("x")
    specs = (heads, cache, cache, P(), P(), P(), per_head, None, per_head)  # upstream style: None where not passed
    out = modules.unified_attention(*args, mesh=jax.make_mesh((2,), ("x",)), in_specs=specs, out_specs=heads)
    assert_close(out, jitted_reference("unified_attention", {})(*args))


def test_make_dummy_rpa_inputs():
    inputs = make_dummy_rpa_inputs(total_q=10, num_seqs=4, decode_prefill_mixed=(2, 3, 4), kv_dtype=jnp.bfloat16)
    assert inputs["_meta"]["q_lens"] == [1, 1, 4, 4] and inputs["kv_cache"].shape[2:] == (2, 2, 128)
    with pytest.raises(ValueError, match="total_q"):
        make_dummy_rpa_inputs(total_q=2, num_seqs=4)
    with pytest.raises(ValueError, match="page_size"):
        make_dummy_rpa_inputs(page_size=3, kv_dtype=jnp.bfloat16)


def _bad_calls():
    rng = np.random.default_rng(0)
    pa, _ = CASES["page_attention"](rng)
    v2, _ = CASES["ragged_page_attention_v2"](rng)
    v3, _ = CASES["ragged_page_attention_v3"](rng)
    un, _ = unified_case(rng)
    dec, _ = CASES["ragged_decode_attention"](rng)
    set_ = lambda args, i, x: [x if j == i else a for j, a in enumerate(args)]
    tables = np.asarray(pa[4]).copy()
    tables[0, 1] = 10_000
    return {
        "page index out of range": (lambda: modules.page_attention(*set_(pa, 4, jnp.asarray(tables))), "block_tables"),
        "context longer than its table": (
            lambda: modules.page_attention(*set_(pa, 3, pa[3].at[0].set(1000))),
            "context_lens",
        ),
        "integer query": (lambda: modules.page_attention(*set_(pa, 0, pa[0].astype(jnp.int32))), "query"),
        "heads not a multiple": (lambda: modules.page_attention(*set_(pa, 0, randn((4, 3, 16)))), "multiple"),
        "mixed cache dtypes": (
            lambda: modules.page_attention(*set_(pa, 2, pa[2].astype(jnp.bfloat16))),
            "value_cache",
        ),
        "mask value that would weight masked keys": (lambda: modules.page_attention(*pa, mask_value=0.0), "mask_value"),
        "zero window": (lambda: modules.page_attention(*pa, sliding_window=0), "sliding_window"),
        "negative soft cap": (lambda: modules.unified_attention(*un, logits_soft_cap=-1.0), "logits_soft_cap"),
        "more queries than keys": (
            lambda: modules.unified_attention(*set_(un, 3, un[3].at[1].set(2))),
            "queries",
        ),
        "query_start_loc past the tokens": (
            lambda: modules.unified_attention(*set_(un, 5, un[5].at[-1].add(5))),
            "query_start_loc",
        ),
        "num_seqs past the sequences": (lambda: modules.ragged_page_attention_v2(*set_(v2, 5, 9)), "num_seqs"),
        "num_seqs of two values": (
            lambda: modules.ragged_page_attention_v2(*set_(v2, 5, jnp.array([2, 2], jnp.int32))),
            "num_seqs must be one integer",
        ),
        "odd combined heads": (lambda: modules.ragged_page_attention_v2(*set_(v2, 1, v2[1][:, :, :3])), "interleave"),
        "integer compute dtype": (
            lambda: modules.ragged_page_attention_v2(*v2, compute_dtype=jnp.int32),
            "compute_dtype",
        ),
        "v3 cache of the wrong layout": (
            lambda: modules.ragged_page_attention_v3(*set_(v3, 3, v3[3][..., :64])),
            "kv_cache",
        ),
        "v3 decode sequence with 2 tokens": (
            lambda: modules.ragged_page_attention_v3(*set_(v3, 7, jnp.array([3, 3, 5], jnp.int32))),
            "distribution",
        ),
        "v3 sinks not per head": (lambda: modules.ragged_page_attention_v3(*set_(v3, 8, randn((3,)))), "softmax_aux"),
        "decode start past end": (
            lambda: modules.ragged_decode_attention(*set_(dec, 3, dec[4] + 1)),
            "sequence_start",
        ),
        "decode window pair with a negative": (
            lambda: modules.ragged_decode_attention(*dec, sliding_window=(3, -1)),
            "sliding_window",
        ),
        "mesh without specs": (lambda: modules.unified_attention(*un, mesh=jax.make_mesh((1,), ("x",))), "in_specs"),
    }


BAD = _bad_calls()


@pytest.mark.lowest
@pytest.mark.parametrize("case", BAD)
def test_bad_input_names_the_argument(case):
    call, words = BAD[case]
    with pytest.raises((TypeError, ValueError), match=words):
        call()


def test_page_index_off_the_cache_under_jit_stays_finite():
    """Under jit a page index off the cache holds no key (documented): the output stays finite."""
    rng = np.random.default_rng(1)
    q, kc, vc, lens, tables = CASES["page_attention"](rng)[0]
    tables = tables.at[0, 0].set(10_000)
    out = jax.jit(modules.page_attention)(q, kc, vc, lens, tables)
    assert bool(jnp.all(jnp.isfinite(out)))


@pytest.mark.parametrize("op", OPS)
def test_autotuning_stand_ins_for_traced_lengths_give_every_sequence_work(op):
    """Under jit the lengths and tables are tracers: the tuner times the op on stand-ins (`busy_integers`) that
    are valid inputs and leave no query row idle (the generic zeros would time an empty call)."""
    args, options = CASES[op](np.random.default_rng(0))
    if op == "ragged_page_attention_v2":
        args[5] = jnp.asarray([args[2].shape[0]], jnp.int32)  # num_seqs traced too
    kernel = getattr(modules, "".join(part.capitalize() for part in op.split("_")))()
    captured = {}

    def trace(*a):
        with jax.ensure_compile_time_eval():
            captured["args"] = kernel.tuning_inputs(Invocation(op, a, {}, "xla"))[0]
        return jnp.zeros(())

    jax.jit(trace)(*args)
    busy = list(captured["args"])
    out = output_of(op)(getattr(modules, op)(*busy, platform="xla", **options))  # the public checks pass
    assert_close(out, jitted_reference(op, options)(*busy), jnp.float32)
    assert (jnp.abs(out).reshape(out.shape[0], -1).max(axis=1) > 0).all()


@pytest.mark.parametrize("pairs", [0, 2**22], ids=["binary-search", "compare-all"])
def test_sorted_position_is_searchsorted(monkeypatch, pairs):
    """Both ways of finding each token's sequence (`sorted_position`) give `searchsorted`'s answer, ties,
    empty sequences and values past the last bound included."""
    from ejkernel.kernels._common import search as common

    monkeypatch.setattr(common, "COMPARE_ALL_PAIRS", pairs)
    bounds = jnp.asarray([0, 3, 3, 7, 12], jnp.int32)
    values = jnp.arange(15, dtype=jnp.int32)
    expected = np.searchsorted(np.asarray(bounds), np.asarray(values), side="right")
    np.testing.assert_array_equal(common.sorted_position(bounds, values), expected)  # (eager: no trace cache)
