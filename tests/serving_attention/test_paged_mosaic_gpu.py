"""The Mosaic GPU prefill tiles of the serving ops: interpret mode against the reference, CUDA lowering, declines,
GPU suite.

Mosaic GPU interpret mode and the Pallas-Triton interpreter cannot run in one program, so the interpret cases run
the core's two passes apart (`triton_pass` interpreted by Pallas, `tiles_pass` in Mosaic GPU interpret mode with
races detected, in a fresh process), as the core chains them. The gradient is the plain-JAX core's
(the GPU suite checks it through the op).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from paged_cases import cumulative, jitted_reference, output_of, page_tables, unified_case

import ejkernel.modules as modules
from ejkernel.benchmarks.serving_attention import DIM, MIXED, make_problem
from ejkernel.kernels._common.device import is_hopper
from ejkernel.kernels._common.paged_attention.adapters import page_attention_batch, ragged_v3_batch, unified_batch
from ejkernel.kernels._common.paged_attention.jax_core import paged_attention_core
from ejkernel.kernels._common.paged_attention.kv_cache import v3_cache_shape
from ejkernel.kernels._pallas.gpu.paged_attention._interface import (
    CORE_ALONE,
    CORE_THEN_TILES,
    LONG_QUERIES,
    SHORT_THEN_TILES,
    paged_attention_mosaic_gpu_core,
    plan,
    route,
    tiles_pass,
    triton_pass,
)
from harness import assert_close, randn
from mosaic_gpu_interpret import check_in_fresh_process, interpret_mode

pytestmark = pytest.mark.filterwarnings("ignore:The Pallas Triton")


def _unified(q_lens, kv_lens, *, heads, kv_heads, dim, page, outside=(), seed=0):
    """`unified_attention` arguments without biases or sinks (which the prefill tiles decline); `outside`: (sequence,
    page) table entries set to pages that are not in the cache."""
    args, _ = unified_case(
        np.random.default_rng(seed), q_lens=q_lens, kv_lens=kv_lens, heads=heads, kv_heads=kv_heads, dim=dim,
        page=page, dtype=jnp.bfloat16, alibi=False, qq=False, sinks=False,
    )  # fmt: skip
    tables = np.array(args[4])
    for n, (s, p) in enumerate(outside):
        tables[s, p] = -1 if n % 2 else 1 << 20
    args[4] = jnp.asarray(tables)
    return args


def _v3(q_lens, kv_lens, *, heads, kv_heads, dim, page, seed=0):
    """`ragged_page_attention_v3` arguments (its packed cache: K and V of a head interleaved) and options."""
    rng = np.random.default_rng(seed)
    width = -(-max(kv_lens) // page) + 1
    num_pages = sum(-(-n // page) for n in kv_lens) + 2
    tables = page_tables(rng, kv_lens, page, width, num_pages).reshape(-1)
    tokens = sum(q_lens)
    cache = randn(v3_cache_shape(num_pages, page, kv_heads, dim, jnp.bfloat16), jnp.bfloat16)
    new = [randn((tokens, kv_heads, dim), jnp.bfloat16) for _ in range(2)]
    distribution = jnp.asarray([q_lens.count(1), len(q_lens), len(q_lens)], jnp.int32)
    lens = jnp.asarray(kv_lens, jnp.int32)
    args = [randn((tokens, heads, dim), jnp.bfloat16), *new, cache, lens, jnp.asarray(tables), cumulative(q_lens)]
    return [*args, distribution], {"softmax_scale": dim**-0.5}


# A 140-query chunk after 150 keys of context (two tiles, the second partly empty beside the next sequence's rows:
# in place, the default, it stores only its own), a 40-query chunk after 170 at the end of the tokens (its tile reads
# past them), decode and short sequences beside them (the Triton pass), an empty sequence, one with more queries than
# keys (its first queries see nothing), and pages outside the cache inside two chunks' spans.
INTERPRET_CASES = {
    "gqa-chunks-decode-empty-pages-outside-d128": (
        "unified_attention",
        dict(
            q_lens=(1, 140, 0, 2, 12, 40),
            kv_lens=(40, 290, 0, 9, 7, 210),
            heads=2,
            kv_heads=1,
            dim=128,
            page=16,
            outside=((5, 3), (5, 6), (1, 17)),
        ),
        {},
    ),
    # v3's packed cache (rows of K and V of every kv head, a head's K and V interleaved); pages of 32 keys (4 copies
    # a tile); two tiles a CTA (4 tiles of 6 slots: CTA 0 runs two, the others one and one of nothing)
    "v3-packed-cache-page-32-paired": (
        "ragged_page_attention_v3",
        dict(q_lens=(1, 400), kv_lens=(60, 500), heads=2, kv_heads=1, dim=128, page=32),
        {"tiles_per_cta": 2, "in_place": False},
    ),
    # routed by queries: a 12-query sequence (more than the short pass's 16 // G = 8) goes to the Triton core's
    # general tiles, not to a 128-query tile; decode rows beside; a 130-query chunk in the tiles, in place
    "routed-short-queries-to-triton": (
        "unified_attention",
        dict(q_lens=(12, 130, 1), kv_lens=(80, 200, 33), heads=2, kv_heads=1, dim=128, page=16),
        {"in_place": True, "long_queries": 64},
    ),
}


def interpret_check(case: str) -> None:
    """`INTERPRET_CASES[case]` through both passes against the reference (output) and the plain-JAX core (its
    log-sum-exp); raises AssertionError, a race shows as "RACE DETECTED" on stdout."""
    op, shape, tiles = INTERPRET_CASES[case]
    if op == "unified_attention":
        args, options, adapter = _unified(**shape), {}, unified_batch
    else:
        (args, options), adapter = _v3(**shape), ragged_v3_batch
    batch = adapter(*args, **options)
    flash, paged = plan(batch, **tiles)
    expected = jitted_reference(op, options)(*args)
    expected_lse = jax.jit(functools.partial(paged_attention_core, with_lse=True))(batch)[1]
    long_queries = tiles.get("long_queries")
    whole_core = long_queries is not None and int(route(batch, long_queries)) == CORE_THEN_TILES
    triton = jax.jit(lambda b: triton_pass(b, interpret=True, long_queries=long_queries, whole_core=whole_core))(batch)
    with interpret_mode():  # (the prefill tiles alone: nothing else is dispatched beside them)
        both = jax.jit(lambda b, t: tiles_pass(flash, paged, b, t, True, long_queries=long_queries))(batch, triton)
        out, lse = jax.block_until_ready(both)
    assert_close(out, expected, jnp.bfloat16)
    seen = jnp.isfinite(expected_lse)  # (-inf where a query sees no key)
    assert bool(jnp.all(seen == jnp.isfinite(lse))), "lse: -inf on other rows"
    assert_close(jnp.where(seen, lse, 0.0), jnp.where(seen, expected_lse, 0.0), name="lse")


@pytest.mark.long
def test_interpret_mode_matches_reference():
    """Every case, in one fresh process."""
    check_in_fresh_process(__file__, INTERPRET_CASES)


def test_route_picks_the_passes():
    """Routed by queries (G = 2: the short pass takes up to 8): decode rows and a chunk run the short pass and the
    tiles, a 12-query sequence beside them the whole Triton core and the tiles, a batch without a chunk the core."""
    routes = {
        (1, 140, 3): SHORT_THEN_TILES,
        (1, 140, 12): CORE_THEN_TILES,
        (12, 30, 63): CORE_ALONE,
    }
    for q_lens, expected in routes.items():
        batch = unified_batch(*_unified(q_lens, (200,) * 3, heads=2, kv_heads=1, dim=64, page=16))
        assert int(route(batch, LONG_QUERIES)) == expected, q_lens


@pytest.fixture
def on_hopper(monkeypatch, cuda_lowering):
    """Lowering for CUDA on this CPU host as on a Hopper GPU (the core declines elsewhere)."""
    monkeypatch.setattr("ejkernel.kernels._pallas.gpu.paged_attention._interface.is_hopper", lambda: True)


def _lowered(op: str, with_lse: bool = True, **options) -> str:
    """The core's program for CUDA (`on_hopper`): decode rows beside a 300-query and a 40-query chunk."""
    q_lens, kv_lens = [1] * 6 + [300, 40], [500] * 6 + [700, 300]
    args, _ = make_problem(op, q_lens, kv_lens, heads=8, kv_heads=2, dim=128, page=16)
    adapter = ragged_v3_batch if op == "ragged_page_attention_v3" else unified_batch
    call = lambda *a: paged_attention_mosaic_gpu_core(adapter(*a), interpret=False, with_lse=with_lse, **options)
    shapes = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in args]
    return jax.jit(call).trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize(
    ("op", "options"),
    [
        ("unified_attention", {}),
        ("ragged_page_attention_v3", {"tiles_per_cta": 2, "in_place": False}),
        ("unified_attention", {"in_place": True, "long_queries": 64}),
    ],
    ids=["unified", "v3-paired", "unified-in-place-routed"],
)
def test_both_passes_lower_for_cuda(op, options, on_hopper):
    """The prefill tiles lower to one Mosaic GPU kernel beside the Triton pass, without a GPU: the unified
    cache's rows and v3's packed one (K and V of a head interleaved), one and two tiles a CTA; in place (the kernel
    aliases the Triton pass's output) and routed by queries (a switch of three branches, two with the tiles)."""
    text = _lowered(op, **options)
    calls = text.split("@mosaic_gpu")[1:]
    assert len(calls) == (2 if options.get("long_queries") else 1) and "ejkernel_paged_attention" in text
    if options.get("in_place", True):
        assert all("output_operand_alias" in call.split("\n")[0] for call in calls)


def test_in_place_lowers_without_glue(on_hopper):
    """In place, the output of a call without the log-sum-exp is the Mosaic GPU kernel's aliased operand: no
    gather of the queries or of tile rows and no select after the kernel (today's path has both)."""
    after = lambda text: text.split("@mosaic_gpu")[1].split("\n", 1)[1].split("return")[0]  # (to main's end)
    for in_place in (False, True):
        text = after(_lowered("unified_attention", with_lse=False, in_place=in_place))
        assert ("stablehlo.gather" in text or "stablehlo.select" in text) != in_place, in_place


def _declines(batch, match: str):
    with pytest.raises(NotImplementedError, match=match):
        plan(batch)


def test_declines_what_the_prefill_tiles_do_not_serve():
    mixed = dict(q_lens=(1, 150), kv_lens=(40, 300), heads=4, kv_heads=2, page=16)
    args = _unified(**mixed, dim=128)
    plan(unified_batch(*args))  # served
    _declines(unified_batch(*args, sliding_window=64), "no soft cap, window")
    _declines(unified_batch(*args, logits_soft_cap=5.0), "no soft cap, window")
    _declines(unified_batch(*args[:8], randn((4,))), "sinks")
    _declines(unified_batch(*_unified(**mixed, dim=96)), "head dims")
    _declines(unified_batch(*_unified(**{**mixed, "page": 4}, dim=128)), "pages of")
    decode = _unified(q_lens=(1,) * 8, kv_lens=(40,) * 8, heads=4, kv_heads=2, page=16, dim=128)
    _declines(unified_batch(*decode), "no 128-query chunk")
    speculative = _unified(q_lens=(8,) * 24, kv_lens=(40,) * 24, heads=4, kv_heads=2, page=16, dim=128)
    _declines(unified_batch(*speculative), "fewer than 32 queries a sequence")
    plan(unified_batch(*speculative), long_queries=LONG_QUERIES)  # routed by queries: served
    fp8 = [*args[:1], *(c.astype(jnp.float8_e4m3fn) for c in args[1:3]), *args[3:]]
    _declines(unified_batch(*fp8), "cache and compute dtype")
    head_major = [jnp.swapaxes(c, 1, 2) for c in args[1:3]]  # page_attention's [pages, Hkv, page, D]
    lens, tables = jnp.full((160,), 200, jnp.int32), args[4][:1].repeat(160, 0)
    _declines(page_attention_batch(args[0][:160], *head_major, lens, tables), "reads")
    with pytest.raises(NotImplementedError, match="do not fit"):
        plan(unified_batch(*args), stages=3, tiles_per_cta=2)
    with pytest.raises(NotImplementedError, match="in place do not fit"):
        plan(unified_batch(*args), tiles_per_cta=2, in_place=True)


def test_declines_off_hopper():
    if is_hopper():
        pytest.skip("a Hopper GPU is served")
    with pytest.raises(NotImplementedError, match="Hopper"):
        paged_attention_mosaic_gpu_core(
            unified_batch(*_unified((1, 150), (40, 300), heads=4, kv_heads=2, dim=128, page=16))
        )


# ---- GPU suite: the bench's mixed batches against XLA ----


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["unified_attention", "ragged_page_attention_v3"])
@pytest.mark.parametrize("case", MIXED, ids=lambda c: "{}x1@{} + {}x{}@{}".format(*c))
def test_gpu_mixed_batches_match_xla(op, case):
    n_decode, decode_ctx, n_prefill, chunk, prefill_ctx = case
    q_lens = [1] * n_decode + [chunk] * n_prefill
    kv_lens = [decode_ctx] * n_decode + [prefill_ctx + chunk] * n_prefill
    args, _ = make_problem(op, q_lens, kv_lens, heads=32, kv_heads=8, dim=128, page=16)
    options = {"softmax_scale": DIM**-0.5} if op == "ragged_page_attention_v3" else {}  # (v3's default: 1.0)
    fn = lambda platform: jax.jit(lambda *a: output_of(op)(getattr(modules, op)(*a, platform=platform, **options)))
    assert_close(fn("pallas")(*args), fn("xla")(*args), jnp.bfloat16)


@pytest.mark.gpu
def test_gpu_gradient_through_the_prefill_tiles():
    """A mixed unified batch (chunks of 512 and 77 beside decode rows, a short sequence): dq as XLA's."""
    q_lens, kv_lens = (1,) * 16 + (512, 77, 3), (3000,) * 16 + (1024, 2000, 40)
    args = _unified(q_lens, kv_lens, heads=32, kv_heads=8, dim=128, page=16, outside=((17, 70),))
    fn = lambda platform: jax.jit(lambda *a: modules.unified_attention(*a[:6], platform=platform))
    assert_close(fn("pallas")(*args[:6]), fn("xla")(*args[:6]), jnp.bfloat16)
    g = randn(args[0].shape, jnp.bfloat16)
    grad = lambda platform: jax.grad(lambda q: jnp.vdot(fn(platform)(q, *args[1:6]), g).real)(args[0])
    assert_close(grad("pallas"), grad("xla"), jnp.bfloat16, tol=4e-2, name="dq")


def _against_the_core(batch, **options):
    """`paged_attention_mosaic_gpu_core(batch, **options)`'s output and log-sum-exp against the plain-JAX core's."""
    out, lse = jax.jit(lambda b: paged_attention_mosaic_gpu_core(b, with_lse=True, **options))(batch)
    want, want_lse = jax.jit(functools.partial(paged_attention_core, with_lse=True))(batch)
    assert_close(out, want, jnp.bfloat16)
    seen = jnp.isfinite(want_lse)
    assert bool(jnp.all(seen == jnp.isfinite(lse))), "lse: -inf on other rows"
    assert_close(jnp.where(seen, lse, 0.0), jnp.where(seen, want_lse, 0.0), name="lse")


@pytest.mark.gpu
@pytest.mark.parametrize(
    "options", [{"in_place": False}, {"long_queries": LONG_QUERIES}], ids=["out-of-place", "routed"]
)
@pytest.mark.parametrize("op", ["unified_attention", "ragged_page_attention_v3"])
@pytest.mark.parametrize("case", MIXED, ids=lambda c: "{}x1@{} + {}x{}@{}".format(*c))
def test_gpu_out_of_place_and_routed_match_the_plain_jax_core(op, case, options):
    """The bench's mixed batches with the tiles out of place, and in place routed by queries, output and
    log-sum-exp (the default, in place, has its own test)."""
    n_decode, decode_ctx, n_prefill, chunk, prefill_ctx = case
    q_lens = [1] * n_decode + [chunk] * n_prefill
    kv_lens = [decode_ctx] * n_decode + [prefill_ctx + chunk] * n_prefill
    args, _ = make_problem(op, q_lens, kv_lens, heads=32, kv_heads=8, dim=128, page=16)
    v3 = op == "ragged_page_attention_v3"
    batch = ragged_v3_batch(*args, softmax_scale=DIM**-0.5) if v3 else unified_batch(*args)
    _against_the_core(batch, **options)


@pytest.mark.gpu
@pytest.mark.parametrize("chunks", [True, False], ids=["with-chunks", "drafts-alone"])
def test_gpu_draft_batch_routed_to_the_triton_core(chunks):
    """Routed by queries: 32 sequences of 24 drafts on the Triton core's general tiles and decode rows on its short
    pass, beside a 300-query chunk and a 77-query one in the tiles, in place (`CORE_THEN_TILES`), or alone
    (`CORE_ALONE`)."""
    q_lens, kv_lens = (24,) * 32 + (1,), (1500,) * 32 + (2000,)
    if chunks:
        q_lens, kv_lens = (*q_lens, 300, 77), (*kv_lens, 900, 77)
    batch = unified_batch(*_unified(q_lens, kv_lens, heads=32, kv_heads=8, dim=128, page=16))
    assert int(route(batch, LONG_QUERIES)) == (CORE_THEN_TILES if chunks else CORE_ALONE)
    _against_the_core(batch, in_place=True, long_queries=LONG_QUERIES)
