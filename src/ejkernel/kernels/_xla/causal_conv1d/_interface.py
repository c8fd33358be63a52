"""Causal depthwise 1-D convolution in plain JAX (`kernels/_common/causal_conv1d`, which the Triton implementation's
backward shares); plain JAX autodiff gives every gradient."""

from ejkernel.kernels._common.causal_conv1d import convolve

WHO = "xla causal_conv1d"


def causal_conv1d_xla(
    x, weight, bias=None, conv_state=None, cu_seqlens=None, state_indices=None, *, activation=None, cfg=None
):
    """Dense `x [B, S, C]` or packed `x [T, C]` (with `cu_seqlens [N+1]`), `weight [C, W]`, `bias [C]`;
    with `conv_state` (`[B, C, Ws]`, or a pool `[slots, C, Ws]` indexed by `state_indices [N]`) the result
    is `(out, new_state)`, else `out`. The arguments are the op's canonical ones, checked by the public
    function; `cfg` is not read."""
    del cfg
    return convolve(x, weight, bias, conv_state, cu_seqlens, state_indices, activation)
