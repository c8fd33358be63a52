"""Random serving-attention inputs shared by the tests: shuffled page tables with shared prefixes.

Each builder returns `(args, options)` for one op: positional tensors in the op's order and keyword
options, from fresh random floats (harness.randn) and a numpy generator for lengths and tables.
"""

import jax.numpy as jnp
import numpy as np

from ejkernel.reference import paged_attention as reference
from ejkernel.utils import make_dummy_rpa_inputs
from harness import randn

OPS = (
    "page_attention",
    "prefill_page_attention",
    "ragged_page_attention_v2",
    "ragged_page_attention_v3",
    "ragged_decode_attention",
    "unified_attention",
)


def page_tables(rng, kv_lens, page_size: int, width: int, num_pages: int, shared: int = 1) -> np.ndarray:
    """`[N, width]` tables over a shuffled cache; odd sequences share the first `shared` pages of sequence 0.

    Entries past a sequence's length point anywhere (here: -1, which must never be read).
    """
    order = iter(np.random.default_rng(rng.integers(1 << 30)).permutation(num_pages).tolist())
    tables = np.full((len(kv_lens), width), -1, np.int32)
    for s, kv_len in enumerate(kv_lens):
        for p in range(-(-kv_len // page_size)):
            tables[s, p] = tables[0, p] if s % 2 and p < shared and tables[0, p] >= 0 else next(order)
    return tables


def cumulative(q_lens) -> jnp.ndarray:
    return jnp.asarray(np.concatenate([[0], np.cumsum(q_lens)]), jnp.int32)


def page_attention_case(rng, *, kv_lens=(37, 0, 32, 9), heads=4, kv_heads=2, dim=16, page=8, dtype=jnp.float32):
    width = -(-max(kv_lens) // page) + 1
    num_pages = sum(-(-n // page) for n in kv_lens) + 3
    tables = page_tables(rng, kv_lens, page, width, num_pages)
    q = randn((len(kv_lens), heads, dim), dtype)
    kc, vc = (randn((num_pages, kv_heads, page, dim), dtype) for _ in range(2))
    return [q, kc, vc, jnp.asarray(kv_lens, jnp.int32), jnp.asarray(tables)], {}


def prefill_case(rng, *, chunk=13, context=37, heads=4, kv_heads=1, dim=16, page=8, dtype=jnp.float32):
    num_pages = -(-context // page) + 2
    indices = rng.permutation(num_pages)[: -(-context // page)].astype(np.int32)
    q = randn((chunk, heads, dim), dtype)
    kc, vc = (randn((kv_heads, num_pages, page, dim), dtype) for _ in range(2))
    return [q, kc, vc, jnp.asarray([context], jnp.int32), jnp.asarray(indices)], {}


def _ragged(rng, q_lens, kv_lens, page, extra_width=1):
    width = -(-max(kv_lens) // page) + extra_width
    num_pages = sum(-(-n // page) for n in kv_lens) + 2
    return page_tables(rng, kv_lens, page, width, num_pages), num_pages


def ragged_v2_case(
    rng, *, q_lens=(5, 1, 0, 17, 3), kv_lens=(20, 9, 0, 33, 8), num_seqs=4, heads=4, kv_heads=2, dim=16, page=8,
    sinks=3, dtype=jnp.float32,
):  # fmt: skip
    tables, num_pages = _ragged(rng, q_lens, kv_lens, page)
    q = randn((sum(q_lens) + 2, heads, dim), dtype)  # 2 padding tokens at the end
    kv = randn((num_pages, page, 2 * kv_heads, dim), dtype)
    aux = None if sinks is None else randn((sinks,))
    args = [q, kv, jnp.asarray(kv_lens, jnp.int32), jnp.asarray(tables), cumulative(q_lens), num_seqs, aux]
    return args, {"compute_dtype": None}


def ragged_v3_case(rng, *, dtype=jnp.float32, heads=4, kv_heads=2, dim=24, page=4, mixed=(2, 3, 4), num_seqs=5):
    inputs = make_dummy_rpa_inputs(
        rng_seed=int(rng.integers(1 << 30)), num_seqs=num_seqs, pages_per_seq=5, page_size=page, num_q_heads=heads,
        num_kv_heads=kv_heads, head_dim=dim, kv_dtype=dtype, decode_prefill_mixed=(*mixed[:2], num_seqs),
        total_num_pages=num_seqs * 5 + 3,
    )  # fmt: skip
    if mixed[2] < num_seqs:  # the last sequences are ignored
        inputs["distribution"] = inputs["distribution"].at[2].set(mixed[2])
    names = ("queries", "keys", "values", "kv_cache", "kv_lens", "block_tables", "query_start_loc", "distribution")
    return [inputs[n] for n in names] + [randn((heads,))], {}


def ragged_decode_case(rng, *, batch=4, seq=37, heads=4, kv_heads=2, dim=16, rank=3, dtype=jnp.float32):
    end = rng.integers(0, seq + 1, batch)
    end[0], end[1] = seq, 0  # a full row and an empty one
    start = np.minimum(rng.integers(0, seq, batch), end)
    q = randn((batch, heads, dim) if rank == 3 else (batch, 1, heads, dim), dtype)
    k, v = (randn((batch, seq, kv_heads, dim), dtype) for _ in range(2))
    return [q, k, v, jnp.asarray(start, jnp.int32), jnp.asarray(end, jnp.int32), randn((heads,))], {}


def unified_case(
    rng, *, q_lens=(1, 6, 0, 11, 1), kv_lens=(17, 6, 0, 24, 1), heads=4, kv_heads=2, dim=16, page=4, dtype=jnp.float32,
    alibi=True, qq=True, sinks=True,
):  # fmt: skip
    tables, num_pages = _ragged(rng, q_lens, kv_lens, page)
    q = randn((sum(q_lens), heads, dim), dtype)
    kc, vc = (randn((num_pages, page, kv_heads, dim), dtype) for _ in range(2))
    slopes = randn((heads,), scale=0.2) if alibi else None
    qq_bias = randn((max(q_lens), max(q_lens))) if qq else None
    aux = randn((heads,)) if sinks else None
    args = [q, kc, vc, jnp.asarray(kv_lens, jnp.int32), jnp.asarray(tables), cumulative(q_lens), slopes, qq_bias, aux]
    return args, {}


CASES = {
    "page_attention": page_attention_case,
    "prefill_page_attention": prefill_case,
    "ragged_page_attention_v2": ragged_v2_case,
    "ragged_page_attention_v3": ragged_v3_case,
    "ragged_decode_attention": ragged_decode_case,
    "unified_attention": unified_case,
}

# Float arguments a model could differentiate, per op (positions in the op's argument list).
FLOAT_ARGS = {
    "page_attention": (0, 1, 2),
    "prefill_page_attention": (0, 1, 2),
    "ragged_page_attention_v2": (0, 1, 6),
    "ragged_page_attention_v3": (0, 1, 2, 8),
    "ragged_decode_attention": (0, 1, 2, 5),
    "unified_attention": (0, 1, 2, 6, 7, 8),
}


def output_of(op):
    """The attention output of an op's result (`ragged_page_attention_v3` returns `(out, cache)`)."""
    return (lambda r: r[0]) if op == "ragged_page_attention_v3" else (lambda r: r)


def jitted_reference(op, options):
    """The op's reference, compiled once for `args` (called like the op, reads only the float arguments)."""
    return reference.compiled(lambda *a: output_of(op)(getattr(reference, f"{op}_reference")(*a, **options)))
