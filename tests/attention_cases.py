"""Case builders shared by the flash attention kernel tests: random segments, one checked call per case.

Each kernel's test module binds `run_attention_case` to its implementation and head counts, so the
cases stay comparable across platforms.
"""

import jax
import jax.numpy as jnp
import numpy as np

from ejkernel.ops.config import BwdParams, FwdParams
from ejkernel.reference.flash_attention import flash_attention_reference
from harness import check_forward_and_grads, randn

# Small blocks, so ragged test lengths run several blocks, partial blocks and the block-skipping paths.
SMALL = dict(fwd_params=FwdParams(block_q=32, block_k=32), bwd_params=BwdParams(block_q=32, block_k=32))


def segments(batch, length, num_segments=3, pad=0, key=0):
    """Sorted random segment ids in [0, num_segments) with the last `pad` positions set to -1."""
    rng = np.random.default_rng(key)
    ids = np.sort(rng.integers(0, num_segments, (batch, length)), axis=1).astype(np.int32)
    if pad:
        ids[:, length - pad :] = -1
    return jnp.asarray(ids)


def run_attention_case(
    impl,
    *,
    batch=1,
    q_len=100,
    kv_len=63,
    heads,
    kv_heads,
    head_dim=32,
    value_dim=None,
    dtype=jnp.float32,
    bias_shape=None,
    num_sinks=None,
    segments=None,
    mask=None,
    params=SMALL,
    fwd_tol=None,
    grad_tol=None,
    **options,
):
    """Random inputs -> `impl`'s forward and the gradient of every float input checked against the reference.

    Returns the jitted call and its arguments, for tests that look further at the output.
    """
    value_dim = value_dim or head_dim
    q = randn((batch, q_len, heads, head_dim), dtype)
    k = randn((batch, kv_len, kv_heads, head_dim), dtype)
    v = randn((batch, kv_len, kv_heads, value_dim), dtype)
    bias = None if bias_shape is None else randn(bias_shape, dtype)
    aux = None if num_sinks is None else randn((num_sinks,), jnp.float32)
    static = dict(softmax_scale=head_dim**-0.5, attention_mask=mask, **options)
    if segments is not None:
        static.update(q_segment_ids=segments[0], kv_segment_ids=segments[1])

    fn = jax.jit(lambda q, k, v, bias, aux: impl(q, k, v, bias, aux, **static, **params))
    ref = jax.jit(lambda q, k, v, bias, aux: flash_attention_reference(q, k, v, bias, aux, **static))
    args = (q, k, v, bias, aux)
    argnums = tuple(i for i, a in enumerate(args) if a is not None)
    check_forward_and_grads(fn, ref, args, argnums, dtype, fwd_tol=fwd_tol, grad_tol=grad_tol)
    return fn, args
