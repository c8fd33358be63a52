"""The ragged gated delta rule on Hopper in Mosaic GPU kernels: the decode step, the pool stepped in place (`_decode`).

A decode batch (`query_start_loc` None: token r is request r) runs the decode kernels alone. A call with request
bounds takes, as the other implementations do, a `lax.cond` on the traced lengths: every request with at most one
token, the same kernels on the requests' tokens (read and written in place by index); otherwise Triton's chunked
form for every request (`chunked_requests`, reached by name: `ejkernel.registry.resolve`), so that prefill and
mixed batches run where they are fastest.

Not differentiable by kernels: a differentiated call runs the plain-JAX computation instead (`trained_as`). Declines
(NotImplementedError, before anything is traced, so that `auto` moves on to Triton): a pool of another dtype than
float32, bfloat16 and float16, key head dims other than 64 and 128 (the WGMMA layout's rows), value head dims that are
not a multiple of 64, GPUs other than Hopper.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ejkernel.kernels._common.checks import require_float
from ejkernel.kernels._common.device import is_hopper
from ejkernel.kernels._common.differentiation import trained_as
from ejkernel.kernels._common.linear_attention.checks import config_chunk
from ejkernel.kernels._common.linear_attention.ragged import (
    decode_or_chunked,
    ragged_delta_rule,
    require_pool_arguments,
)
from ejkernel.kernels._pallas.gpu.ragged_gated_delta_rule._decode import (
    BLOCK_V,
    MosaicGpuRaggedDecodeTiling,
    decode_batch,
    decode_requests,
)
from ejkernel.registry import resolve

WHO = "mosaic gpu ragged_gated_delta_rule"
KEY_DIMS = (64, 128)
POOL_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
TRITON_CHUNKED = "ejkernel.kernels._triton.ragged_gated_delta_rule:chunked_requests"


def _decline(query, value, beta, decay, recurrent_state, interpret: bool) -> None:
    for name, x in (("query", query), ("value", value), ("beta", beta), ("decay", decay)):
        require_float(f"{WHO}: {name}", x)
    if recurrent_state.dtype not in POOL_DTYPES:
        raise NotImplementedError(f"{WHO} steps a float32, bfloat16 or float16 state pool, got {recurrent_state.dtype}")
    if query.shape[-1] not in KEY_DIMS or value.shape[-1] % BLOCK_V:
        raise NotImplementedError(
            f"{WHO} takes dim_k in {KEY_DIMS} and dim_v a multiple of {BLOCK_V}, got {query.shape[-1]}, "
            f"{value.shape[-1]}"
        )
    if not interpret and not is_hopper():
        raise NotImplementedError(
            f"{WHO} needs a Hopper GPU (compute capability 9.x), not {jax.devices()[0].device_kind}"
        )


def ragged_gated_delta_rule_mosaic_gpu(
    query,
    key,
    value,
    beta,
    decay=None,
    recurrent_state=None,
    query_start_loc=None,
    state_indices=None,
    *,
    chunk_size: int | None = None,
    use_qk_l2norm: bool = True,
    cfg=None,
    interpret: bool = False,
):
    """`ragged_gated_delta_rule` with the decode step in Mosaic GPU kernels: `(out [T, H, Dv] in query.dtype,
    new_state in recurrent_state.dtype)`, with the XLA implementation's semantics. Arguments as the public op's
    (checked there); `cfg.chunk_size` (else `chunk_size`) is the chunk of the Triton prefill. `interpret`: interpret
    mode (tests)."""
    require_pool_arguments(recurrent_state, state_indices)
    _decline(query, value, beta, decay, recurrent_state, interpret)
    if query.shape[0] == 0 or state_indices.shape[0] == 0:
        return jnp.zeros((query.shape[0], *value.shape[1:]), query.dtype), recurrent_state
    # (interpreted, each warpgroup of each CTA is a thread: a few CTAs)
    tiling = MosaicGpuRaggedDecodeTiling.for_pool(
        recurrent_state.dtype, value.shape[-1], ctas=2 if interpret else None, interpret=interpret
    )
    l2norm, chunk_size = bool(use_qk_l2norm), config_chunk(cfg, chunk_size)

    def forward(query, key, value, beta, decay, pool, qsl, state_indices):
        inputs = (query, key, value, beta, decay)
        if qsl is None:
            return decode_batch(tiling, l2norm, *inputs, pool, state_indices)
        chunked = functools.partial(
            resolve(TRITON_CHUNKED), chunk_size=chunk_size, use_qk_l2norm=l2norm, interpret=interpret
        )
        decode = functools.partial(decode_requests, tiling, l2norm)
        return decode_or_chunked(decode, chunked, inputs, pool, qsl, state_indices)

    # a differentiated call runs the plain-JAX computation
    twin = functools.partial(ragged_delta_rule, chunk_size=chunk_size, use_qk_l2norm=l2norm)
    args = (query, key, value, beta, decay, recurrent_state, query_start_loc, state_indices)
    return trained_as(twin, forward)(*args)
