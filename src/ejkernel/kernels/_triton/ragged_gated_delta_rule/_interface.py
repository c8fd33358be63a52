"""The ragged gated delta rule on the Triton platform: the decode step fused on the pool in place, prefill and
mixed batches in the gated delta rule's chunked form, packed and unpacked by kernels of their own (`_prefill`).

As the XLA implementation (`_common.linear_attention.ragged`), `lax.cond` on the traced lengths picks the
path: every request with at most one token, the decode kernel (`_decode`: each program reads its request's
slot tile from the pool and writes it back in place; no gather, no scatter); otherwise every request in the
packed chunked form (`_prefill`: entering from its slot of the pool, its final state written back by
`scatter_first`). Both paths return the outputs in the query's dtype (no float32 copy crosses the `lax.cond`).
The `lax.cond` costs the prefill little (2.014 ms against 2.004 without it on an H200, 8 x 2048 tokens) and
spares a decode batch the chunked form. The requests (clamped bounds, dropped slots, the first writer of each
slot) are read once, in XLA, by `requests`, so both paths have the XLA path's semantics. A call without
`query_start_loc` is a decode batch by contract (token i is request i): the decode kernel alone, no `lax.cond`
(whose predicate XLA reads on the host: 25 us of a 363 us step on an H200) and no placing of the outputs.

Not differentiable by kernels: a differentiated call runs the plain-JAX computation instead, forward and
backward (`trained_as`), so `jax.grad` through the op gives XLA's gradient. Declines (NotImplementedError)
head dims that are not powers of two in [16, 256].
"""

from __future__ import annotations

import functools

import jax.numpy as jnp

from ejkernel.kernels._common.checks import require_float
from ejkernel.kernels._common.differentiation import trained_as
from ejkernel.kernels._common.linear_attention.checks import config_chunk
from ejkernel.kernels._common.linear_attention.ragged import (
    decode_modes,
    decode_or_chunked,
    decode_token,
    place_decoded,
    ragged_delta_rule,
    require_pool_arguments,
    scatter_first,
)
from ejkernel.kernels._triton._helpers import resolve_interpret
from ejkernel.kernels._triton.linear_attention._delta import RUN_CHUNK
from ejkernel.kernels._triton.linear_attention._gla_common import TritonGlaTiling
from ejkernel.kernels._triton.ragged_gated_delta_rule._decode import (
    TritonRaggedDecodeTiling,
    decode_step,
)
from ejkernel.kernels._triton.ragged_gated_delta_rule._prefill import packed_delta

WHO = "triton ragged_gated_delta_rule"
# Triton's smallest matmul edge. The chunk of a call that names none is the largest the prefill runs, the dense
# form's one-pass limit (`RUN_CHUNK`): its one sequential pass makes the chunk's outputs too, and from 64 tokens a
# chunk the scores, queries and keys beside the state spill (H200, 8 x 2048 tokens, H 32, D 128, session 57: 0.97 ms
# at 32 against 1.79 at 64, of which the pass 0.54 against 1.19); a larger chunk asked for (EasyDeL asks for 64) runs
# as 32, changing only the rounding.
MIN_CHUNK = 16


def _chunk(chunk_size: int | None, num_tokens: int) -> int:
    """The prefill's chunk: `chunk_size` (None: `RUN_CHUNK`) rounded up to a power of two in [16, 32], no longer
    than the tokens need (the chunk changes only the rounding)."""
    size = 1 << max(0, (chunk_size or RUN_CHUNK) - 1).bit_length()
    return max(MIN_CHUNK, min(size, RUN_CHUNK, 1 << max(0, num_tokens - 1).bit_length()))


def _decline(query, value, beta, decay, recurrent_state) -> None:
    for name, x in (("query", query), ("value", value), ("beta", beta), ("decay", decay), ("state", recurrent_state)):
        require_float(f"{WHO}: {name}", x)
    for name, size in (("dim_k", query.shape[-1]), ("dim_v", value.shape[-1])):
        if size < 16 or size > 256 or size & (size - 1):
            raise NotImplementedError(f"{WHO} takes {name} a power of two in [16, 256], got {size}")


def _decode(tiling: TritonRaggedDecodeTiling, use_qk_l2norm: bool, inputs, pool, req):
    """The decode path of a call with requests, the kernels on the pool in place: `(out [T, H, Dv] in the query's
    dtype, new pool)`."""
    num_tokens = inputs[0].shape[0]
    token = decode_token(req.bounds, num_tokens)
    mode = decode_modes(req.writes, req.live)
    out, pool = decode_step(tiling, use_qk_l2norm, *inputs, pool, token, req.slots, mode)
    return place_decoded(out, token, req.live, num_tokens), pool


def _decode_batch(tiling: TritonRaggedDecodeTiling, use_qk_l2norm: bool, inputs, pool, state_indices):
    """A call without `query_start_loc`: token i is request i, on slot `state_indices[i]`; the kernels decide
    which requests read and write (no XLA work before them)."""
    token = jnp.arange(state_indices.shape[0], dtype=jnp.int32)
    return decode_step(tiling, use_qk_l2norm, *inputs, pool, token, state_indices.astype(jnp.int32))


def chunked_requests(inputs, pool, req, *, chunk_size: int | None, use_qk_l2norm: bool, interpret: bool | None):
    """Every request of `req` (`_common`'s `Requests`) in the packed chunked form, the prefill path of a call with
    request bounds: `(out [T, H, Dv] in the query's dtype, new pool)`; `inputs` is `(query, key, value, beta,
    decay)`. This implementation's prefill branch, and where the Mosaic GPU implementation hands its calls with a
    request longer than one token, by name (`ejkernel.registry.resolve`). Declines as this implementation does."""
    query, _, value, beta, decay = inputs
    _decline(query, value, beta, decay, pool)
    gla = TritonGlaTiling(interpret=resolve_interpret(interpret, WHO), precise=jnp.dtype(value.dtype) == jnp.float32)
    gla = gla.fit(query.shape[-1], value.shape[-1])
    chunk = _chunk(chunk_size, query.shape[0])
    out, final = packed_delta(gla, chunk, bool(use_qk_l2norm), inputs, req, pool)
    return out, scatter_first(pool, req.slots, final, req.live)


def _forward(decode_tiling, prefill, use_qk_l2norm, query, key, value, beta, decay, pool, qsl, state_indices):
    inputs = (query, key, value, beta, decay)
    if qsl is None:
        return _decode_batch(decode_tiling, use_qk_l2norm, inputs, pool, state_indices)
    decode = functools.partial(_decode, decode_tiling, use_qk_l2norm)
    return decode_or_chunked(decode, prefill, inputs, pool, qsl, state_indices)


def ragged_gated_delta_rule_triton(
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
    interpret: bool | None = None,
):
    """`ragged_gated_delta_rule` in Pallas-Triton kernels: `(out [T,H,Dv] in query.dtype, new_state in
    recurrent_state.dtype)`, with the XLA implementation's semantics (`ragged_delta_rule`).

    Arguments as the public op's (checked there); `cfg.chunk_size` wins over `chunk_size` (rounded to a power
    of two in [16, 32]); `cfg.fwd_params.block_d` and `num_warps`: the decode kernel's value columns per
    program (default 64) and warps (default 4). `interpret` forces Pallas interpret mode.
    """
    require_pool_arguments(recurrent_state, state_indices)
    _decline(query, value, beta, decay, recurrent_state)
    interpret = resolve_interpret(interpret, WHO)
    num_tokens = query.shape[0]
    if num_tokens == 0 or state_indices.shape[0] == 0:
        return jnp.zeros((num_tokens, *value.shape[1:]), query.dtype), recurrent_state
    params = getattr(cfg, "fwd_params", None)
    decode_tiling = TritonRaggedDecodeTiling(
        block_v=(params and params.block_d) or TritonRaggedDecodeTiling.block_v,
        num_warps=(params and params.num_warps) or TritonRaggedDecodeTiling.num_warps,
        interpret=interpret,
    )
    l2norm, chunk_size = bool(use_qk_l2norm), config_chunk(cfg, chunk_size)
    options = dict(chunk_size=chunk_size, use_qk_l2norm=l2norm, interpret=interpret)
    prefill = functools.partial(chunked_requests, **options)
    forward = functools.partial(_forward, decode_tiling, prefill, l2norm)
    # a differentiated call runs the plain-JAX computation
    twin = functools.partial(ragged_delta_rule, chunk_size=chunk_size, use_qk_l2norm=l2norm)
    return trained_as(twin, forward)(query, key, value, beta, decay, recurrent_state, query_start_loc, state_indices)
