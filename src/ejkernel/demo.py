"""`ejkernel demo`: every op on the default device, each platform that runs here, against its reference."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ejkernel.benchmarks._harness import format_value, time_fn


@dataclasses.dataclass(frozen=True)
class DemoCase:
    op: str
    make_inputs: Callable[[jax.Array], tuple[tuple, dict]]  # key -> (positional tensors, options)
    reference: Callable[..., Any]
    output: Callable[[Any], jax.Array] = lambda result: result  # the array compared with the reference
    takes_platform: bool = True  # `attention` has no platform argument (API.md)
    algorithm: str | None = None  # the registry's name, where it is not the function's (`gla`)

    def call(self, options: dict) -> Callable[..., jax.Array]:
        """The op under `options`, returning the array compared with the reference."""
        import ejkernel.modules as modules

        op = getattr(modules, self.op)
        return lambda *args: self.output(op(*args, **options))


def _attention_inputs(key, **options):
    kq, kk, kv = jax.random.split(key, 3)
    shape = (2, 1024, 8, 64)  # divisible by 2 x 8 devices: the causal ring splits it into 16 chunks
    q = jax.random.normal(kq, shape, jnp.bfloat16)
    k, v = (jax.random.normal(x, (*shape[:2], 2, 64), jnp.bfloat16) for x in (kk, kv))
    return (q, k, v), options


def _blocksparse_inputs(key):
    kq, kk, kv = jax.random.split(key, 3)
    q = jax.random.normal(kq, (2, 8, 512, 64), jnp.bfloat16)  # [batch, heads, seq, dim]
    k, v = (jax.random.normal(x, (2, 2, 512, 64), jnp.bfloat16) for x in (kk, kv))
    return (q, k, v), dict(causal=True, sliding_window=(128, 0))


def _native_sparse_inputs(key):
    kq, kk, kv, kg, ki = jax.random.split(key, 5)
    q = jax.random.normal(kq, (1, 512, 8, 64), jnp.float32)
    k, v = (jax.random.normal(x, (1, 512, 2, 64), jnp.float32) for x in (kk, kv))
    g_cmp, g_slc = jax.nn.sigmoid(jax.random.normal(kg, (2, 1, 512, 8)))
    indices = jax.random.randint(ki, (1, 512, 2, 4), -1, 8)
    counts = jnp.full((1, 512, 2), 4, jnp.int32)
    return (q, k, v, g_cmp, g_slc, indices, counts), {}


def _mla_inputs(key):
    kq, kc, kk, kv, kr = jax.random.split(key, 5)
    query = jax.random.normal(kq, (1, 256, 8, 96), jnp.bfloat16)  # [nope 64 | rope 32] per head
    latent = jax.random.normal(kc, (1, 256, 256), jnp.bfloat16)
    w_kc = (jax.random.normal(kk, (256, 1, 64)) / 16).astype(jnp.bfloat16)
    w_vc = (jax.random.normal(kv, (256, 1, 64)) / 16).astype(jnp.bfloat16)
    rope_keys = jax.random.normal(kr, (1, 256, 32), jnp.bfloat16)
    return (query, latent, w_kc, w_vc, None, rope_keys), {"causal": True}


def _grouped_matmul_inputs(key):
    kl, kr = jax.random.split(key)
    lhs = jax.random.normal(kl, (2048, 512), jnp.bfloat16)
    rhs = (jax.random.normal(kr, (8, 512, 256)) / 512**0.5).astype(jnp.bfloat16)
    sizes = jnp.array([300, 0, 517, 64, 400, 1, 700, 66], jnp.int32)  # one group empty
    return (lhs, rhs, sizes), {}


def _linear_inputs(key, *, gates=(), **options):
    """bf16 q, k, v [2, 256, 4, 64]; float32 gates: log decays in (-inf, 0), beta in (0, 1)."""
    keys = iter(jax.random.split(key, 8))
    q, k, v = (jax.random.normal(next(keys), (2, 256, 4, 64), jnp.bfloat16) for _ in range(3))
    draw = {
        "g": lambda: -jax.nn.softplus(jax.random.normal(next(keys), (2, 256, 4, 64))),
        "beta": lambda: jax.nn.sigmoid(jax.random.normal(next(keys), (2, 256, 4))),
        "decay": lambda: -jax.nn.softplus(jax.random.normal(next(keys), (2, 256, 4))),
    }
    return (q, k, v, *(draw[name]() for name in gates)), options


def _ssm_inputs(key, v2=False):
    """Mamba-1 (2 x 128 tokens, 128 channels, state 16) or Mamba-2 (8 heads of 32, 2 groups), bf16, gated."""
    k = jax.random.split(key, 7)
    b, s, n = 2, 128, 16
    feat = (8, 32) if v2 else (128,)
    x = jax.random.normal(k[0], (b, s, *feat), jnp.bfloat16)
    A = -jnp.exp(0.5 * jax.random.normal(k[1], feat[:1] if v2 else (feat[0], n)))
    B, C = (jax.random.normal(kk, (b, s, 2, n) if v2 else (b, s, n), jnp.bfloat16) for kk in k[2:4])
    D = jax.random.normal(k[4], feat[:1])
    dt = jax.nn.softplus(jax.random.normal(k[5], (b, s, feat[0])) - 2.0).astype(jnp.bfloat16)
    gate = jax.random.normal(k[6], (b, s, int(np.prod(feat))), jnp.bfloat16)
    return (x, A, B, C, D, dt, gate), ({"n_groups": 2} if v2 else {})


_SERVING_LENS = np.array([1, 17, 64, 100, 255, 256, 300, 511])  # context lengths of 8 sequences
_SERVING_Q_LENS = np.array([1, 1, 64, 1, 100, 1, 1, 37])  # decode steps and prefill chunks mixed


def _paged_cache(key, layout):
    """Shuffled bf16 pages of 16 for the 8 sequences (Hkv=2, D=64) in a layout, and their page tables."""
    kk, kv = jax.random.split(key)
    pages = -(-_SERVING_LENS // 16)
    order = np.random.default_rng(0).permutation(pages.sum())
    tables = np.zeros((8, 32), np.int32)
    for s, (start, n) in enumerate(zip(np.cumsum(pages) - pages, pages, strict=True)):
        tables[s, :n] = order[start : start + n]
    shape = {"page": (pages.sum(), 2, 16, 64), "unified": (pages.sum(), 16, 2, 64)}[layout]
    k, v = (jax.random.normal(x, shape, jnp.bfloat16) for x in (kk, kv))
    return k, v, jnp.asarray(_SERVING_LENS, jnp.int32), jnp.asarray(tables)


def _serving_inputs(key, op):
    kq, kc = jax.random.split(key)
    tokens = int(_SERVING_Q_LENS.sum())
    start_loc = jnp.asarray(np.concatenate([[0], np.cumsum(_SERVING_Q_LENS)]), jnp.int32)
    if op == "page_attention":
        return (jax.random.normal(kq, (8, 8, 64), jnp.bfloat16), *_paged_cache(kc, "page")), {}
    if op in ("unified_attention", "ragged_page_attention_v2"):
        k, v, lens, tables = _paged_cache(kc, "unified")
        q = jax.random.normal(kq, (tokens, 8, 64), jnp.bfloat16)
        if op == "unified_attention":
            return (q, k, v, lens, tables, start_loc), {}
        kv = jnp.stack([k, v], axis=3).reshape(*k.shape[:2], 4, 64)  # K and V interleaved on the head axis
        return (q, kv, lens, tables, start_loc, 8), {}
    if op == "prefill_page_attention":
        kk, kv = jax.random.split(kc)
        k, v = (jax.random.normal(x, (2, 40, 16, 64), jnp.bfloat16) for x in (kk, kv))
        pages = jnp.asarray(np.random.default_rng(0).permutation(40)[:32], jnp.int32)
        return (jax.random.normal(kq, (64, 8, 64), jnp.bfloat16), k, v, jnp.array([500], jnp.int32), pages), {}
    if op == "ragged_decode_attention":
        kk, kv = jax.random.split(kc)
        k, v = (jax.random.normal(x, (8, 512, 2, 64), jnp.bfloat16) for x in (kk, kv))
        start = jnp.array([0, 0, 5, 100, 0, 200, 0, 7], jnp.int32)
        end = jnp.array([1, 512, 300, 101, 64, 511, 256, 7], jnp.int32)
        return (jax.random.normal(kq, (8, 8, 64), jnp.bfloat16), k, v, start, end), {"sliding_window": 128}
    from ejkernel.utils import make_dummy_rpa_inputs

    inputs = make_dummy_rpa_inputs(
        rng_seed=0, num_seqs=8, pages_per_seq=16, page_size=16, num_q_heads=8, num_kv_heads=2, head_dim=64,
        kv_dtype=jnp.bfloat16, decode_prefill_mixed=(4, 6, 8),
    )  # fmt: skip
    names = ("queries", "keys", "values", "kv_cache", "kv_lens", "block_tables", "query_start_loc", "distribution")
    return tuple(inputs[n] for n in names), {}


def _ragged_gdr_inputs(key):
    """8 requests (decode steps, prefill chunks, one empty) after 2 padding tokens, on a pool of 10 states."""
    k = jax.random.split(key, 6)
    lengths = np.array([1, 1, 37, 1, 64, 0, 1, 20])
    tokens = 2 + int(lengths.sum())
    q, kk, v = (jax.random.normal(x, (tokens, 4, 64), jnp.bfloat16) for x in k[:3])
    beta = jax.nn.sigmoid(jax.random.normal(k[3], (tokens, 4)))
    decay = -jax.nn.softplus(jax.random.normal(k[4], (tokens, 4)))
    state = 0.1 * jax.random.normal(k[5], (10, 4, 64, 64))
    starts = jnp.asarray(2 + np.concatenate([[0], np.cumsum(lengths)]), jnp.int32)
    slots = jnp.asarray(np.random.default_rng(0).permutation(10)[:8], jnp.int32)
    return (q, kk, v, beta, decay, state, starts, slots), {}


def _mla_serving_inputs(key):
    """An MLA serving step (latent 128, RoPE 64, 8 heads) over v3's mixed schedule, bf16 packed latent pages."""
    from ejkernel.utils import make_dummy_rpa_inputs

    tables = make_dummy_rpa_inputs(
        rng_seed=1, num_seqs=8, pages_per_seq=8, page_size=16, num_q_heads=8, num_kv_heads=1, head_dim=64,
        kv_dtype=jnp.bfloat16, decode_prefill_mixed=(4, 6, 8),
    )  # fmt: skip
    tokens, pages = tables["queries"].shape[0], tables["kv_cache"].shape[0]
    k = jax.random.split(key, 5)
    q_nope, q_pe = (jax.random.normal(x, (tokens, 8, d), jnp.bfloat16) for x, d in ((k[0], 128), (k[1], 64)))
    latent, rope = (jax.random.normal(x, (tokens, d), jnp.bfloat16) for x, d in ((k[2], 128), (k[3], 64)))
    cache = jax.random.normal(k[4], (pages, 8, 2, 256), jnp.bfloat16)  # 16 slots a page, packed in pairs
    names = ("kv_lens", "block_tables", "query_start_loc", "distribution")
    return (q_nope, q_pe, latent, rope, cache, *(tables[n] for n in names)), {}


def _quantized_matmul_inputs(key):
    """bf16 activations [64, 512] times 4-bit affine weights [512, 256] packed as EasyDeL packs them."""
    from ejkernel.quantization import prepack_quantized_weights

    kx, kw = jax.random.split(key)
    weights = prepack_quantized_weights(jax.random.normal(kw, (512, 256)) / 512**0.5, bits=4, transpose=False)
    return (jax.random.normal(kx, (64, 512), jnp.bfloat16), *weights), {"bits": 4}


def demo_cases() -> list[DemoCase]:
    """Every op the demo runs: its inputs, its reference and how to read its output."""
    from ejkernel.reference import paged_attention as paged
    from ejkernel.reference.blocksparse_attention import blocksparse_attention_reference
    from ejkernel.reference.flash_attention import flash_attention_reference
    from ejkernel.reference.flash_mla import flash_mla_reference
    from ejkernel.reference.grouped_matmul import grouped_matmul_reference
    from ejkernel.reference.linear_attention import (
        delta_rule_reference,
        gla_reference,
        lightning_reference,
        linear_recurrence_reference,
    )
    from ejkernel.reference.mean_pooling import mean_pooling_reference
    from ejkernel.reference.multi_latent_ragged_page_attention import multi_latent_ragged_page_attention_reference
    from ejkernel.reference.native_sparse_attention import native_sparse_attention_reference
    from ejkernel.reference.quantized_matmul import quantized_matmul_reference
    from ejkernel.reference.ragged_gated_delta_rule import ragged_gated_delta_rule_reference
    from ejkernel.reference.state_space import state_space_v1_reference, state_space_v2_reference

    attention_reference = functools.partial(flash_attention_reference, softmax_scale=64**-0.5, causal=True)
    mesh = jax.make_mesh((len(jax.devices()),), ("sp",))
    seq_sharded = jax.sharding.PartitionSpec(None, "sp")
    ring_options = dict(causal=True, axis_name="sp", mesh=mesh, in_specs=(seq_sharded,) * 3, out_specs=seq_sharded)
    return [
        DemoCase("flash_attention", functools.partial(_attention_inputs, causal=True), attention_reference),
        DemoCase(
            "scaled_dot_product_attention", functools.partial(_attention_inputs, causal=True), attention_reference
        ),
        DemoCase(
            "attention",
            functools.partial(_attention_inputs, causal=True),
            attention_reference,
            output=lambda result: result[0],
            takes_platform=False,
        ),
        DemoCase("ring_attention", functools.partial(_attention_inputs, **ring_options), attention_reference),
        DemoCase(
            "mean_pooling",
            lambda key: ((jax.random.normal(key, (8, 1000, 256), jnp.bfloat16),), {}),
            mean_pooling_reference,
        ),
        DemoCase(
            "blocksparse_attention",
            _blocksparse_inputs,
            functools.partial(blocksparse_attention_reference, causal=True, sliding_window=(128, 0)),
        ),
        DemoCase("native_sparse_attention", _native_sparse_inputs, native_sparse_attention_reference),
        DemoCase("flash_mla", _mla_inputs, functools.partial(flash_mla_reference, causal=True)),
        DemoCase("grouped_matmul", _grouped_matmul_inputs, grouped_matmul_reference),
        DemoCase(
            "gla_attention",
            functools.partial(_linear_inputs, gates=("g",)),
            lambda *a: gla_reference(*a)[0],
            algorithm="gla",
        ),
        DemoCase(
            "lightning_attention",
            functools.partial(_linear_inputs, layer_idx=2, num_layers=8),
            lambda *a: lightning_reference(*a, layer_idx=2, num_layers=8)[0],
            algorithm="lightning_attn",
        ),
        DemoCase(
            "recurrent_attention",
            _linear_inputs,
            lambda *a: linear_recurrence_reference(*a)[0],
            algorithm="recurrent",
        ),
        DemoCase(
            "kernel_delta_attention",
            functools.partial(_linear_inputs, gates=("beta", "decay")),
            lambda *a: delta_rule_reference(*a)[0],
        ),
        DemoCase(
            "gated_delta_rule",
            functools.partial(_linear_inputs, gates=("beta", "decay")),
            lambda *a: delta_rule_reference(*a)[0],
        ),
        DemoCase("state_space_v1", _ssm_inputs, lambda *a: state_space_v1_reference(*a)[0], output=lambda r: r[0]),
        DemoCase(
            "state_space_v2",
            functools.partial(_ssm_inputs, v2=True),
            lambda *a: state_space_v2_reference(*a, n_groups=2)[0],
            output=lambda r: r[0],
        ),
        *(
            DemoCase(op, functools.partial(_serving_inputs, op=op), paged.compiled(getattr(paged, f"{op}_reference")))
            for op in ("page_attention", "prefill_page_attention", "ragged_page_attention_v2", "unified_attention")
        ),
        DemoCase(
            "ragged_decode_attention",
            functools.partial(_serving_inputs, op="ragged_decode_attention"),
            paged.compiled(functools.partial(paged.ragged_decode_attention_reference, sliding_window=128)),
        ),
        DemoCase(
            "ragged_page_attention_v3",
            functools.partial(_serving_inputs, op="ragged_page_attention_v3"),
            paged.compiled(lambda *a: paged.ragged_page_attention_v3_reference(*a)[0]),
            output=lambda result: result[0],
        ),
        DemoCase(
            "multi_latent_ragged_page_attention",
            _mla_serving_inputs,
            lambda *a: multi_latent_ragged_page_attention_reference(*a)[0],
            output=lambda result: result[0],
        ),
        DemoCase(
            "ragged_gated_delta_rule",
            _ragged_gdr_inputs,
            lambda *a: ragged_gated_delta_rule_reference(*a)[0],
            output=lambda result: result[0],
        ),
        DemoCase(
            "quantized_matmul",
            _quantized_matmul_inputs,
            functools.partial(quantized_matmul_reference, bits=4),
        ),
    ]


COLUMNS = (("op", 36), ("platform", 9), ("ran", 8), ("rel_error", 10), ("ms", 9), ("ok", 3))


def run_demo() -> int:
    """Every op on this device against its reference: one row printed as each finishes, naming the
    implementation that served it (`auto`'s choice, from the dispatch log)."""
    from ejkernel import kernel_registry
    from ejkernel.explain import dispatch_lines

    print(f"device: {jax.devices()[0].device_kind} ({jax.default_backend()})")
    print("  ".join(name.ljust(width) for name, width in COLUMNS), flush=True)
    failures = 0
    for index, case in enumerate(demo_cases()):
        args, options = case.make_inputs(jax.random.PRNGKey(index))
        expected = np.asarray(case.reference(*args), np.float64)
        here = [i.platform.value for i in kernel_registry.candidates(case.algorithm or case.op)]
        platforms = ["auto"] + (here if len(here) > 1 else [])  # with one implementation here, auto is it
        for platform in platforms if case.takes_platform else ["auto"]:
            if case.takes_platform:
                options = {**options, "platform": platform}
            fn = jax.jit(case.call(options))
            with dispatch_lines() as lines:
                out = np.asarray(jnp.asarray(fn(*args), jnp.float32), np.float64)
            served = [line.split(": ")[1].split(" serves")[0] for line in lines if " serves the call" in line]
            error = float(np.linalg.norm(out - expected) / max(np.linalg.norm(expected), 1e-30))
            ok = bool(np.isfinite(out).all()) and error < 2e-2
            failures += not ok
            seconds = time_fn(lambda f=fn, a=args: f(*a), repeats=5)
            ran = "+".join(dict.fromkeys(served)) or "-"
            row = (case.op, platform, ran, format_value(error), format_value(1e3 * seconds), "yes" if ok else "NO")
            print("  ".join(v.ljust(w) for v, (_, w) in zip(row, COLUMNS, strict=True)), flush=True)
    return 1 if failures else 0
