"""The causal depthwise 1-D convolution in plain JAX, which every platform shares: XLA's implementation, and the
function whose VJP is the Triton implementation's backward.

A sum of W shifted, scaled copies of the input stream. Dense `x [B, S, C]`: the history (`W - 1` zero rows, or
the newest `W - 1` columns of the state) is prepended and tap `j` reads the stream shifted by `W - 1 - j`.
Packed `x [T, C]`: every token's shifted copy `s` steps back comes from `x` where its local offset in its
sequence is at least `s`, else from its sequence's history (a gather of rows from the `[N · (W-1), C]` table of
the sequences' histories), so no shift crosses a sequence start and no Python loop runs over sequences. The
new states are gathered (`[N, C, Ws]`) and written into the pool with one `.at[].set`, dropping empty
sequences and slots outside the pool, so a donated pool is updated in place. Accumulates in float32; plain
JAX autodiff gives every gradient (a sum of shifts transposes to a sum of shifts).
"""

import jax
import jax.numpy as jnp

from ejkernel.kernels._common.bounds import clamp_packed


def _activation(y, activation):
    return y * jax.nn.sigmoid(y) if activation in ("silu", "swish") else y


def _taps(weight, bias, activation, copy):
    """`act(bias + Σ_j weight[:, j] · copy(W - 1 - j))` in float32, `copy(s)` the stream `s` steps back."""
    width = weight.shape[1]
    w = weight.astype(jnp.float32)
    y = sum(copy(width - 1 - j) * w[:, j] for j in range(width))
    if bias is not None:
        y = y + bias.astype(jnp.float32)
    return _activation(y, activation)


def _dense(x, weight, bias, conv_state, activation):
    seq, width = x.shape[1], weight.shape[1]
    if conv_state is None:
        past = jnp.zeros((x.shape[0], width - 1, x.shape[2]), jnp.float32)
    else:
        past = jnp.swapaxes(conv_state, 1, 2)[:, conv_state.shape[2] - (width - 1) :].astype(jnp.float32)
    stream = jnp.concatenate([past, x.astype(jnp.float32)], axis=1)  # [B, W-1+S, C]
    out = _taps(weight, bias, activation, lambda s: stream[:, width - 1 - s : width - 1 - s + seq]).astype(x.dtype)
    if conv_state is None:
        return out
    kept = conv_state.shape[2]
    full = jnp.concatenate([jnp.swapaxes(conv_state, 1, 2), x.astype(conv_state.dtype)], axis=1)
    return out, jnp.swapaxes(full[:, seq : seq + kept], 1, 2)


def _packed(x, weight, bias, conv_state, cu_seqlens, state_indices, activation, writers):
    tokens, channels = x.shape
    width, num_seqs = weight.shape[1], cu_seqlens.shape[0] - 1
    cu = clamp_packed(cu_seqlens, tokens).astype(jnp.int32)
    t = jnp.arange(tokens, dtype=jnp.int32)
    seq_of = jnp.searchsorted(cu[1:], t, side="right").astype(jnp.int32)  # num_seqs: past the last bound
    inside = seq_of < num_seqs
    seq_of = jnp.minimum(seq_of, num_seqs - 1)
    local = t - cu[seq_of]
    xf = x.astype(jnp.float32)

    if conv_state is not None:
        num_slots, kept = conv_state.shape[0], conv_state.shape[2]
        slots = jnp.arange(num_seqs, dtype=jnp.int32) if state_indices is None else state_indices.astype(jnp.int32)
        in_pool = (slots >= 0) & (slots < num_slots)
        history = conv_state.at[jnp.where(in_pool, slots, num_slots)].get(mode="fill", fill_value=0)  # [N, C, Ws]
        table = jnp.swapaxes(history, 1, 2)[:, kept - (width - 1) :].astype(jnp.float32)
        table = table.reshape(num_seqs * (width - 1), channels)  # row r·(W-1) + k: sequence r, k-th oldest

    def copy(s):
        if s == 0:
            return xf
        shifted = jnp.concatenate([jnp.zeros((s, channels), jnp.float32), xf])[:tokens]
        if conv_state is None:
            past = 0.0
        else:  # local < s: the history entry s - local steps before the sequence's first token
            row = seq_of * (width - 1) + (width - 1 - s) + local
            past = table[jnp.clip(row, 0, table.shape[0] - 1)]
        return jnp.where((local >= s)[:, None], shifted, past)

    out = jnp.where(inside[:, None], _taps(weight, bias, activation, copy), 0.0).astype(x.dtype)
    if conv_state is None:
        return out

    lengths = cu[1:] - cu[:-1]
    pos = lengths[:, None] + jnp.arange(kept, dtype=jnp.int32)  # [N, Ws]: in the stream history ++ tokens
    from_history = pos < kept
    old = jnp.take_along_axis(history, jnp.where(from_history, pos, 0)[:, None, :], axis=2)  # [N, C, Ws]
    rows = jnp.clip(cu[:-1, None] + pos - kept, 0, tokens - 1)
    new = jnp.swapaxes(x[rows].astype(conv_state.dtype), 1, 2)  # [N, C, Ws]
    new = jnp.where(from_history[:, None, :], old, new)
    if writers is None:
        writers = (lengths > 0) & in_pool
    target = jnp.where(writers, slots, num_slots)  # empty sequences, bad slots (and the callers' losers): dropped
    return out, conv_state.at[target].set(new, mode="drop")


def convolve(x, weight, bias, conv_state, cu_seqlens, state_indices, activation, writers=None):
    """Dense `x [B, S, C]` or packed `x [T, C]` (with `cu_seqlens [N+1]`), `weight [C, W]`, `bias [C]` or None;
    with `conv_state` (`[B, C, Ws]`, or a pool `[slots, C, Ws]` indexed by `state_indices [N]`, None: `arange(N)`)
    the result is `(out, new_state)`, else `out`. The op's canonical arguments, unchecked.

    `writers`: packed calls only, `[N]` bool, the sequences that write their slot (one per slot, chosen by the
    caller); None: every non-empty sequence whose slot is in the pool, the scatter choosing among sequences that
    share one. A caller whose forward picks a writer passes its choice, so that the pool's gradient reaches the
    tokens that forward wrote."""
    if cu_seqlens is None:
        return _dense(x, weight, bias, conv_state, activation)
    return _packed(x, weight, bias, conv_state, cu_seqlens, state_indices, activation, writers)
