"""Sharded calls on two real GPUs against the same call on one GPU: forward and every gradient.

One case per op family, with the split a model uses for it: heads (tensor parallel) for attention, the
serving ops, linear attention and the state-space scan; the batch for attention, paged decode and mean
pooling; the groups for grouped matmul (expert parallel, `group_offset`). Ring attention splits the
sequence over every local GPU in `test_ring_attention.py`. Ops with `mesh=` are called with it; ops
without it (`page_attention`, `gla_attention`) run inside the user's own `jax.shard_map`, as models call
them. The mark `multigpu` skips them on a host with fewer than two GPUs.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

from ejkernel import modules
from harness import assert_close, check_forward_and_grads, randn
from linear_attention.linear_cases import joined, log_decay, write_strength
from serving_attention.paged_cases import page_attention_case, unified_case
from state_space.state_space_cases import packed, v2_inputs

pytestmark = [pytest.mark.gpu, pytest.mark.multigpu]

BF16 = jnp.bfloat16
R = P()


def two_gpus():
    return jax.make_mesh((2,), ("x",), axis_types=(AxisType.Auto,), devices=jax.devices()[:2])


def on_mesh(fn, in_specs, out_specs):
    """`fn` run by the user's own shard_map over the two GPUs (for ops without `mesh=`)."""
    return jax.shard_map(fn, mesh=two_gpus(), in_specs=in_specs, out_specs=out_specs, check_vma=False)


def attention_inputs(batch=2, seq=1024, heads=8, kv_heads=2, dim=128):
    return [randn((batch, seq, heads, dim), BF16)] + [randn((batch, seq, kv_heads, dim), BF16) for _ in range(2)]


@pytest.mark.parametrize("split", ["heads", "batch"])
def test_flash_attention(split):
    spec = P(None, None, "x") if split == "heads" else P("x")
    one = functools.partial(modules.flash_attention, causal=True)
    two = functools.partial(one, mesh=two_gpus(), in_specs=(spec,) * 3, out_specs=spec)
    check_forward_and_grads(jax.jit(two), jax.jit(one), attention_inputs(), (0, 1, 2), BF16)


@pytest.mark.parametrize("split", ["heads", "batch"])
def test_page_attention(split):
    """Decode over a shuffled paged cache: heads split (cache split with its kv heads) or sequences split."""
    args, _ = page_attention_case(
        np.random.default_rng(0), kv_lens=(900, 17, 0, 512), heads=8, kv_heads=2, dim=128, page=16, dtype=BF16
    )
    if split == "heads":
        specs, out = (P(None, "x"), P(None, "x"), P(None, "x"), R, R), P(None, "x")
    else:
        specs, out = (P("x"), R, R, P("x"), P("x")), P("x")
    assert_close(jax.jit(on_mesh(modules.page_attention, specs, out))(*args), modules.page_attention(*args), BF16)


def test_unified_attention_heads():
    """Mixed prefill and decode rows over a paged cache, with ALiBi, a query-query bias and sinks."""
    args, _ = unified_case(
        np.random.default_rng(1), q_lens=(1, 60, 0, 130, 1), kv_lens=(700, 60, 0, 300, 1), heads=8, kv_heads=2,
        dim=128, page=16, dtype=BF16,
    )  # fmt: skip
    heads, cache, per_head = P(None, "x"), P(None, None, "x"), P("x")
    specs = (heads, cache, cache, R, R, R, per_head, None, per_head)
    two = modules.unified_attention(*args, mesh=two_gpus(), in_specs=specs, out_specs=heads)
    assert_close(two, modules.unified_attention(*args), BF16)


def test_grouped_matmul_experts():
    """Each GPU holds half the experts (`group_offset` 0 and 8); a psum joins the two halves' rows."""
    sizes = jnp.asarray(np.random.default_rng(2).multinomial(4000, np.ones(16) / 16), jnp.int32)
    lhs, rhs = randn((4096, 512), BF16), randn((16, 512, 768), BF16)
    offsets = jnp.array([0, 8], jnp.int32)
    two = functools.partial(
        modules.grouped_matmul,
        mesh=two_gpus(),
        in_specs=(R, P("x"), R, P("x")),
        out_specs=R,
        out_shard_callback=lambda out: jax.lax.psum(out, "x"),
    )
    check_forward_and_grads(
        jax.jit(lambda lhs, rhs: two(lhs, rhs, sizes, offsets)),
        jax.jit(lambda lhs, rhs: modules.grouped_matmul(lhs, rhs, sizes)),
        [lhs, rhs],
        (0, 1),
        BF16,
    )


def test_gla_heads():
    q, k, v = attention_inputs(seq=1000, heads=8, kv_heads=8, dim=64)
    g = log_decay(2, 1000, 8, 64, strength=0.1)
    heads = P(None, None, "x")
    two = on_mesh(modules.gla_attention, (heads,) * 4, heads)
    check_forward_and_grads(jax.jit(two), jax.jit(modules.gla_attention), [q, k, v, g], (0, 1, 2, 3), BF16)


def test_gated_delta_rule_heads():
    q, k, v = attention_inputs(seq=1000, heads=8, kv_heads=8, dim=64)
    q, k = (x / jnp.linalg.norm(x.astype(jnp.float32), axis=-1, keepdims=True).astype(BF16) for x in (q, k))
    beta, decay = write_strength(2, 1000, 8), log_decay(2, 1000, 8, strength=0.1)
    token, head = P(None, None, "x"), P(None, "x")
    one = functools.partial(modules.gated_delta_rule, return_state=True)
    two = functools.partial(one, mesh=two_gpus(), in_specs=(token,) * 5, out_specs=(token, head))
    check_forward_and_grads(jax.jit(joined(two)), jax.jit(joined(one)), [q, k, v, beta, decay], (0, 1, 2), BF16)


def test_state_space_v2_heads():
    """Mamba-2 with its heads split and its one group of B/C replicated (that gradient sums over the GPUs)."""
    x, A, B, C, D, dt, gate, h0 = v2_inputs(seq=1000, heads=8, head_dim=64, groups=1, state=64, dtype=BF16)
    heads = P(None, None, "x")
    specs = (P(None, None, "x", None), P("x"), R, R, P("x"), heads, heads, P(None, "x"))
    one = lambda x, B, dt: modules.state_space_v2(x, A, B, C, D, dt, gate, h0)
    two = lambda x, B, dt: modules.state_space_v2(
        x, A, B, C, D, dt, gate, h0, mesh=two_gpus(), in_specs=specs, out_specs=(heads, P(None, "x"))
    )
    check_forward_and_grads(jax.jit(packed(two)), jax.jit(packed(one)), [x, B, dt], (0, 1, 2), BF16)


def test_mean_pooling_batch():
    x = randn((4, 1000, 512), BF16)
    two = modules.mean_pooling(x, mesh=two_gpus(), in_specs=(P("x"),), out_specs=P("x"))
    assert_close(two, modules.mean_pooling(x), BF16)
