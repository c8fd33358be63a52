"""`state_space_v1`: the Mamba-1 selective scan, on the best implementation for the device.

The public function checks the arguments and hands the scan's tensors to the executor; `conv_state`
(the caller's cache of the causal convolution that runs before the scan) never enters a kernel: it is
returned as given, so decode loops can thread both caches through one call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
from jaxtyping import Array, Float

from ejkernel.kernels._common.state_space import check_v1, split_specs
from ejkernel.modules.operations._common import executor, typechecked
from ejkernel.ops import BwdParams, FwdParams, Invocation, Kernel, KernelConfig


@dataclasses.dataclass(frozen=True)
class ChunkedScanConfig(KernelConfig):
    """Base of both state-space configs: `chunk_size`, tokens per sequence block of the scan (a power
    of two; None: the implementation's default), beside the platform and the kernels' tiling."""

    chunk_size: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        size = self.chunk_size
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size <= 0 or size & (size - 1)):
            raise ValueError(f"{type(self).__name__}.chunk_size must be a positive power of two, got {size!r}")


@dataclasses.dataclass(frozen=True)
class StateSpaceV1Config(ChunkedScanConfig):
    """`chunk_size`: tokens per sequence block; `fwd_params.block_d`: channels per program of the Triton
    kernels, `fwd_params` / `bwd_params` `num_warps` and `num_stages` those of their forward / backward
    kernels; the platform."""


class StateSpaceKernel(Kernel):
    """What both state-space ops tell the executor: implementations return `(y, state, conv_state)`,
    of which the executor carries `(y, state)`; the sequence axis must not be sharded."""

    def call_impl(self, impl, args, kwargs, cfg):
        y, state, _ = impl.fn(*args, cfg=cfg, **kwargs)
        return y, state

    def platform_cfgs(self, platform: str, inv: Invocation):
        yield self.config_type(platform=platform)
        for chunk in (64, 128, 256):
            yield self.config_type(platform=platform, chunk_size=chunk)

    def kwarg_specs(self, kwargs: dict[str, Any], in_specs) -> dict[str, Any]:
        """No array-valued options; refuses specs that shard the sequence (every shard would restart
        the recurrence from the initial state). The six leading tensors are always passed."""
        for name, position in (("x", 0), ("B", 2), ("C", 3), ("dt", 5)):
            spec = (*tuple(in_specs[position]), None, None)
            if spec[1] is not None:
                raise ValueError(
                    f"{self.op_id}: in_specs shard the sequence axis of {name} over {spec[1]!r}; the scan runs "
                    "along the sequence, so shard the batch or the channels/heads instead"
                )
        return {}


class StateSpaceV1(StateSpaceKernel):
    op_id = "state_space_v1"
    config_type = StateSpaceV1Config

    def axis_roles(self, args, kwargs):
        """Batch and channels split alike; the state axis N never. The sequence is the op's own check."""
        rows = ("batch", None, "features")
        inputs = {0: ("hidden_states", rows), 1: ("A", ("features", "state")), 2: ("B", ("batch", None, "state"))}
        inputs |= {3: ("C", ("batch", None, "state")), 4: ("D", ("features",)), 5: ("dt", rows), 6: ("gate", rows)}
        inputs[7] = ("initial_state", ("batch", "features", "state"))
        return inputs, (rows, ("batch", "features", None))

    def platform_cfgs(self, platform: str, inv: Invocation):
        yield from super().platform_cfgs(platform, inv)
        if platform == "triton":
            for block_d in (16, 32, 64):
                for warps in (2, 4):
                    yield StateSpaceV1Config(
                        platform=platform,
                        fwd_params=FwdParams(block_d=block_d, num_warps=warps),
                        bwd_params=BwdParams(num_warps=2 * warps),
                    )


@typechecked
def state_space_v1(
    hidden_states: Float[Array, "batch seq channels"],
    A: Float[Array, "channels state"],
    B: Float[Array, "batch seq state"],
    C: Float[Array, "batch seq state"],
    D: Float[Array, " channels"],
    dt: Float[Array, "batch seq channels"],
    /,
    gate: Float[Array, "batch seq channels"] | None = None,
    initial_state: Float[Array, "batch channels state"] | None = None,
    conv_state: Array | None = None,
    *,
    act_fn: Callable[[jax.Array], jax.Array] | None = None,
    platform: str | None = None,
    cfg: StateSpaceV1Config | None = None,
    mesh: jax.sharding.Mesh | None = None,
    in_specs: Any = None,
    out_specs: Any = None,
) -> tuple[Float[Array, "batch seq channels"], Float[Array, "batch channels state"], Array | None]:
    """Mamba-1 selective scan over `hidden_states [batch, seq, channels]` with a state `[channels, state]`.

    Per token t (`dt` already positive: no softplus is applied):
        h_t = exp(A · dt_t[:, None]) ⊙ h_{t-1} + (dt_t · x_t)[:, None] · B_t[None, :]
        y_t = h_t C_t + D · x_t,   then y ← y · act_fn(gate) when a gate is given (act_fn: SiLU by default).
    `h_0` is `initial_state` (or zeros). Returns `(y [batch, seq, channels], final state [batch, channels,
    state], conv_state)`: the state has `initial_state`'s dtype when given (keep a float32 cache float32),
    else `hidden_states`'; `conv_state` is returned unchanged. A length-1 call with `initial_state` is one
    decode step: chained steps give the full sequence's result. Mixed float dtypes are fine (the scan runs
    in float32; `A`, `D` and `dt` are often float32 beside bfloat16 activations).

    With `mesh=`, shard the batch or the channels (never the sequence); `in_specs` has one spec per
    tensor passed (or per positional slot, None where not passed), `out_specs` is `(y, state[, conv])`.
    """
    check_v1(hidden_states, A, B, C, D, dt, gate, initial_state, conv_state, act_fn=act_fn)
    tensors = (hidden_states, A, B, C, D, dt, gate, initial_state)
    kernel_in, kernel_out = split_specs("state_space_v1", (*tensors, conv_state), in_specs, out_specs)
    y, state = executor(
        StateSpaceV1(),
        *tensors,
        act_fn=act_fn,
        platform=platform,
        cfg=cfg,
        mesh=mesh,
        in_specs=kernel_in,
        out_specs=kernel_out,
    )
    return y, state, conv_state
