"""merge_attention_states: against the reference (forward and every gradient), the union of two key sets'
attention equal to attention over all keys, empty rows, sharding and bad inputs."""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from ejkernel.modules import merge_attention_states
from ejkernel.reference.merge_attention_states import merge_attention_states_reference
from harness import assert_close, check_forward_and_grads, randn

pytestmark = pytest.mark.lowest

ROWS, HEADS, DIM = 37, 4, 16


def partial_attention(q, k, v):
    """`(out [T, H, D], lse [T, H])` of each query over the keys `k, v [S, H, D]` (S may be 0)."""
    logits = jnp.einsum("thd,shd->ths", q, k) * q.shape[-1] ** -0.5
    lse = jax.nn.logsumexp(logits, axis=-1) if k.shape[0] else jnp.full(logits.shape[:2], -jnp.inf)
    weights = jnp.exp(logits - jnp.where(jnp.isinf(lse), 0.0, lse)[..., None])
    return jnp.einsum("ths,shd->thd", weights, v), lse


def flat(fn):
    def call(*args):
        out, lse = fn(*args)
        return jnp.concatenate([out.astype(jnp.float32).ravel(), lse.ravel()])

    return call


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_matches_reference(dtype):
    args = [randn((ROWS, HEADS, DIM), dtype), randn((ROWS, HEADS), scale=3.0)] * 2
    args[2], args[3] = randn((ROWS, HEADS, DIM), dtype), randn((ROWS, HEADS), scale=3.0)
    check_forward_and_grads(
        flat(merge_attention_states), flat(merge_attention_states_reference), args, (0, 1, 2, 3), dtype
    )


def test_two_key_sets_give_attention_over_all_keys():
    q, k, v = randn((ROWS, HEADS, DIM)), randn((50, HEADS, DIM)), randn((50, HEADS, DIM))
    out, lse = merge_attention_states(*partial_attention(q, k[:13], v[:13]), *partial_attention(q, k[13:], v[13:]))
    ref_out, ref_lse = partial_attention(q, k, v)
    assert_close(out, ref_out)
    assert_close(lse, ref_lse)


def test_rows_without_keys():
    """A side with no key passes the other through; no key on either side: zeros, -inf, zero gradients."""
    q, k, v = randn((ROWS, HEADS, DIM)), randn((9, HEADS, DIM)), randn((9, HEADS, DIM))
    some, none = partial_attention(q, k, v), partial_attention(q, k[:0], v[:0])
    out, lse = merge_attention_states(*none, *some)
    assert_close(out, some[0])
    assert_close(lse, some[1])
    out, lse = merge_attention_states(*none, *none)
    assert bool(jnp.all(out == 0)) and bool(jnp.all(lse == -jnp.inf))
    grads = jax.grad(lambda o: jnp.sum(merge_attention_states(o, none[1], o, none[1])[0]))(none[0])
    assert bool(jnp.all(grads == 0))


def test_sharded_over_heads():
    mesh = jax.make_mesh((4,), ("x",), devices=jax.devices()[:4])
    args = [randn((ROWS, HEADS, DIM)), randn((ROWS, HEADS)), randn((ROWS, HEADS, DIM)), randn((ROWS, HEADS))]
    heads, rows = P(None, "x"), P(None, "x")
    out, lse = merge_attention_states(*args, mesh=mesh, in_specs=(heads, rows) * 2, out_specs=(heads, rows))
    ref_out, ref_lse = merge_attention_states_reference(*args)
    assert_close(out, ref_out)
    assert_close(lse, ref_lse)


@pytest.mark.parametrize(
    ("make", "error", "words"),
    [
        (lambda o, s: (o, s[:, :2], o, s), TypeError, "lse_a"),
        (lambda o, s: (o, s, o[..., :8], s), TypeError, "out_b"),
        (lambda o, s: (o.astype(jnp.int32), s, o, s), TypeError, "out_a"),
    ],
    ids=["lse shape", "out_b shape", "integer out"],
)
def test_errors_name_the_argument(make, error, words):
    with pytest.raises(error, match=words):
        merge_attention_states(*make(randn((ROWS, HEADS, DIM)), randn((ROWS, HEADS))))
