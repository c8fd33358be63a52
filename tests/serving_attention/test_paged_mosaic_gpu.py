"""The Mosaic GPU prefill tiles of the serving ops: interpret mode against the reference, CUDA lowering, declines,
GPU suite.

Mosaic GPU interpret mode and the Pallas-Triton interpreter cannot run in one program, so the interpret cases run
the core's two passes apart (`short_sequences` interpreted by Pallas, `long_sequences` in Mosaic GPU interpret mode
with races detected, in a fresh process) and join them as the core does. The gradient is the plain-JAX core's
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
    join,
    long_sequences,
    paged_attention_mosaic_gpu_core,
    plan,
    short_sequences,
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


# A 140-query chunk after 150 keys of context (two tiles, the second partly empty), a 40-query chunk after 170,
# decode and short sequences beside them (the Triton pass), an empty sequence, one with more queries than keys
# (its first queries see nothing), and pages outside the cache inside two chunks' spans.
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
        {"tiles_per_cta": 2},
    ),
}


def interpret_check(cases: str) -> None:
    """`INTERPRET_CASES[case]` for each of the comma-separated `cases`, through both passes against the reference
    (output) and the plain-JAX core (its log-sum-exp); raises AssertionError, a race shows as "RACE DETECTED" on
    stdout."""
    for case in cases.split(","):
        check_case(*INTERPRET_CASES[case])


def check_case(op: str, shape: dict, tiles: dict) -> None:
    if op == "unified_attention":
        args, options, adapter = _unified(**shape), {}, unified_batch
    else:
        (args, options), adapter = _v3(**shape), ragged_v3_batch
    batch = adapter(*args, **options)
    flash, paged = plan(batch, **tiles)
    expected = jitted_reference(op, options)(*args)
    expected_lse = jax.jit(functools.partial(paged_attention_core, with_lse=True))(batch)[1]
    out, lse, short = jax.jit(lambda b: short_sequences(b, interpret=True))(batch)
    with interpret_mode():  # (the prefill tiles alone: nothing else is dispatched beside them)
        long = jax.block_until_ready(jax.jit(lambda b, s: long_sequences(flash, paged, b, s))(batch, short))
    out, lse = join((out, lse), long, with_lse=True)
    assert_close(out, expected, jnp.bfloat16)
    seen = jnp.isfinite(expected_lse)  # (-inf where a query sees no key)
    assert bool(jnp.all(seen == jnp.isfinite(lse))), "lse: -inf on other rows"
    assert_close(jnp.where(seen, lse, 0.0), jnp.where(seen, expected_lse, 0.0), name="lse")


def test_interpret_mode_matches_reference():
    """Every case in one fresh process (its start, about 5 s, is most of a case's time)."""
    check_in_fresh_process(__file__, ",".join(INTERPRET_CASES))


def _lowered(op: str, tiles_per_cta: int) -> str:
    q_lens, kv_lens = [1] * 6 + [300, 40], [500] * 6 + [700, 300]
    args, _ = make_problem(op, q_lens, kv_lens, heads=8, kv_heads=2, dim=128, page=16)
    adapter = ragged_v3_batch if op == "ragged_page_attention_v3" else unified_batch

    def both_passes(*args):
        batch = adapter(*args)
        flash, paged = plan(batch, tiles_per_cta=tiles_per_cta)
        out, lse, short = short_sequences(batch, interpret=False)
        return join((out, lse), long_sequences(flash, paged, batch, short), with_lse=True)

    shapes = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in args]
    return jax.jit(both_passes).trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize(("op", "tiles_per_cta"), [("unified_attention", 1), ("ragged_page_attention_v3", 2)])
def test_both_passes_lower_for_cuda(op, tiles_per_cta, cuda_lowering):
    """The prefill tiles lower to one Mosaic GPU kernel beside the Triton pass, without a GPU: the unified
    cache's rows and v3's packed one (K and V of a head interleaved), one and two tiles a CTA."""
    text = _lowered(op, tiles_per_cta)
    assert text.count("@mosaic_gpu") == 1 and "ejkernel_paged_attention" in text


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
    fp8 = [*args[:1], *(c.astype(jnp.float8_e4m3fn) for c in args[1:3]), *args[3:]]
    _declines(unified_batch(*fp8), "cache and compute dtype")
    head_major = [jnp.swapaxes(c, 1, 2) for c in args[1:3]]  # page_attention's [pages, Hkv, page, D]
    lens, tables = jnp.full((160,), 200, jnp.int32), args[4][:1].repeat(160, 0)
    _declines(page_attention_batch(args[0][:160], *head_major, lens, tables), "reads")
    with pytest.raises(NotImplementedError, match="do not fit"):
        plan(unified_batch(*args), stages=3, tiles_per_cta=2)


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
