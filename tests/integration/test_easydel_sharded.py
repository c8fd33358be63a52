"""EasyDeL 0.3.0's attention mechanisms on a mesh of 8 CPU devices (2-way data, tensor and sequence
parallel): our ops under the shard specs EasyDeL writes, against its vanilla mechanism on the same mesh.
(EasyDeL's mixtures of experts need `ragged-all-to-all` across devices, which XLA's CPU backend lacks.)"""

import functools

import jax
import pytest
from easydel_models import build, forward_and_grad, ops_reached, relative_error, token_ids

pytestmark = pytest.mark.skipif(len(jax.devices()) != 8, reason="runs on 8 devices (make integration sets them)")

MESH = (1, 2, 1, 2, 2)  # EasyDeL's (dp, fsdp, ep, tp, sp)
OP = {
    "flash_attn2": "flash_attention",
    "ring": "ring_attention",
    "sdpa": "scaled_dot_product_attention",
    "blocksparse": "blocksparse_attention",
}
CASES = [("llama", m) for m in OP] + [("mistral", "flash_attn2"), ("mistral", "ring")]


@functools.cache
def vanilla(name: str):
    return forward_and_grad(build(name, sharding_axis_dims=MESH), token_ids(batch=4))


@pytest.mark.parametrize(("name", "mechanism"), CASES, ids=[f"{n}-{m}" for n, m in CASES])
def test_sharded_mechanism_agrees_with_vanilla(name, mechanism):
    with ops_reached() as ops:
        logits, grads = forward_and_grad(build(name, mechanism, sharding_axis_dims=MESH), token_ids(batch=4))
    assert OP[mechanism] in ops, ops
    expected_logits, expected_grads = vanilla(name)
    assert relative_error(logits, expected_logits) < 1e-5
    assert relative_error(grads, expected_grads) < 1e-5
