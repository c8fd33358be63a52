"""EasyDeL 0.3.0's tiny models on one CPU device through this package: forward and gradient of each
attention mechanism against EasyDeL's vanilla one (itself on our `attention`), the state-space, linear-
attention and MoE models through our ops, and greedy `generate` consistent with the forward pass."""

import functools

import jax
import numpy as np
import pytest
from easydel_models import VOCAB, build, forward_and_grad, ops_reached, relative_error, token_ids
from transformers import GenerationConfig

pytestmark = pytest.mark.skipif(len(jax.devices()) != 1, reason="runs on one device (make integration sets it)")

# The op each mechanism reaches. EasyDeL's "auto" on a CPU is vanilla attention in bfloat16.
MECHANISM_OP = {
    "vanilla": "attention",
    "auto": "attention",
    "flash_attn2": "flash_attention",
    "ring": "ring_attention",
    "sdpa": "scaled_dot_product_attention",
    "blocksparse": "blocksparse_attention",
}
CASES = [
    ("llama", "auto"),
    ("llama", "flash_attn2"),
    ("llama", "ring"),
    ("llama", "sdpa"),
    ("llama", "blocksparse"),
    ("mistral", "auto"),
    ("mistral", "ring"),
    ("gpt_oss", "auto"),
    ("gpt_oss", "flash_attn2"),
]
TOLERANCE = {"auto": 2e-2}  # bfloat16 attention; float32 otherwise: 1e-5


@functools.cache
def vanilla(name: str):
    return forward_and_grad(build(name), token_ids())


@pytest.mark.parametrize(("name", "mechanism"), CASES, ids=[f"{n}-{m}" for n, m in CASES])
def test_mechanism_agrees_with_vanilla(name, mechanism):
    with ops_reached() as ops:
        logits, grads = forward_and_grad(build(name, mechanism), token_ids())
    assert MECHANISM_OP[mechanism] in ops, ops
    expected_logits, expected_grads = vanilla(name)
    assert np.isfinite(logits).all() and np.isfinite(grads).all()
    tol = TOLERANCE.get(mechanism, 1e-5)
    assert relative_error(logits, expected_logits) < tol
    assert relative_error(grads, expected_grads) < tol


# Each model's own ops: state-space scans, the gated delta rule of Qwen3-Next's linear-attention layers,
# the grouped matmul of every mixture of experts.
MODEL_OPS = {
    "mamba": {"state_space_v1"},
    "mamba2": {"state_space_v2"},
    "qwen3_next": {"gated_delta_rule", "grouped_matmul", "attention"},
    "mixtral": {"grouped_matmul", "attention"},
}


@pytest.mark.parametrize("name", sorted(MODEL_OPS))
def test_model_runs_through_our_ops(name):
    with ops_reached() as ops:
        logits, grads = forward_and_grad(build(name), token_ids())
    assert MODEL_OPS[name] <= set(ops), ops
    assert logits.shape == (2, 32, VOCAB)
    assert np.isfinite(logits).all() and np.isfinite(grads).all() and np.abs(grads).max() > 0


@pytest.mark.parametrize("name", ["llama", "qwen3_next", "mamba2"])
def test_greedy_generate_follows_the_forward_pass(name):
    model = build(name)
    prompt = token_ids(seq=8)
    config = GenerationConfig(max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=VOCAB + 1)
    with model.mesh:
        sequences = np.asarray(model.generate(prompt, generation_config=config).sequences)
        logits = np.asarray(model(input_ids=sequences[:, :-1]).logits)
    assert sequences.shape == (2, 14) and (sequences[:, :8] == np.asarray(prompt)).all()
    np.testing.assert_array_equal(sequences[:, 8:], logits[:, 7:].argmax(-1))
