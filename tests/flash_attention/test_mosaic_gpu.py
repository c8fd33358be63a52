"""Mosaic GPU flash attention on CPU: its kernels lower to Mosaic GPU for CUDA; off Hopper it declines.

The kernels themselves run only on a Hopper GPU (`test_gpu.py`); lowering them for CUDA here
catches shape, layout and barrier-bookkeeping errors of every code path without one.
"""

import jax
import jax.numpy as jnp
import pytest
from jax import export

from ejkernel.kernels._pallas.gpu.flash_attention._interface import flash_attention_mosaic_gpu, mosaic_attention
from ejkernel.ops import BwdParams, FwdParams

# (query shape, key/value shape, options, sinks, (fwd block_k, dQ block_k, dK/dV block_q, stages) or None)
CASES = {
    "plain": ((1, 256, 2, 128), (1, 256, 2, 128), {}, False, None),
    "gqa-causal-odd-lengths-sinks": ((2, 300, 4, 64), (2, 200, 2, 64), {"causal": True}, True, None),
    "window-both-sides": ((1, 512, 4, 128), (1, 512, 1, 128), {"sliding_window": (100, 20)}, False, None),
    "big-tiles": ((1, 512, 2, 64), (1, 512, 2, 64), {"causal": True}, False, (256, 128, 128, 3)),
}


@pytest.mark.parametrize("case", CASES)
def test_forward_and_backward_lower_for_cuda(case):
    q_shape, kv_shape, options, sinks, tiles = CASES[case]
    params = {}
    if tiles:
        params = {
            "fwd_params": FwdParams(block_k=tiles[0], num_stages=tiles[3]),
            "bwd_params": BwdParams(block_k=tiles[1], block_q=tiles[2], num_stages=tiles[3]),
        }
    options = {"causal": False, "sliding_window": None, **options}

    def loss(q, k, v, aux):
        out = mosaic_attention(q, k, v, aux, softmax_scale=0.1, **options, **params)
        return jnp.sum(out.astype(jnp.float32))

    argnums = (0, 1, 2, 3) if sinks else (0, 1, 2)
    shapes = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in (q_shape, kv_shape, kv_shape)]
    aux = jax.ShapeDtypeStruct((q_shape[2],), jnp.float32) if sinks else None
    module = export.export(jax.jit(jax.value_and_grad(loss, argnums)), platforms=["cuda"])(*shapes, aux).mlir_module()
    assert module.count("@mosaic_gpu") >= 3  # forward, dQ and dK/dV kernels


def test_declines_what_it_cannot_serve():
    q = jnp.ones((1, 128, 2, 128), jnp.bfloat16)
    with pytest.raises(NotImplementedError, match="soft_cap"):
        flash_attention_mosaic_gpu(q, q, q, softmax_scale=1.0, logits_soft_cap=5.0)
    with pytest.raises(NotImplementedError, match="Hopper"):
        flash_attention_mosaic_gpu(q, q, q, softmax_scale=1.0)
    with pytest.raises(NotImplementedError, match="head dims"):
        mosaic_attention(q[..., :96], q[..., :96], q[..., :96], softmax_scale=1.0, causal=False, sliding_window=None)
    with pytest.raises(NotImplementedError, match="float32"):
        x = q.astype(jnp.float32)
        mosaic_attention(x, x, x, softmax_scale=1.0, causal=False, sliding_window=None)
