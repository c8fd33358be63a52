"""A wrong dtype, rank or shape that the type annotations catch is one line: `op: argument must be <layout>
with <sizes bound by the other arguments>, got <value>`; NumPy arrays are taken as JAX arrays are."""

import jax.numpy as jnp
import numpy as np
import pytest

from ejkernel import modules
from harness import assert_close, randn

pytestmark = pytest.mark.lowest

q, kv = randn((2, 16, 4, 32)), randn((2, 16, 2, 32))
CASES = {
    "flash_attention": (lambda: modules.flash_attention(q, kv[..., :16], kv), "key", "dim=32"),
    "ring_attention": (lambda: modules.ring_attention(q, kv.astype(jnp.int32), kv), "key", "float"),
    "scaled_dot_product_attention": (lambda: modules.scaled_dot_product_attention(q[0], kv, kv), "query", "batch"),
    "blocksparse_attention": (lambda: modules.blocksparse_attention(q, kv, kv[:1]), "value", "batch=2"),
    "page_attention": (
        lambda: modules.page_attention(q[:, 0], kv, kv, jnp.ones(2), jnp.zeros((2, 1), jnp.int32)),
        "context_lens",
        "int",
    ),
    "gla_attention": (lambda: modules.gla_attention(q, q, q, randn((2, 16))), "g", "dim_k=32"),
    "state_space_v2": (
        lambda: modules.state_space_v2(q, randn((4,)), randn((2, 16, 1, 8)), randn((2, 16, 1, 8)), randn((3,)), q),
        "D",
        "heads=4",
    ),
    "grouped_matmul": (lambda: modules.grouped_matmul(randn((8, 4)), randn((2, 5, 3)), jnp.array([4, 4])), "rhs", "4"),
    "flash_mla": (lambda: modules.flash_mla(q, randn((2, 16)), randn((8, 1, 16)), randn((8, 1, 16))), "key_value", "2"),
    "causal_conv1d": (lambda: modules.causal_conv1d(q[0], randn((32, 4)), randn((16,))), "bias", "channels=32"),
}


@pytest.mark.parametrize("op", CASES)
def test_type_error_is_one_line_naming_the_argument(op):
    call, argument, detail = CASES[op]
    with pytest.raises((TypeError, ValueError)) as err:
        call()
    message = str(err.value)
    assert "\n" not in message, message
    assert argument in message and detail in message, message


def test_numpy_inputs_are_taken():
    arrays = [np.asarray(x) for x in (q, kv, kv)]
    assert_close(modules.flash_attention(*arrays, causal=True), modules.flash_attention(q, kv, kv, causal=True))
