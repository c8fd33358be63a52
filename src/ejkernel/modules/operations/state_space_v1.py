"""`state_space_v1`: the Mamba-1 selective scan, on the best implementation for the device.

The public function checks the arguments and hands the scan's tensors to the executor; `conv_state`
(the caller's cache of the causal convolution that runs before the scan) never enters a kernel: it is
returned as given, so decode loops can thread both caches through one call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jaxtyping import Array, Float

from ejkernel.kernels._common.state_space import check_v1
from ejkernel.modules.operations._common import executor, typechecked
from ejkernel.ops import BwdParams, FwdParams, Invocation, Kernel, KernelConfig
from ejkernel.ops.executor import specs_by_slot
from ejkernel.registry import Backend, Platform, implementations

IMPLEMENTATIONS = implementations(
    "state_space_v1",
    (Platform.TRITON, Backend.GPU, "ejkernel.kernels._triton.state_space_v1:state_space_v1_triton"),
    (Platform.XLA, Backend.ANY, "ejkernel.kernels._xla.state_space_v1:state_space_v1_xla"),
)


@dataclasses.dataclass(frozen=True)
class ChunkedScanConfig(KernelConfig):
    """Base of both state-space configs: `chunk_size` beside the platform and the kernels' tiling.

    Attributes:
        chunk_size: Tokens per sequence block of the scan, a positive power of two; None (default): the
            implementation's default.

    Raises:
        ValueError: `chunk_size` is not a positive power of two.
    """

    chunk_size: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        size = self.chunk_size
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size <= 0 or size & (size - 1)):
            raise ValueError(f"{type(self).__name__}.chunk_size must be a positive power of two, got {size!r}")


@dataclasses.dataclass(frozen=True)
class StateSpaceV1Config(ChunkedScanConfig):
    """How `state_space_v1` runs: the platform and the scan's tiling; no field changes the result beyond rounding.

    Attributes:
        chunk_size: Tokens per sequence block (XLA: per scan step; Triton: per program), a positive power of
            two; None (default): 64. At most the sequence length (rounded up to a power of two on Triton).
        platform: `"auto"` (default: the executor chooses), `"xla"` or `"triton"`.
        fwd_params: `block_d` (channels per program of the Triton kernels, default 32), `num_warps` (4) and
            `num_stages` (2) of their forward kernels. None: defaults.
        bwd_params: `num_warps` and `num_stages` of the Triton backward kernels; None: the forward's.
        backend: `"any"` (default), `"gpu"`, `"tpu"` or `"cpu"`: the device kind the config is meant for; a
            call on another kind refuses it.

    Raises:
        ValueError: `chunk_size` is not a positive power of two, or `platform` or `backend` is unknown.
    """


class StateSpaceKernel(Kernel):
    """Base of both state-space ops' `Kernel` classes.

    Implementations return `(y, state, conv_state)`, of which the executor carries `(y, state)`; the
    sequence axis must not be sharded. Autotuning (policy `autotune`) times the default config and chunks
    of 64, 128 and 256 tokens.
    """

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
    """The executor's `Kernel` for `state_space_v1`: op id `"state_space_v1"`, config `StateSpaceV1Config`.

    On Triton, autotuning also times 16, 32 and 64 channels per program with 2 or 4 warps.
    """

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


def split_specs(op_id: str, args: Sequence[Any], in_specs, out_specs) -> tuple[Any, Any]:
    """The user's shard specs, cut to what the kernel sees: the tensors passed except `conv_state`
    (the last of `args`, returned as given), and `(y, state)` of the outputs.

    `in_specs` takes either form `specs_by_slot` does; `out_specs` is `(y, state)` or `(y, state, conv_state)`.
    """
    if in_specs is None:
        return None, out_specs
    by_slot = specs_by_slot(op_id, args, in_specs)
    kernel_specs = tuple(spec for slot, spec in sorted(by_slot.items()) if slot != len(args) - 1)
    if not isinstance(out_specs, tuple | list) or len(out_specs) not in (2, 3):
        raise ValueError(f"out_specs must be (y_spec, state_spec) or (y_spec, state_spec, conv_spec), got {out_specs}")
    return kernel_specs, tuple(out_specs[:2])


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
    """Mamba-1 selective scan over `hidden_states [batch, seq, channels]`, a `[channels, state]` state per row.

    Per token t, with `x = hidden_states` and the state `h` in float32 (`ejkernel.reference.state_space`):
    `h_t = exp(A · dt_t[:, None]) ⊙ h_{t-1} + (dt_t · x_t)[:, None] · B_t[None, :]`, `y_t = h_t C_t + D · x_t`,
    then `y ← y · act_fn(gate)` when a gate is given. `h_0` is `initial_state` (or zeros). Mixed float dtypes
    are fine: the scan runs in float32 (`A`, `D` and `dt` are often float32 beside bfloat16 activations).
    A length-1 call with `initial_state` is one decode step: chained steps give the full sequence's result.
    `conv_state` (the caller's cache of the causal convolution that runs before the scan) never enters a
    kernel: it is returned as given, so decode loops can thread both caches through one call.

    Differences from mamba_ssm's `selective_scan_fn`: the sequence comes before channels and state
    (`[batch, seq, channels]`, not `(B D L)`; B and C `[batch, seq, state]`, not `(B N L)`); B and C always
    vary per token and are shared by all channels (no `[channels, state]` or grouped forms); there is no
    `delta_bias` or `delta_softplus` (pass `softplus(dt + bias)` as `dt`); `D` is required; the final state
    is always returned, and an `initial_state` may be given.

    Args:
        hidden_states: `[batch, seq, channels]` float, the input x.
        A: `[channels, state]` float, the state matrix (negative entries decay).
        B: `[batch, seq, state]` float, the input projection of each token.
        C: `[batch, seq, state]` float, the output projection of each token.
        D: `[channels]` float, the skip connection.
        dt: `[batch, seq, channels]` float, the step sizes, already positive (no softplus is applied).
        gate: `[batch, seq, channels]` float, the gate z; None (default): no gating.
        initial_state: `[batch, channels, state]` float, the state before the first token; None (default):
            zeros.
        conv_state: Any array led by `batch`, returned unchanged; None (default).
        act_fn: The gate's activation, a callable on arrays; None (default): SiLU (`jax.nn.silu`).
        platform: `"auto"`, `"xla"` or `"triton"`; None (default): `cfg.platform`, else auto.
        cfg: A `StateSpaceV1Config` fixing platform and tiling; None (default): the executor's choice
            (cache, tuning or heuristics).
        mesh: A `jax.sharding.Mesh` to run the scan on under `shard_map`; None (default): no sharding. Needs
            `in_specs` and `out_specs`.
        in_specs: A `PartitionSpec` per tensor passed, or per positional slot (None where not passed). They
            may shard the batch or the channels; never the sequence or the state axis.
        out_specs: `(y, state)` or `(y, state, conv_state)` specs, laid out as the inputs.

    Returns:
        tuple: `(y, final_state, conv_state)`, with `y [batch, seq, channels]` in `hidden_states`' dtype;
        `final_state [batch, channels, state]` in `initial_state`'s dtype when given (keep a float32 cache
        float32), else `hidden_states`'; `conv_state` as given.

    Raises:
        TypeError: An argument of another rank, dtype kind, named size or type than above (one line naming
            it), a non-callable `act_fn`, or a `cfg` of another class.
        ValueError: `conv_state` not led by `batch`; only some of `mesh`, `in_specs`, `out_specs`, or
            `out_specs` not 2 or 3 specs; specs that shard the sequence or the state axis, or that disagree;
            a `platform` that is unknown, has no implementation on this device or contradicts
            `cfg.platform`.
        NotImplementedError: `platform="triton"` with inputs not float32, bfloat16 or float16.

    Example:
        >>> import jax, numpy as np
        >>> from ejkernel.modules import state_space_v1
        >>> rng = np.random.default_rng(0)
        >>> batch, seq, channels, state = 2, 8, 4, 3
        >>> x = rng.standard_normal((batch, seq, channels), np.float32)
        >>> A = -rng.random((channels, state), np.float32)
        >>> B, C = rng.standard_normal((2, batch, seq, state), np.float32)
        >>> D = np.ones(channels, np.float32)
        >>> dt = rng.random((batch, seq, channels), np.float32)
        >>> y, h, conv = jax.jit(state_space_v1)(x, A, B, C, D, dt)
        >>> print(y.shape, h.shape, h.dtype, conv)
        (2, 8, 4) (2, 4, 3) float32 None
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
