"""The two forms of a linear recurrence in plain JAX, each with a custom VJP whose memory is linear in length.

Both take per-token inputs in chunk layout (`xs`: arrays `[NC, B, H, C, ...]`), the initial states
`init [N, H, Dk, Dv]` and `starts [NC, B]` (the initial state a chunk enters with, -1 to carry on),
and return `(out [NC, B, H, C, Dv], exit states [NC, B, H, Dk, Dv])`, all float32.

- `chunked_scan(parts_fn, passes, ...)`: `parts_fn` reduces every chunk to `ChunkParts` in parallel;
  only the `[Dk, Dv]` states pass from chunk to chunk, in `passes` (`ScanPasses`: `lax.scan` here, GPU
  kernels on the Triton platform). The backward recomputes the parts under `jax.vjp`, walks the chunks
  in reverse for the entry-state gradients, then pulls everything back in parallel.
- `recurrent_scan(step_fn, ...)`: one token at a time (`step_fn(h, **token) -> (h, out)`), keeping
  only chunk-entry states; the backward recomputes each chunk's states and steps back through them.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from ejkernel.kernels._common.linear_attention.numerics import (
    ChunkParts,
    carry_transpose,
    chunk_carry,
    chunk_output,
    state_increment,
)


def entry_states(h_out, init, starts):
    """The state each chunk enters with: its sequence's initial state, or the previous chunk's exit state."""
    carried = jnp.concatenate([jnp.zeros_like(h_out[:1]), h_out[:-1]])
    fresh = init[jnp.maximum(starts, 0)]  # [NC, B, H, Dk, Dv]
    return jnp.where((starts >= 0)[..., None, None, None], fresh, carried)


def _zero_states(init, starts):
    return jnp.zeros((starts.shape[1], *init.shape[1:]), init.dtype)


def _enter(h, init, start):
    return jnp.where((start >= 0)[:, None, None, None], init[jnp.maximum(start, 0)], h)


def init_grad(dh_in, init, starts):
    """Gradient of the initial states: what flows into each chunk that starts a sequence."""
    picked = jnp.where((starts >= 0)[..., None, None, None], dh_in, 0.0)
    return jnp.zeros_like(init).at[jnp.maximum(starts, 0)].add(picked)


def _continues(starts):
    """`[NC, B]`: whether the next chunk carries this chunk's exit state on (no sequence starts there)."""
    return jnp.concatenate([starts[1:] < 0, jnp.zeros_like(starts[:1], bool)])


def _through(dh_next, continues):
    return jnp.where(continues[:, None, None, None], dh_next, 0.0)


class ScanPasses:
    """The two sequential passes of the chunked form, over `ChunkParts` stacked `[NC, B, H, ...]`, in `lax.scan`.

    Another platform subclasses this to run them in its own kernels (same arguments, same results).
    """

    def exit_states(self, p: ChunkParts, init, starts):
        """`[NC, B, H, Dk, Dv]`: each chunk's exit state (entered with `init[starts]` where starts >= 0)."""
        if p.w is None:  # the exit state is `decay ⊙ h + kᵀu`: the increments are computed in parallel
            increment = state_increment(p, p.u)

            def step(h, x):
                decay, inc, start = x
                h_out = decay[..., :, None] * _enter(h, init, start) + inc
                return h_out, h_out

            _, h_out = lax.scan(step, _zero_states(init, starts), (p.decay, increment, starts))
            return h_out

        def step(h, x):
            pc, start = x
            h_out = chunk_carry(pc, _enter(h, init, start))
            return h_out, h_out

        _, h_out = lax.scan(step, _zero_states(init, starts), (p._replace(q=None, scores=None, q_scale=None), starts))
        return h_out

    def entry_grads(self, p: ChunkParts, dh_own, d_exit, starts):
        """Reverse pass: `(dh_in, d_exit_total)`, the gradients of every chunk's entry and exit state.

        `dh_own`: what each chunk's outputs pass to its entry state; `d_exit`: the cotangent of the exit states.
        """

        def step(dh_next, x):  # dh_next: gradient of the next chunk's entry state
            pc, dh_own_c, d_exit_c, continues = x
            d_exit_total = d_exit_c + _through(dh_next, continues)
            dh_in = dh_own_c + carry_transpose(pc, d_exit_total)
            return dh_in, (dh_in, d_exit_total)

        transposed = p._replace(
            q=None, scores=None, u=None, k=None if p.w is None else p.k, q_scale=None, k_scale=None
        )  # what carry_transpose reads
        _, (dh_in, d_exit_total) = lax.scan(
            step, jnp.zeros_like(d_exit[0]), (transposed, dh_own, d_exit, _continues(starts)), reverse=True
        )
        return dh_in, d_exit_total


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def chunked_scan(parts_fn, passes, xs, init, starts):
    out, h_out = _chunked_forward(parts_fn, passes, xs, init, starts)
    return out, h_out


def _chunked_forward(parts_fn, passes, xs, init, starts):
    p = parts_fn(**xs)
    h_out = passes.exit_states(p, init, starts)
    return chunk_output(p, entry_states(h_out, init, starts)), h_out


def _chunked_fwd(parts_fn, passes, xs, init, starts):
    out, h_out = _chunked_forward(parts_fn, passes, xs, init, starts)
    return (out, h_out), (xs, init, starts, h_out)


def _chunked_bwd(parts_fn, passes, residuals, cotangents):
    xs, init, starts, h_out = residuals
    d_out, d_exit = cotangents
    h_in = entry_states(h_out, init, starts)
    p, parts_vjp = jax.vjp(lambda xs: parts_fn(**xs), xs)
    _, output_vjp = jax.vjp(chunk_output, p, h_in)
    dp_output, dh_own = output_vjp(d_out)
    dh_in, d_exit_total = passes.entry_grads(p, dh_own, d_exit, starts)
    _, carry_vjp = jax.vjp(chunk_carry, p, h_in)
    dp_carry, _ = carry_vjp(d_exit_total)
    # The barriers keep XLA from fusing the parts' gradients into the matmuls that consume them: JAX 0.12's
    # GPU compiler (Triton GEMM fusions) otherwise got Mamba-2's dB and dC wrong (relative error 1.0 on an
    # H200) where q and k are shared by groups of heads.
    dp_output, dp_carry = lax.optimization_barrier((dp_output, dp_carry))
    (dxs,) = parts_vjp(lax.optimization_barrier(jax.tree.map(jnp.add, dp_output, dp_carry)))
    return dxs, init_grad(dh_in, init, starts), None


chunked_scan.defvjp(_chunked_fwd, _chunked_bwd)


def _tokens(xc):
    """A chunk's per-token arrays `[B, H, C, ...]` with the token axis first, for a scan over it."""
    return {name: jnp.moveaxis(x, 2, 0) for name, x in xc.items()}


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def recurrent_scan(step_fn, xs, init, starts):
    out, h_out = _recurrent_forward(step_fn, xs, init, starts)
    return out, h_out


def _recurrent_forward(step_fn, xs, init, starts):
    def chunk(h, x):
        xc, start = x
        h_out, out = lax.scan(lambda h, tok: step_fn(h, **tok), _enter(h, init, start), _tokens(xc))
        return h_out, (jnp.moveaxis(out, 0, 2), h_out)

    _, (out, h_out) = lax.scan(chunk, _zero_states(init, starts), (xs, starts))
    return out, h_out


def _recurrent_fwd(step_fn, xs, init, starts):
    out, h_out = _recurrent_forward(step_fn, xs, init, starts)
    return (out, h_out), (xs, init, starts, h_out)


def _recurrent_bwd(step_fn, residuals, cotangents):
    xs, init, starts, h_out = residuals
    d_out, d_exit = cotangents
    h_in = entry_states(h_out, init, starts)

    def chunk(dh_next, x):
        xc, h0, d_out_c, d_exit_c, continues = x
        tokens = _tokens(xc)

        def forward(h, tok):
            return step_fn(h, **tok)[0], h

        _, h_before = lax.scan(forward, h0, tokens)  # the state before each token

        def backward(dh, x):
            tok, h, d_o = x
            _, vjp = jax.vjp(lambda h, tok: step_fn(h, **tok), h, tok)
            return vjp((dh, d_o))

        dh_in, d_tokens = lax.scan(
            backward,
            d_exit_c + _through(dh_next, continues),
            (tokens, h_before, jnp.moveaxis(d_out_c, 2, 0)),
            reverse=True,
        )
        return dh_in, ({name: jnp.moveaxis(d, 0, 2) for name, d in d_tokens.items()}, dh_in)

    _, (dxs, dh_in) = lax.scan(
        chunk, jnp.zeros_like(d_exit[0]), (xs, h_in, d_out, d_exit, _continues(starts)), reverse=True
    )
    return dxs, init_grad(dh_in, init, starts), None


recurrent_scan.defvjp(_recurrent_fwd, _recurrent_bwd)
