"""Sharded calls whose specs would change the answer are refused by name (`ops/axis_roles.py`): a split
of an axis the op computes across, axes of one role split unlike each other, out_specs that place the
result otherwise than the inputs decide. Each case was a silent wrong answer before."""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from ejkernel import modules
from harness import assert_close, randn

pytestmark = pytest.mark.lowest

R, ROWS, HEADS = P(), P("x"), P(None, None, "x")
q, k, v = randn((4, 16, 8, 16)), randn((4, 16, 4, 16)), randn((4, 16, 4, 16))
sinks = randn((8,))


def mesh():
    return jax.make_mesh((4,), ("x",), devices=jax.devices()[:4])


def flash(*tensors, in_specs, out_specs=HEADS, **kw):
    return modules.flash_attention(*tensors, mesh=mesh(), in_specs=in_specs, out_specs=out_specs, **kw)


CASES = {
    "query heads split, key/value heads not": (lambda: flash(q, k, v, in_specs=(HEADS, R, R)), "key's axis 2 (heads)"),
    "per-head sinks not split with the heads": (
        lambda: flash(q, k, v, None, None, None, sinks, in_specs=(HEADS,) * 3 + (None,) * 3 + (R,)),
        "softmax_aux's axis 0 (heads)",
    ),
    "head dim split": (lambda: flash(q, k, v, in_specs=(P(None, None, None, "x"),) * 3), "(dim)"),
    "out_specs unlike the inputs'": (lambda: flash(q, k, v, in_specs=(ROWS,) * 3), "out_specs"),
    "kv heads that the shards do not divide": (
        lambda: flash(q, k[:, :, :2], v[:, :, :2], in_specs=(HEADS,) * 3),
        "do not divide",
    ),
    "sdpa key sequence split": (
        lambda: modules.scaled_dot_product_attention(
            q, k, v, mesh=mesh(), in_specs=(R, P(None, "x"), P(None, "x")), out_specs=R
        ),
        "key's axis 1 (seq)",
    ),
    "delta rule key channels split": (
        lambda: modules.gated_delta_rule(
            q, q, q, randn((4, 16, 8)), mesh=mesh(), in_specs=(P(None, None, None, "x"),) * 2 + (R, R), out_specs=R
        ),
        "(state)",
    ),
    "mean pooling over a split sequence": (
        lambda: modules.mean_pooling(randn((4, 16, 8)), mesh=mesh(), in_specs=(P(None, "x"),), out_specs=R),
        "x's axis 1 (seq)",
    ),
    "ragged v2 heads split inside a K/V pair": (  # (a ZeroDivisionError deep in the core before)
        lambda: modules.ragged_page_attention_v2(
            randn((6, 8, 16)),
            randn((8, 4, 4, 16)),  # two K/V heads, interleaved: four entries
            jnp.array([5, 7]),
            jnp.array([[0, 1, 2, 3], [4, 5, 6, 7]]),
            jnp.array([0, 3, 6]),
            jnp.array([2]),
            mesh=mesh(),
            in_specs=(P(None, "x"), HEADS, R, R, R, R),
            out_specs=P(None, "x"),
        ),
        "whole groups of 2",
    ),
    "ring attention batch split, out_specs whole": (  # (shard 0's batch came back, failing the return type)
        lambda: modules.ring_attention(
            q,
            k,
            v,
            axis_name="sp",
            mesh=jax.make_mesh((2, 2), ("d", "sp"), devices=jax.devices()[:4]),
            in_specs=(P("d", "sp"),) * 3,
            out_specs=P(None, "sp"),
        ),
        "out_specs",
    ),
    "ring attention query batch split, key batch not": (
        lambda: modules.ring_attention(
            q,
            q,
            q,
            axis_name="sp",
            mesh=jax.make_mesh((2, 2), ("d", "sp"), devices=jax.devices()[:4]),
            in_specs=(P("d", "sp"), P(None, "sp"), P(None, "sp")),
            out_specs=P("d", "sp"),
        ),
        "key's axis 0 (batch)",
    ),
    "grouped matmul columns split, out_specs whole": (  # (shard 0's columns came back, [M, N / 4])
        lambda: modules.grouped_matmul(
            randn((8, 16)), randn((2, 16, 8)), jnp.array([3, 5]), mesh=mesh(), in_specs=(R, HEADS, R), out_specs=R
        ),
        "out_specs",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_specs_that_change_the_answer_are_refused(case):
    call, words = CASES[case]
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        call()


def test_heads_split_with_their_sinks_and_features_alone():
    out = flash(q, k, v, None, None, None, sinks, in_specs=(HEADS,) * 3 + (None,) * 3 + (P("x"),))
    assert_close(out, modules.flash_attention(q, k, v, None, None, None, sinks))
    x = randn((4, 16, 8, 4))  # one of two feature axes split: each is a role of its own
    pooled = modules.mean_pooling(x, mesh=mesh(), in_specs=(P(None, None, "x"),), out_specs=P(None, "x"))
    assert_close(pooled, jnp.mean(x, axis=1))
