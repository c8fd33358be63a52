"""Out-of-range lengths, offsets and indices of the serving ops under `jax.jit`, each against its documented rule.

Lengths, query bounds and sequence counts are clamped: the op under `jit` must equal the reference on the
clamped input (`clamped`, in numpy). A page-table entry outside the cache holds no key and takes no
write: the references mask such positions themselves. Ragged GDR drops a request whose slot is outside
the pool. Outputs must be finite (`assert_close`) and written caches equal the reference's bit for bit.
Each op compiles once (the bad values are traced arguments); most cases run on XLA, one per rule family
on the Triton kernel and on the Pallas TPU kernel in interpret mode. Last, `EJKERNEL_CHECKS=1` turns a
bad value of every op into its eager error inside the compiled program.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejkernel.modules as modules
from ejkernel import kernel_registry
from ejkernel.kernels._common.paged_attention.implementations import implementation
from ejkernel.kernels._triton.paged_attention._interface import paged_attention_triton_core
from ejkernel.reference import paged_attention as paged_reference
from ejkernel.reference.multi_latent_ragged_page_attention import multi_latent_ragged_page_attention_reference
from ejkernel.reference.ragged_gated_delta_rule import ragged_gated_delta_rule_reference
from harness import assert_close, randn
from serving_attention.paged_cases import CASES

pytestmark = pytest.mark.filterwarnings("ignore:The Pallas Triton")

# op -> argument positions (lengths, page tables, query bounds, sequence count; None: the op has none) and
# (page size, cache pages) of its arguments. "mla" is multi_latent_ragged_page_attention.
LAYOUT = {
    "page_attention": ((3, 4, None, None), lambda a: (a[1].shape[2], a[1].shape[0])),
    "prefill_page_attention": ((3, 4, None, None), lambda a: (a[1].shape[2], a[1].shape[1])),
    "ragged_page_attention_v2": ((2, 3, 4, 5), lambda a: (a[1].shape[1], a[1].shape[0])),
    "ragged_page_attention_v3": ((4, 5, 6, 7), lambda a: (a[3].shape[1], a[3].shape[0])),
    "unified_attention": ((3, 4, 5, None), lambda a: (a[1].shape[1], a[1].shape[0])),
    "mla": ((5, 6, 7, 8), lambda a: (a[4].shape[1] * a[4].shape[2], a[4].shape[0])),
}
WRITES_CACHE = ("ragged_page_attention_v3", "mla")


def query_bounds(loc, num_tokens):
    """The documented clamp of query bounds: into `[0, T]`, then a running max."""
    return np.maximum.accumulate(np.clip(np.asarray(loc), 0, num_tokens))


def clamped(op, args, options):
    """`args` with every length, bound and count clamped as the op's docstring states (page entries kept)."""
    args = list(args)
    if op == "ragged_decode_attention":
        end = np.clip(np.asarray(args[4]), 0, args[1].shape[1])
        args[3], args[4] = jnp.asarray(np.clip(np.asarray(args[3]), 0, end)), jnp.asarray(end)
        return args
    (lengths, tables, bounds, count), sizes = LAYOUT[op]
    num_seqs = args[lengths].size
    capacity = args[tables].size // num_seqs * sizes(args)[0]
    capacity = min(capacity, options.get("max_context_len") or capacity)
    args[lengths] = jnp.clip(args[lengths], 0, capacity)
    if bounds is not None:
        args[bounds] = jnp.asarray(query_bounds(args[bounds], args[0].shape[0]))
    if count is not None:
        args[count] = args[count].at[-1].set(jnp.clip(args[count][-1], 0, num_seqs))
    return args


def mla_case(q_lens=(1, 5, 0, 3, 2), kv_lens=(6, 5, 4, 9, 3), latent=32, rope=16, page=4, heads=2):
    """MLA arguments: 3 distinct pages per sequence, token 0 of no request, request 4 past `distribution[2]`."""
    num_seqs, pages_per_seq = len(kv_lens), 3
    num_pages = num_seqs * pages_per_seq + 2
    tables = np.random.default_rng(3).permutation(num_pages)[: num_seqs * pages_per_seq]
    num_tokens = 1 + sum(q_lens) + 2
    return [
        randn((num_tokens, heads, latent)),
        randn((num_tokens, heads, rope)),
        randn((num_tokens, latent)),
        randn((num_tokens, rope)),
        randn((num_pages, page, 1, 256)),
        jnp.asarray(kv_lens, jnp.int32),
        jnp.asarray(tables, jnp.int32),
        jnp.asarray(1 + np.concatenate([[0], np.cumsum(q_lens)]), jnp.int32),
        jnp.asarray([0, 0, num_seqs - 1], jnp.int32),
    ]


def valid_case(op):
    """`(args, options)` of a valid call, index arrays as int32 arrays (traced under jit)."""
    if op == "mla":
        return mla_case(), {}
    args, options = CASES[op](np.random.default_rng(7))
    if op == "ragged_page_attention_v2":
        args[5] = jnp.asarray([args[5]], jnp.int32)
    if op == "ragged_page_attention_v3":  # distinct pages (its dummy tables repeat page 0 in unused entries)
        args[5] = jnp.asarray(np.random.default_rng(3).permutation(args[3].shape[0])[: args[5].size], jnp.int32)
    return args, options


def at(index, where, value):
    """A change of int argument `index`: entry `where` set to `value` (or `value(entries, args)`)."""

    def change(x, args):
        x[where] = value(x, args) if callable(value) else value
        return x

    return index, change


def filled(op, index):
    """Table entries a sequence does not use (-1) replaced by pages of the cache, so that a clamped length
    reads pages that hold keys."""

    def change(x, args):
        return np.where(x < 0, np.random.default_rng(5).integers(0, LAYOUT[op][1](args)[1], x.shape), x)

    return index, change


# name -> (op, changes, options). Capacities (positions per table row): page_attention 48, prefill 40, v2 48,
# v3 20, unified 28, mla 12; decode rows hold 37 keys.
BAD = {
    "page_attention: context_lens past the table": ("page_attention", [filled("page_attention", 4), at(3, 0, 57)], {}),
    "page_attention: negative context_lens": ("page_attention", [at(3, 2, -5)], {}),
    "page_attention: context_lens past max_context_len": ("page_attention", [], {"max_context_len": 20}),
    "page_attention: block_tables entries off the cache": (
        "page_attention",
        [at(4, (0, 1), lambda x, a: a[1].shape[0] + 3), at(4, (2, 0), -4)],
        {},
    ),
    "prefill: context_len past the table": ("prefill_page_attention", [at(3, 0, 46)], {}),
    "prefill: negative context_len": ("prefill_page_attention", [at(3, 0, -3)], {}),
    "prefill: chunk longer than context_len": ("prefill_page_attention", [at(3, 0, 5)], {}),
    "prefill: page_indices off the cache": (
        "prefill_page_attention",
        [at(4, 1, -1), at(4, 3, lambda x, a: a[1].shape[1])],
        {},
    ),
    "v2: num_seqs past N": ("ragged_page_attention_v2", [at(5, 0, 9)], {}),
    "v2: negative num_seqs": ("ragged_page_attention_v2", [at(5, 0, -2)], {}),
    "v2: query_start_loc decreasing": ("ragged_page_attention_v2", [at(4, 2, 1)], {}),
    "v2: query_start_loc past the tokens": ("ragged_page_attention_v2", [at(4, 4, 35)], {}),
    "v2: query_start_loc not from 0": ("ragged_page_attention_v2", [at(4, 0, 2)], {}),
    "v2: context_lens past the table": (
        "ragged_page_attention_v2",
        [filled("ragged_page_attention_v2", 3), at(2, 3, 60)],
        {},
    ),
    "v2: block_tables entry off the cache": (
        "ragged_page_attention_v2",
        [at(3, (3, 2), lambda x, a: a[1].shape[0] + 1)],
        {},
    ),
    "v3: distribution[2] past N": ("ragged_page_attention_v3", [at(7, 2, 9)], {}),
    "v3: distribution out of order": ("ragged_page_attention_v3", [at(7, slice(None), [4, 1, 3])], {}),
    "v3: kv_lens past the table": ("ragged_page_attention_v3", [at(4, 3, 25)], {}),
    "v3: kv_lens below the new tokens": ("ragged_page_attention_v3", [at(4, 2, 4)], {}),
    "v3: negative kv_lens": ("ragged_page_attention_v3", [at(4, 3, -2)], {}),
    "v3: block_tables entries off the cache (new tokens' pages)": (
        "ragged_page_attention_v3",
        [at(5, 2 * 5 + 3, lambda x, a: a[3].shape[0] + 5), at(5, 3 * 5, -1)],
        {},
    ),
    "v3: two new tokens naming one cache row": (
        "ragged_page_attention_v3",
        [at(5, 3 * 5 + 2, lambda x, a: x[2 * 5 + 3])],  # sequence 3's page of positions 8-11 is sequence 2's 12-15
        {},
    ),
    "v3: query_start_loc decreasing": ("ragged_page_attention_v3", [at(6, 3, 1)], {}),
    "decode: sequence_end past S": ("ragged_decode_attention", [at(4, 0, 46)], {}),
    "decode: negative sequence_end": ("ragged_decode_attention", [at(4, 2, -4)], {}),
    "decode: negative sequence_start": ("ragged_decode_attention", [at(3, 3, -6)], {}),
    "decode: sequence_start past sequence_end": ("ragged_decode_attention", [at(3, 2, lambda x, a: a[4][2] + 3)], {}),
    "unified: kv_lens past the table": ("unified_attention", [filled("unified_attention", 4), at(3, 3, 40)], {}),
    "unified: kv_lens below the queries": ("unified_attention", [at(3, 1, 2)], {}),
    "unified: query_start_loc decreasing": ("unified_attention", [at(5, 2, 0)], {}),
    "unified: query_start_loc past the tokens": ("unified_attention", [at(5, 4, 25)], {}),
    "unified: query_start_loc not from 0": ("unified_attention", [at(5, 0, 1)], {}),
    "unified: block_tables entries off the cache": (
        "unified_attention",
        [at(4, (3, 1), -3), at(4, (0, 4), lambda x, a: a[1].shape[0])],
        {},
    ),
    "mla: kv_lens past the table": ("mla", [at(5, 3, 20)], {}),
    "mla: block_tables entries off the cache (new tokens' pages)": (
        "mla",
        [at(6, 3 * 3 + 2, -2), at(6, 1, lambda x, a: a[4].shape[0])],
        {},
    ),
    "mla: query_start_loc decreasing": ("mla", [at(7, 2, 0)], {}),
    "mla: distribution[2] past N": ("mla", [at(8, 2, 7)], {}),
}


def bad_case(name):
    """`(op, bad args, options)`: the op's valid case with the named changes applied."""
    op, changes, options = BAD[name]
    args, base = valid_case(op)
    for index, change in changes:
        args[index] = jnp.asarray(change(np.array(args[index]), args), jnp.int32)
    return op, args, {**base, **options}


def public(op, options):
    fn = modules.multi_latent_ragged_page_attention if op == "mla" else getattr(modules, op)
    return functools.partial(fn, platform="xla", **options)


@functools.cache
def jitted(op, frozen_options):
    """The public op under jit, compiled once per op and options."""
    return jax.jit(public(op, dict(frozen_options)))


def check(op, result, args, options):
    """`result` of the bad `args` equals the reference on the clamped args (written caches exactly)."""
    ref_args = clamped(op, args, options)
    if op == "mla":
        ref, ref_cache = multi_latent_ragged_page_attention_reference(*ref_args, **options)
    else:
        ref = getattr(paged_reference, f"{op}_reference")(*ref_args, **options)
        ref, ref_cache = ref if op in WRITES_CACHE else (ref, None)
    out, cache = result if op in WRITES_CACHE else (result, None)
    assert_close(out, ref, jnp.float32)
    if cache is not None:
        assert bool(jnp.array_equal(cache, ref_cache)), "the cache holds exactly the reference's writes"


@pytest.mark.parametrize("name", BAD)
def test_xla_follows_the_documented_rule(name):
    op, args, options = bad_case(name)
    check(op, jitted(op, tuple(sorted(options.items())))(*args), args, options)


def test_decode_end_past_the_keys_counts_each_key_once():
    """The issue's case: `sequence_end` past S gives exactly what S gives."""
    _, args, _ = bad_case("decode: sequence_end past S")
    call = jitted("ragged_decode_attention", ())
    assert bool(jnp.array_equal(call(*args), call(*clamped("ragged_decode_attention", args, {}))))


@pytest.mark.parametrize(
    "name",
    [
        "unified: kv_lens past the table",
        "unified: query_start_loc decreasing",
        "unified: block_tables entries off the cache",
        "decode: sequence_start past sequence_end",
    ],
)
def test_triton_kernel_follows_the_rule(name):
    """One case per rule family on the Pallas-Triton kernel (interpreted): lengths, query bounds, page entries,
    decode bounds."""
    op, args, options = bad_case(name)
    core = functools.partial(paged_attention_triton_core, interpret=True)
    impl = implementation(op, core, kernel_registry.get(op, "triton", "gpu").__name__)
    check(op, jax.jit(functools.partial(impl, **options))(*args), args, options)


@pytest.mark.parametrize(
    "name",
    ["page_attention: context_lens past the table", "v3: block_tables entries off the cache (new tokens' pages)"],
)
def test_pallas_tpu_kernel_follows_the_rule(name):
    """A clamped length and page entries off the cache (masked, not written) on the Pallas TPU kernel (TPU
    interpret mode)."""
    op, args, options = bad_case(name)
    impl = kernel_registry.get(op, "pallas", "tpu")
    check(op, jax.jit(functools.partial(impl, **options))(*args), args, options)


# ---- ragged gated delta rule ----

T, H, DK, DV, SLOTS = 16, 2, 8, 8, 6
QSL = np.array([1, 6, 7, 7, 13], np.int32)  # 5, 1, 0 and 6 tokens; tokens 0 and 13-15 of no request
SLOT_OF = np.array([3, 0, 0, 4], np.int32)  # slots 1, 2 and 5 named by no request
GDR_BAD = {
    "query_start_loc decreasing": (np.array([1, 6, 4, 9, 13], np.int32), SLOT_OF),
    "query_start_loc past the tokens": (np.array([1, 6, 7, 7, 30], np.int32), SLOT_OF),
    "state_indices past the slots": (QSL, np.array([3, SLOTS + 2, 0, 4], np.int32)),
    "negative state_indices": (QSL, np.array([-1, 0, 0, 4], np.int32)),
    "state_indices past the slots, decode path": (np.array([1, 2, 3, 3, 4], np.int32), np.array([3, 9, 0, 4])),
}


def gdr_args(name, dk=DK, dv=DV):
    qsl, slots = GDR_BAD[name]
    beta, decay = jax.nn.sigmoid(randn((T, H))), -jax.nn.softplus(randn((T, H)))
    floats = [randn((T, H, dk)), randn((T, H, dk)), randn((T, H, dv)), beta, decay, randn((SLOTS, H, dk, dv))]
    return [*floats, jnp.asarray(qsl, jnp.int32), jnp.asarray(slots, jnp.int32)]


@pytest.mark.parametrize("name", GDR_BAD)
def test_ragged_gated_delta_rule_follows_the_rule(name):
    """Bounds clamped to `[0, T]` and made non-decreasing; a request on a slot outside the pool is dropped: its
    tokens give zeros and no slot is written (the reference runs it on a spare slot, then restores that slot)."""
    args = gdr_args(name)
    out, state = jax.jit(functools.partial(modules.ragged_gated_delta_rule, platform="xla"))(*args)
    bounds, slots = query_bounds(args[6], T), np.asarray(args[7])
    dropped = (slots < 0) | (slots >= SLOTS)
    spare = 5
    ref = lambda *floats: ragged_gated_delta_rule_reference(*floats, bounds, np.where(dropped, spare, slots))
    ref_out, ref_state = jax.jit(ref)(*args[:6])
    for r in np.flatnonzero(dropped):
        ref_out = ref_out.at[bounds[r] : bounds[r + 1]].set(0.0)
    ref_state = ref_state.at[spare].set(args[5][spare])
    assert_close(out, ref_out, jnp.float32, name="out")
    assert_close(state, ref_state, jnp.float32, name="state")


@pytest.mark.parametrize("name", ["query_start_loc decreasing", "state_indices past the slots, decode path"])
def test_ragged_gated_delta_rule_triton_follows_the_rule(name):
    """The Triton kernels (interpreted; head dims 16, the least they take) give the XLA path's result on both of
    its paths: clamped bounds on the chunked one, a dropped slot on the decode step."""
    args = gdr_args(name, dk=16, dv=16)
    triton = functools.partial(kernel_registry.get("ragged_gated_delta_rule", "triton", "gpu"), interpret=True)
    out, state = jax.jit(functools.partial(triton, chunk_size=16))(*args)
    xla_out, xla_state = jax.jit(functools.partial(modules.ragged_gated_delta_rule, platform="xla"))(*args)
    assert_close(out, xla_out, jnp.float32, name="out")
    assert_close(state, xla_state, jnp.float32, name="state")


# ---- checked mode ----

CHECKED = {
    "page_attention": ("page_attention: negative context_lens", r"context_lens\[2\] = -5 is outside \[0, 48\]"),
    "prefill_page_attention": ("prefill: page_indices off the cache", r"page_indices\[1\] = -1 is outside \[0, 7\)"),
    "ragged_page_attention_v2": ("v2: num_seqs past N", r"num_seqs = 9 is outside \[0, 5\]"),
    "ragged_page_attention_v3": ("v3: kv_lens past the table", r"kv_lens\[3\] = 25 is outside \[0, 20\]"),
    "ragged_decode_attention": ("decode: sequence_end past S", r"sequence_end\[0\] = 46 is outside \[0, 37\]"),
    "unified_attention": ("unified: query_start_loc decreasing", r"query_start_loc\[2\] = 0 is outside"),
    "mla": (
        "mla: block_tables entries off the cache (new tokens' pages)",
        r"block_tables\[1\] = 17 is outside \[0, 17\)",
    ),
}


@pytest.mark.parametrize("op", [*CHECKED, "ragged_gated_delta_rule"])
def test_checked_mode_raises_the_eager_error_under_jit(op, monkeypatch):
    if op == "ragged_gated_delta_rule":
        fn = functools.partial(modules.ragged_gated_delta_rule, platform="xla")
        args = gdr_args("state_indices past the slots")
        message = r"state_indices\[1\] = 8 is outside \[0, 6\)"
    else:
        name, message = CHECKED[op]
        op, args, options = bad_case(name)
        fn = public(op, options)
    with pytest.raises(ValueError, match=message):
        fn(*args)
    monkeypatch.setenv("EJKERNEL_CHECKS", "1")
    with pytest.raises((jax.errors.JaxRuntimeError, ValueError), match=message):
        jax.block_until_ready(jax.jit(lambda *a: fn(*a))(*args))
