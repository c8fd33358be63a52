"""Calls with nothing in them (no rows, no tokens or no keys) return outputs of the right shape, all zeros,
instead of failing inside an implementation."""

import jax
import jax.numpy as jnp
import pytest

from ejkernel import modules
from harness import randn

pytestmark = pytest.mark.lowest


def i32(values):
    return jnp.asarray(values, jnp.int32)


q, k, v = randn((2, 8, 4, 16)), randn((2, 8, 2, 16)), randn((2, 8, 2, 16))
CALLS = {
    "attention, no queries": (lambda: modules.attention(q[:, :0], k, v)[0], (2, 0, 4, 16)),
    "attention, no keys": (lambda: modules.attention(q, k[:, :0], v[:, :0])[0], (2, 8, 4, 16)),
    "attention, no rows": (lambda: modules.attention(q[:0], k[:0], v[:0])[0], (0, 8, 4, 16)),
    "page_attention, no sequences": (
        lambda: modules.page_attention(
            randn((0, 4, 8)), randn((5, 2, 4, 8)), randn((5, 2, 4, 8)), i32([]), i32(jnp.zeros((0, 2)))
        ),
        (0, 4, 8),
    ),
    "ragged_decode_attention, no keys": (
        lambda: modules.ragged_decode_attention(q[:, 0], k[:, :0], v[:, :0], i32([0, 0]), i32([0, 0])),
        (2, 4, 16),
    ),
    "blocksparse_attention, no rows": (
        lambda: modules.blocksparse_attention(randn((0, 4, 128, 16)), randn((0, 2, 128, 16)), randn((0, 2, 128, 16))),
        (0, 4, 128, 16),
    ),
    "native_sparse_attention, no tokens": (
        lambda: modules.native_sparse_attention(q[:, :0], k[:, :0], v[:, :0]),
        (2, 0, 4, 16),
    ),
    "state_space_v1, no rows": (
        lambda: modules.state_space_v1(
            randn((0, 16, 8)), -jnp.ones((8, 4)), randn((0, 16, 4)), randn((0, 16, 4)), randn((8,)), randn((0, 16, 8))
        )[0],
        (0, 16, 8),
    ),
    "causal_conv1d, no tokens": (lambda: modules.causal_conv1d(randn((2, 0, 8)), randn((8, 4))), (2, 0, 8)),
    "mean_pooling, no tokens": (lambda: modules.mean_pooling(randn((2, 0, 8))), (2, 8)),
}


@pytest.mark.parametrize("case", CALLS)
def test_empty_call_gives_zeros(case):
    call, shape = CALLS[case]
    out = jax.block_until_ready(call())
    assert out.shape == shape and bool(jnp.all(out == 0))
