"""Reference causal depthwise 1-D convolution: one sequence at a time, each token's window of W inputs, in float32.

`out[t, c] = act(bias[c] + Σ_j weight[c, j] · stream[t - (W-1) + j, c])`: tap `W-1` is the current token's,
tap 0 the one `W-1` tokens back. A sequence's stream is its history (a state `[C, Ws]`, channels first, the
newest input in column `Ws - 1`; zeros without one) followed by its tokens; its new state is the stream's
last `Ws` inputs.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np


def _activation(y, activation):
    return y * jax.nn.sigmoid(y) if activation in ("silu", "swish") else y


def _one_sequence(x, weight, bias, history, activation):
    """`x [L, C]`, `history [C, Ws]` or None -> (`out [L, C]` float32, new state `[C, Ws]` or None)."""
    width = weight.shape[1]
    past = jnp.zeros((width - 1, x.shape[1]), jnp.float32) if history is None else history.T.astype(jnp.float32)
    stream = jnp.concatenate([past, x.astype(jnp.float32)])
    start = stream.shape[0] - x.shape[0] - (width - 1)  # the first output's first tap, in the stream
    windows = stream[start + np.arange(x.shape[0])[:, None] + np.arange(width)]  # [L, W, C]: token t's inputs
    y = jnp.sum(windows * weight.T.astype(jnp.float32), axis=1)
    out = _activation(y if bias is None else y + bias.astype(jnp.float32), activation)
    new_state = None if history is None else stream[stream.shape[0] - history.shape[1] :].T
    return out, new_state


def causal_conv1d_reference(
    x, weight, bias=None, *, activation=None, cu_seqlens=None, conv_state=None, state_indices=None
):
    """Dense `x [B, S, C]` (`conv_state [B, C, Ws]`), or packed `x [T, C]` with `cu_seqlens [N+1]` (a pool
    `conv_state [slots, C, Ws]` and `state_indices [N]`, default `arange(N)`).

    Returns `out` (float32; zeros for tokens past `cu_seqlens[-1]`), or `(out, new_state)` with `conv_state`:
    each non-empty sequence's slot (row) holds the last `Ws` inputs of its stream; other slots are unchanged.
    """
    if cu_seqlens is None:
        outs, states = [], []
        for b in range(x.shape[0]):
            out, state = _one_sequence(x[b], weight, bias, None if conv_state is None else conv_state[b], activation)
            outs.append(out)
            states.append(state)
        out = jnp.stack(outs)
        return out if conv_state is None else (out, jnp.stack(states).astype(conv_state.dtype))
    bounds = np.asarray(cu_seqlens)
    slots = np.arange(len(bounds) - 1) if state_indices is None else np.asarray(state_indices)
    out = jnp.zeros(x.shape, jnp.float32)
    new_pool = conv_state
    for r, (start, end) in enumerate(itertools.pairwise(bounds)):
        history = None if conv_state is None else conv_state[slots[r]]
        seq_out, state = _one_sequence(x[start:end], weight, bias, history, activation)
        out = out.at[start:end].set(seq_out)
        if conv_state is not None and end > start:
            new_pool = new_pool.at[slots[r]].set(state.astype(conv_state.dtype))
    return out if conv_state is None else (out, new_pool)
