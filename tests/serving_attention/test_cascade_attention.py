"""cascade_attention: against the reference (forward and every gradient), sequences with no own token, no
prefix, sinks and soft cap, sharding over heads and sequences, and bad inputs."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from ejkernel.modules import cascade_attention
from ejkernel.reference.cascade_attention import cascade_attention_reference
from harness import assert_close, check_forward_and_grads, randn
from serving_attention.paged_cases import page_tables

H, HKV, D, PAGE = 4, 2, 16, 8


def case(lens=(5, 0, 12, 30), prefix=40, dtype=jnp.float32, seed=0):
    """`(query, prefix_key, prefix_value, key_cache, value_cache, context_lens, block_tables)`."""
    num_pages = sum(-(-n // PAGE) for n in lens) + 2
    tables = page_tables(np.random.default_rng(seed), lens, PAGE, -(-max(lens) // PAGE) + 1, num_pages, shared=0)
    tables = np.where(tables < 0, 0, tables)  # entries past a sequence's pages point anywhere
    q = randn((len(lens), H, D), dtype)
    prefix_kv = [randn((prefix, HKV, D), dtype) for _ in range(2)]
    caches = [randn((num_pages, HKV, PAGE, D), dtype) for _ in range(2)]
    return [q, *prefix_kv, *caches, jnp.asarray(lens, jnp.int32), jnp.asarray(tables)]


def reference(*args, softmax_aux=None, **options):
    return cascade_attention_reference(*args, softmax_scale=D**-0.5, softmax_aux=softmax_aux, **options)


def test_matches_reference_forward_and_grads():
    args = case(dtype=jnp.bfloat16)
    check_forward_and_grads(cascade_attention, reference, args, (0, 1, 2, 3, 4), jnp.bfloat16)


@pytest.mark.lowest
def test_sinks_soft_cap_and_empty_sides():
    args, sinks = case(), randn((H,))
    out = cascade_attention(*args, sinks, logits_soft_cap=5.0)
    assert_close(out, reference(*args, softmax_aux=sinks, logits_soft_cap=5.0))
    no_prefix = case(prefix=0)
    assert_close(cascade_attention(*no_prefix), reference(*no_prefix))


def test_sharded_over_heads_and_sequences():
    args = case()
    mesh = jax.make_mesh((2,), ("x",), devices=jax.devices()[:2])
    heads, prefix, cache = P(None, "x"), P(None, "x"), P(None, "x")
    by_heads = (heads, prefix, prefix, cache, cache, P(), P())
    by_seqs = (P("x"), P(), P(), P(), P(), P("x"), P("x"))
    for specs, out in ((by_heads, heads), (by_seqs, P("x"))):
        call = functools.partial(cascade_attention, mesh=mesh, in_specs=specs, out_specs=out)
        assert_close(call(*args), reference(*args))


@pytest.mark.lowest
@pytest.mark.parametrize(
    ("change", "error", "words"),
    [
        (lambda a: [a[0], a[1].astype(jnp.bfloat16), *a[2:]], TypeError, "prefix_key"),
        (lambda a: [a[0][:, :3], *a[1:]], ValueError, "multiple of num_kv_heads"),
        (lambda a: [*a[:5], a[5].astype(jnp.float32), a[6]], TypeError, "context_lens"),
    ],
    ids=["prefix dtype", "heads", "float lengths"],
)
def test_errors_name_the_argument(change, error, words):
    with pytest.raises(error, match=words):
        cascade_attention(*change(case()))


# ---- the Pallas-Triton path: interpret mode here, compiled in the GPU suite ----


@pytest.mark.filterwarnings("ignore:The Pallas Triton")
def test_triton_interpreted_matches_reference_and_differentiates():
    """Sinks and soft cap, a sequence with no own token; gradients through the plain-JAX core's VJP."""
    from ejkernel.kernels._triton.cascade_attention import cascade_attention_triton

    args, sinks = case(lens=(5, 0, 12)), randn((H,))
    options = dict(softmax_scale=D**-0.5, logits_soft_cap=5.0)
    fn = jax.jit(lambda *a: cascade_attention_triton(*a, sinks, interpret=True, **options))
    ref = lambda *a: cascade_attention_reference(*a, softmax_aux=sinks, **options)
    check_forward_and_grads(fn, ref, args, (0, 1, 4), jnp.float32)


def test_triton_lowers_for_cuda(cuda_lowering):
    from ejkernel.kernels._triton.cascade_attention import cascade_attention_triton

    call = functools.partial(cascade_attention_triton, softmax_scale=D**-0.5, interpret=False)
    text = jax.jit(call).trace(*case(dtype=jnp.bfloat16)).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("ejkernel_paged_attention") >= 2  # the prefix pass and the own pages' pass


@pytest.mark.gpu
def test_gpu_triton_matches_xla():
    """The issue's shape scaled down: 64 sequences sharing 2048 tokens, up to 512 of their own, 32/8 heads."""
    rng = np.random.default_rng(0)
    lens = rng.integers(0, 513, 64)
    num_pages = int(sum(-(-n // 16) for n in lens)) + 2
    tables = page_tables(rng, lens, 16, 33, num_pages, shared=0)
    q = randn((64, 32, 128), jnp.bfloat16)
    prefix = [randn((2048, 8, 128), jnp.bfloat16) for _ in range(2)]
    caches = [randn((num_pages, 8, 16, 128), jnp.bfloat16) for _ in range(2)]
    args = [q, *prefix, *caches, jnp.asarray(lens, jnp.int32), jnp.asarray(np.where(tables < 0, 0, tables))]
    fn = lambda platform: jax.jit(lambda *a: cascade_attention(*a, platform=platform))
    assert_close(fn("triton")(*args), fn("xla")(*args), jnp.bfloat16)
