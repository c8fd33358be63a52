"""`state_space_v2`: the Mamba-2 (SSD) scan, on the best implementation for the device.

Shares its executor plumbing with `state_space_v1` (`StateSpaceKernel`); `conv_state` is returned as
given, never entering a kernel.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
from jaxtyping import Array, Float

from ejkernel.kernels._common.state_space import check_v2, split_specs
from ejkernel.modules.operations._common import executor, typechecked
from ejkernel.modules.operations.state_space_v1 import ChunkedScanConfig, StateSpaceKernel
from ejkernel.ops import Invocation


@dataclasses.dataclass(frozen=True)
class StateSpaceV2Config(ChunkedScanConfig):
    """`chunk_size`: tokens per chunk of the SSD chunked form (a power of two; None: the implementation's
    default). On XLA the chunk (default 64). On Triton a cap: the kernels run 64-token chunks where no
    derivative is taken and 32-token chunks where one is (their measured optima on an H100), each at most
    `chunk_size` (256 gives 64 and 32, 16 gives 16 and 16; 16 is the least); results do not depend on it
    beyond rounding. `fwd_params` and `bwd_params` reach no implementation of this op. The platform."""


class StateSpaceV2(StateSpaceKernel):
    op_id = "state_space_v2"
    config_type = StateSpaceV2Config

    def axis_roles(self, args, kwargs):
        """Batch and heads split alike (the groups of B and C are the op's own check); the state axis N
        never, nor the heads under the gated RMS norm."""
        heads = "norm" if kwargs.get("use_gated_rmsnorm") else "heads"
        per_token = ("batch", None, heads)
        inputs = {0: ("x", (*per_token, None)), 1: ("A", (heads,)), 2: ("B", ("batch", None, None, "state"))}
        inputs |= {3: ("C", ("batch", None, None, "state")), 4: ("D", (heads,)), 5: ("dt", per_token)}
        inputs |= {6: ("gate", per_token), 7: ("initial_state", ("batch", heads, None, "state"))}
        return inputs, (per_token, ("batch", heads, None, None))

    def platform_cfgs(self, platform: str, inv: Invocation):
        if platform != "triton":
            yield from super().platform_cfgs(platform, inv)
            return
        # On Triton `chunk_size` caps chunks of 64 (plain calls) and 32 (differentiated ones): caps of 64 and
        # more change nothing, and autotuning times forward calls, so 32 is the one other choice.
        yield StateSpaceV2Config(platform=platform)
        yield StateSpaceV2Config(platform=platform, chunk_size=32)

    def call_impl(self, impl, args, kwargs, cfg):
        """`n_groups` as B holds them here: a shard of a call that splits the groups with the heads holds
        its part of them (the whole call's count failed B's shape check inside every shard)."""
        return super().call_impl(impl, args, {**kwargs, "n_groups": args[2].shape[2]}, cfg)

    def kwarg_specs(self, kwargs: dict[str, Any], in_specs) -> dict[str, Any]:
        """Also refuses a sharded head_dim (y flattens heads × head_dim), heads sharded under the gated
        RMSNorm (it normalises over every head), and heads sharded apart from their groups of B/C."""
        specs = super().kwarg_specs(kwargs, in_specs)
        x_spec, b_spec, c_spec = ((*tuple(in_specs[i]), None, None, None, None) for i in (0, 2, 3))
        if x_spec[3] is not None:
            raise ValueError(
                f"state_space_v2: in_specs shard the head_dim axis of x over {x_spec[3]!r}; y flattens heads x "
                "head_dim, so shard the batch or the heads instead"
            )
        heads_axis = x_spec[2]
        if heads_axis is not None and kwargs.get("use_gated_rmsnorm"):
            raise ValueError(
                f"state_space_v2: use_gated_rmsnorm normalises over all heads, so x's heads cannot be sharded "
                f"(over {heads_axis!r}); shard the batch instead"
            )
        groups_ok = (b_spec[2], c_spec[2]) == (heads_axis, heads_axis) or (
            kwargs.get("n_groups", 1) == 1 and b_spec[2] is None and c_spec[2] is None
        )
        if heads_axis is not None and not groups_ok:
            raise ValueError(
                f"state_space_v2: x's heads are sharded over {heads_axis!r}, so the groups of B and C must be "
                f"sharded over it too (or n_groups=1 and B, C replicated); got B {b_spec[2]!r}, C {c_spec[2]!r}"
            )
        return specs


@typechecked
def state_space_v2(
    x: Float[Array, "batch seq heads head_dim"],
    A: Float[Array, " heads"],
    B: Float[Array, "batch seq groups state"],
    C: Float[Array, "batch seq groups state"],
    D: Float[Array, " heads"],
    dt: Float[Array, "batch seq heads"],
    /,
    gate: Float[Array, "batch seq features"] | None = None,
    initial_state: Float[Array, "batch heads head_dim state"] | None = None,
    conv_state: Array | None = None,
    *,
    n_groups: int = 1,
    act_fn: Callable[[jax.Array], jax.Array] | None = None,
    use_gated_rmsnorm: bool = False,
    rmsnorm_eps: float = 1e-5,
    precision: Any = None,
    platform: str | None = None,
    cfg: StateSpaceV2Config | None = None,
    mesh: jax.sharding.Mesh | None = None,
    in_specs: Any = None,
    out_specs: Any = None,
) -> tuple[Float[Array, "batch seq features"], Float[Array, "batch heads head_dim state"], Array | None]:
    """Mamba-2 (SSD) scan over `x [batch, seq, heads, head_dim]`, a scalar decay `A [heads]` per head.

    B and C are `[batch, seq, n_groups, state]`; head h reads group `h // (heads // n_groups)`. Per token
    t and head h (`dt` already positive):
        h_t = exp(A · dt_t) · h_{t-1} + dt_t · x_t[:, None] · B_t[None, :]      (h: [head_dim, state])
        y_t = h_t C_t + D · x_t,   flattened to [batch, seq, heads · head_dim]
    then, with `gate [batch, seq, heads · head_dim]`, `y ← y · act_fn(gate)` (act_fn: SiLU by default),
    RMS-normalised first over the heads · head_dim features (no weight) when `use_gated_rmsnorm` (which
    needs the gate). Returns `(y, final state [batch, heads, head_dim, state], conv_state)`: the state has
    `initial_state`'s dtype when given, else `x`'s; `conv_state` is returned unchanged. A length-1 call
    with `initial_state` is one decode step. `precision` (a `jax.lax.Precision` or its name) sets the
    matmul precision of XLA's chunked form (the Triton kernels multiply float32 inputs in float32). Mixed
    float dtypes are fine (the scan runs in float32).

    With `mesh=`, shard the batch, or the heads together with the groups of B/C (B/C replicated when
    n_groups = 1); never the sequence or head_dim. `in_specs` has one spec per tensor passed (or per
    positional slot, None where not passed), `out_specs` is `(y, state[, conv])`.
    """
    check_v2(
        x,
        A,
        B,
        C,
        D,
        dt,
        gate,
        initial_state,
        conv_state,
        n_groups=n_groups,
        act_fn=act_fn,
        use_gated_rmsnorm=use_gated_rmsnorm,
        rmsnorm_eps=rmsnorm_eps,
        precision=precision,
    )
    tensors = (x, A, B, C, D, dt, gate, initial_state)
    kernel_in, kernel_out = split_specs("state_space_v2", (*tensors, conv_state), in_specs, out_specs)
    y, state = executor(
        StateSpaceV2(),
        *tensors,
        n_groups=n_groups,
        act_fn=act_fn,
        use_gated_rmsnorm=bool(use_gated_rmsnorm),
        rmsnorm_eps=float(rmsnorm_eps),
        precision=precision,
        platform=platform,
        cfg=cfg,
        mesh=mesh,
        in_specs=kernel_in,
        out_specs=kernel_out,
    )
    return y, state, conv_state
