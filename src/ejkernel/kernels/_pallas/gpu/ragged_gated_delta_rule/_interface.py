"""The ragged gated delta rule on Hopper in Mosaic GPU kernels: decode batches (`query_start_loc` None: token r is
request r), the pool stepped in place (`_decode`). Calls with request bounds (prefill, mixed batches) are declined
(NotImplementedError, before anything is traced), so that `auto` moves on to Triton's chunked kernels.

Not differentiable by kernels: a differentiated call runs the plain-JAX computation instead (`trained_as`). Also
declines: a pool that is not float32, key head dims other than 64 and 128 (the WGMMA layout's rows), value head dims
that are not a multiple of 64, GPUs other than Hopper.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ejkernel.kernels._common.checks import require_float
from ejkernel.kernels._common.device import is_hopper
from ejkernel.kernels._common.differentiation import trained_as
from ejkernel.kernels._common.linear_attention.ragged import (
    DEFAULT_CHUNK,
    ragged_delta_rule,
    require_pool_arguments,
)
from ejkernel.kernels._pallas.gpu.ragged_gated_delta_rule._decode import (
    BLOCK_V,
    MosaicGpuRaggedDecodeTiling,
    decode_batch,
)

WHO = "mosaic gpu ragged_gated_delta_rule"
KEY_DIMS = (64, 128)


def _decline(query, value, beta, decay, recurrent_state, query_start_loc, interpret: bool) -> None:
    if query_start_loc is not None:
        raise NotImplementedError(f"{WHO} serves decode batches (query_start_loc None), not request bounds")
    for name, x in (("query", query), ("value", value), ("beta", beta), ("decay", decay)):
        require_float(f"{WHO}: {name}", x)
    if recurrent_state.dtype != jnp.float32:
        raise NotImplementedError(f"{WHO} steps a float32 state pool, got {recurrent_state.dtype}")
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
    chunk_size: int = DEFAULT_CHUNK,
    use_qk_l2norm: bool = True,
    cfg=None,
    interpret: bool = False,
):
    """`ragged_gated_delta_rule` of a decode batch in Mosaic GPU kernels: `(out [T, H, Dv] in query.dtype, new_state
    float32)`, with the XLA implementation's semantics. Arguments as the public op's (checked there); `cfg` and
    `chunk_size` are not read (a decode batch has no chunks). `interpret`: Mosaic GPU interpret mode (tests)."""
    del cfg
    require_pool_arguments(recurrent_state, state_indices)
    _decline(query, value, beta, decay, recurrent_state, query_start_loc, interpret)
    if query.shape[0] == 0:
        return jnp.zeros((0, *value.shape[1:]), query.dtype), recurrent_state
    # (interpreted, each warpgroup of each CTA is a thread: a few CTAs)
    tiling = MosaicGpuRaggedDecodeTiling(ctas=2 if interpret else None, interpret=interpret)

    def forward(query, key, value, beta, decay, pool, _, state_indices):
        return decode_batch(tiling, bool(use_qk_l2norm), query, key, value, beta, decay, pool, state_indices)

    # a differentiated call runs the plain-JAX computation
    twin = functools.partial(ragged_delta_rule, chunk_size=chunk_size, use_qk_l2norm=bool(use_qk_l2norm))
    return trained_as(twin, forward)(query, key, value, beta, decay, recurrent_state, None, state_indices)
