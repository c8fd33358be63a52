"""Tiny EasyDeL 0.3.0 models run through this package: builders, a jitted forward + gradient, and a record of
which ejkernel ops each run reached."""

import contextlib

import easydel as ed
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ejkernel.ops.executor import Executor

VOCAB = 128
ATTENTION = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)

CONFIGS = {
    "llama": (ed.LlamaConfig, ed.LlamaForCausalLM, dict(ATTENTION, num_hidden_layers=2)),
    "mistral": (ed.MistralConfig, ed.MistralForCausalLM, dict(ATTENTION, num_hidden_layers=2, sliding_window=8)),
    "mamba": (ed.MambaConfig, ed.MambaForCausalLM, dict(hidden_size=64, state_size=8, num_hidden_layers=2)),
    "mamba2": (
        ed.Mamba2Config,
        ed.Mamba2ForCausalLM,
        dict(hidden_size=64, state_size=16, num_hidden_layers=2, num_heads=8, head_dim=16, n_groups=2, chunk_size=16),
    ),
    "qwen3_next": (
        ed.Qwen3NextConfig,
        ed.Qwen3NextForCausalLM,
        dict(ATTENTION, num_hidden_layers=4, head_dim=16, full_attention_interval=2, num_experts=4)
        | dict(linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4)
        | dict(moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts_per_tok=2),
    ),
    "mixtral": (ed.MixtralConfig, ed.MixtralForCausalLM, dict(ATTENTION, num_hidden_layers=2, num_local_experts=4)),
    "gpt_oss": (
        ed.GptOssConfig,
        ed.GptOssForCausalLM,
        dict(ATTENTION, num_hidden_layers=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=8),
    ),
}


def build(name: str, mechanism: str = "vanilla", sharding_axis_dims=(1, -1, 1, 1, 1)):
    """A tiny float32 model (attention in float32 too, so mechanisms can be compared closely)."""
    config_type, model_type, fields = CONFIGS[name]
    config = config_type(vocab_size=VOCAB, max_position_embeddings=128, **fields)
    config.add_basic_configurations(
        attn_mechanism=mechanism,
        attn_dtype=jnp.float32,
        kvdtype=jnp.float32,
        blocksize_q=16,  # the block-sparse mechanism falls back to vanilla unless these divide the sequence
        blocksize_k=16,
        sharding_axis_dims=sharding_axis_dims,
    )
    return model_type(config=config, dtype=jnp.float32, param_dtype=jnp.float32, rngs=nnx.Rngs(0))


def token_ids(batch: int = 2, seq: int = 32, seed: int = 1) -> jax.Array:
    return jax.random.randint(jax.random.PRNGKey(seed), (batch, seq), 1, VOCAB)


@contextlib.contextmanager
def ops_reached():
    """The op ids of every ejkernel call traced inside the block (every public op goes through `Executor`)."""
    seen: list[str] = []
    call = Executor.__call__

    def recording(self, kernel, *args, **kwargs):
        seen.append(kernel.op_id)
        return call(self, kernel, *args, **kwargs)

    Executor.__call__ = recording
    try:
        yield seen
    finally:
        Executor.__call__ = call


def forward_and_grad(model, ids):
    """`(logits, gradient of a loss over every parameter)` as numpy, each from one jitted program."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    logits = lambda params: nnx.merge(graphdef, params, rest)(input_ids=ids).logits.astype(jnp.float32)
    loss = lambda params: jnp.mean(logits(params) * jnp.cos(jnp.arange(VOCAB)))  # every logit matters
    with model.mesh:
        out = jax.jit(logits)(params)
        grads = jax.jit(jax.grad(loss))(params)
    return np.asarray(out), np.concatenate([np.asarray(g).ravel() for g in jax.tree_util.tree_leaves(grads)])


def relative_error(actual, expected) -> float:
    return float(np.linalg.norm(actual - expected) / max(np.linalg.norm(expected), 1e-30))
