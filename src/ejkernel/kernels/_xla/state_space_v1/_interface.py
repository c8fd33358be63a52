"""Entry point of the XLA Mamba-1 selective scan: checks, padding to whole chunks, the epilogue."""

from __future__ import annotations

from ejkernel.checked_calls import arguments_checked
from ejkernel.kernels._common.state_space import check_v1, pad_sequence, run_scan, v1_step

from ._scan import chunked_scan

DEFAULT_CHUNK = 64


def state_space_v1_xla(
    hidden_states,
    A,
    B,
    C,
    D,
    dt,
    gate=None,
    initial_state=None,
    conv_state=None,
    *,
    act_fn=None,
    cfg=None,
):
    """Mamba-1 selective scan (see `ejkernel.reference.state_space.state_space_v1_reference`).

    Returns `(y [b, S, I], final state [b, I, N], conv_state)`. The scan runs in float32 over chunks of
    `cfg.chunk_size` tokens (default 64); memory holds `[b, chunk, I, N]` float32 at a time. A length-1
    call (with `initial_state`: a decode step) is one plain-JAX step, reading the state once.
    """
    if not arguments_checked("state_space_v1"):
        check_v1(hidden_states, A, B, C, D, dt, gate, initial_state, conv_state, act_fn=act_fn)
    (batch, seq, channels), state = hidden_states.shape, A.shape[1]
    chunk = max(1, min(getattr(cfg, "chunk_size", None) or DEFAULT_CHUNK, seq))

    def long_scan(h0):
        x_p, B_p, C_p, dt_p = pad_sequence([hidden_states, B, C, dt], chunk)
        y, h_last = chunked_scan(chunk, x_p, A, B_p, C_p, dt_p, h0)
        return y[:, :seq], h_last

    args = (hidden_states, A, B, C, D, dt, gate, initial_state, conv_state)
    return run_scan(long_scan, v1_step, *args, (batch, channels, state), act_fn=act_fn)
