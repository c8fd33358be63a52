"""Reference merge of two partial attention results over disjoint key sets, in float32."""

import jax.numpy as jnp


def merge_attention_states_reference(out_a, lse_a, out_b, lse_b):
    """`(out, lse)` of attention over the union of two disjoint key sets, from each set's result.

    `out_* [..., D]` are softmax-weighted value sums and `lse_* [...]` (shaped `out_*.shape[:-1]`) the natural
    log-sum-exp of their logits, -inf for a row with no key. The union's weights are `exp(lse_x - lse)`, with
    `lse = log(exp(lse_a) + exp(lse_b))`; a row with no key in either gives zeros and -inf.
    """
    out_a, out_b = jnp.asarray(out_a, jnp.float32), jnp.asarray(out_b, jnp.float32)
    lse_a, lse_b = jnp.asarray(lse_a, jnp.float32), jnp.asarray(lse_b, jnp.float32)
    lse = jnp.logaddexp(lse_a, lse_b)
    empty = lse == -jnp.inf
    weight = lambda x: jnp.where(empty, 0.0, jnp.exp(x - jnp.where(empty, 0.0, lse)))[..., None]
    return out_a * weight(lse_a) + out_b * weight(lse_b), lse
