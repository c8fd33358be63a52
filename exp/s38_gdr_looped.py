"""Session 38's trial: the GDR decode's writers looping over `per` heads of a request in one program, so that
Triton's software pipeline (`num_stages`) may load the next head's tile while one computes (the readers' kernel and
the step are `_triton/ragged_gated_delta_rule/_decode.py`'s). Timed by `exp/s38_gdr_decode.py --looped`.
"""

import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from ejkernel.kernels._common.vma import out_struct
from ejkernel.kernels._triton.ragged_gated_delta_rule._decode import IDLE, WRITES, _readers_kernel, _step


def _looped_writers(token_ref, slot_ref, mode_ref, q_ref, k_ref, v_ref, beta_ref, *refs, per, **s):
    decay_ref, refs = (refs[0], refs[1:]) if s["has_decay"] else (None, refs)
    pool_ref, _, out_ref, new_pool_ref = refs
    r, group, tile = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    bv = s["block_v"]
    cols = pl.ds(pl.multiple_of(tile * bv, bv), bv)
    mode = mode_ref[r]
    step_refs = (token_ref, slot_ref, q_ref, k_ref, v_ref, beta_ref, decay_ref, pool_ref, out_ref, new_pool_ref)

    @pl.when(mode == WRITES)
    def _():
        def body(j, carry):
            _step(step_refs, r, group * per + j, cols, s)
            return carry

        lax.fori_loop(0, per, body, 0)

    @pl.when(mode == IDLE)
    def _():
        def body(j, carry):
            out_ref[r, group * per + j, cols] = jnp.zeros((bv,), out_ref.dtype)
            return carry

        lax.fori_loop(0, per, body, 0)


def decode_step(block_v, warps, per, stages, query, key, value, beta, decay, pool, token, slot, interpret=False):
    """A decode batch (modes decided by the readers' kernel), the writers looping over `per` heads."""
    num_requests, heads, dv = token.shape[0], query.shape[1], value.shape[-1]
    tokens = [query, key, value, beta] + ([] if decay is None else [decay])
    static = dict(block_v=block_v, l2norm=True, scale=query.shape[-1] ** -0.5, has_decay=decay is not None)
    index = [token, slot]
    out_shape = out_struct((num_requests, heads, dv), query.dtype, *index, *tokens, pool)
    readers = pl.pallas_call(
        functools.partial(_readers_kernel, heads=heads, tiles=dv // block_v, modes_given=False, **static),
        grid=(num_requests,),
        out_shape=[out_shape, out_struct((num_requests,), jnp.int32, *index, *tokens, pool)],
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1),
        interpret=interpret,
    )
    out, modes = readers(*index, *tokens, pool)
    index = [token, slot, modes]
    aliased = len(index) + len(tokens)
    writers = pl.pallas_call(
        functools.partial(_looped_writers, per=per, **static),
        grid=(num_requests, heads // per, dv // block_v),
        out_shape=[out_shape, out_struct(pool.shape, pool.dtype, *index, *tokens, pool)],
        input_output_aliases={aliased + 1: 0, aliased: 1},
        compiler_params=plgpu.CompilerParams(num_warps=warps, num_stages=stages),
        interpret=interpret,
    )
    return writers(*index, *tokens, pool, out)
