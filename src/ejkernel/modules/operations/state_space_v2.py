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

from ejkernel.kernels._common.state_space import check_v2
from ejkernel.modules.operations._common import executor, typechecked
from ejkernel.modules.operations.state_space_v1 import ChunkedScanConfig, StateSpaceKernel, split_specs
from ejkernel.ops import Invocation
from ejkernel.registry import Backend, Platform, implementations

IMPLEMENTATIONS = implementations(
    "state_space_v2",
    (Platform.TRITON, Backend.GPU, "ejkernel.kernels._triton.state_space_v2:state_space_v2_triton"),
    (Platform.XLA, Backend.ANY, "ejkernel.kernels._xla.state_space_v2:state_space_v2_xla"),
)


@dataclasses.dataclass(frozen=True)
class StateSpaceV2Config(ChunkedScanConfig):
    """How `state_space_v2` runs: the platform and the SSD chunk; no field changes the result beyond rounding.

    Attributes:
        chunk_size: Tokens per chunk of the SSD chunked form, a positive power of two; None (default): the
            implementation's default. On XLA the chunk (default 64). On Triton a cap: the kernels run 64-token
            chunks where no derivative is taken and 32-token chunks where one is (their measured optima on an
            H100), each at most `chunk_size` (256 gives 64 and 32, 16 gives 16 and 16; 16 is the least).
        platform: `"auto"` (default: the executor chooses), `"xla"` or `"triton"`.
        fwd_params: Reaches no implementation of this op.
        bwd_params: Reaches no implementation of this op.
        backend: `"any"` (default), `"gpu"`, `"tpu"` or `"cpu"`: the device kind the config is meant for; a
            call on another kind refuses it.

    Raises:
        ValueError: `chunk_size` is not a positive power of two, or `platform` or `backend` is unknown.
    """


class StateSpaceV2(StateSpaceKernel):
    """The executor's `Kernel` for `state_space_v2`: op id `"state_space_v2"`, config `StateSpaceV2Config`.

    On Triton, autotuning times only the default config and a 32-token cap (caps of 64 and more change
    nothing there, and autotuning times forward calls).
    """

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
    """Mamba-2 (SSD) scan over `x [batch, seq, heads, head_dim]`, a scalar decay per head.

    Per token t and head h, with a float32 `[head_dim, state]` state (`ejkernel.reference.state_space`):
    `h_t = exp(A · dt_t) · h_{t-1} + dt_t · x_t[:, None] · B_t[None, :]`, `y_t = h_t C_t + D · x_t`, where
    head h reads group `h // (heads // n_groups)` of B and C. y is flattened to `[batch, seq, heads · head_dim]`;
    then, with a gate, `y ← y · act_fn(gate)`, RMS-normalised first when `use_gated_rmsnorm`:
    `y ← y / sqrt(mean(y²) + rmsnorm_eps) · act_fn(gate)`, the mean over all `heads · head_dim` features,
    with no weight. `h_0` is `initial_state` (or zeros). A length-1 call with `initial_state` is one decode
    step. Mixed float dtypes are fine (the scan runs in float32). `conv_state` never enters a kernel: it is
    returned as given.

    `use_gated_rmsnorm` normalises, then gates. mamba_ssm's `Mamba2` by default (`norm_before_gate=False`)
    gates first, then normalises, `RMSNorm(y · silu(z)) · weight`, per group of `heads · head_dim / n_groups`
    features: its result differs whenever a gate is given. Its `norm_before_gate=True` with one group is this
    op's result times `weight`; for the gate-first order, call without `gate` and apply the norm yourself.
    Against mamba_ssm's `mamba_chunk_scan_combined`: x, B, C, A, dt and the state have its layouts, but `z`
    (here `gate`) and `y` are flattened to `heads · head_dim`; there is no `dt_bias`, `dt_softplus`,
    `dt_limit` or `seq_idx` (pass `softplus(dt + bias)` as `dt`); `D` is per head only.

    Args:
        x: `[batch, seq, heads, head_dim]` float, the input.
        A: `[heads]` float, the decay per head (negative decays).
        B: `[batch, seq, n_groups, state]` float, the input projection of each token.
        C: `[batch, seq, n_groups, state]` float, the output projection of each token.
        D: `[heads]` float, the skip connection.
        dt: `[batch, seq, heads]` float, the step sizes, already positive (no softplus is applied).
        gate: `[batch, seq, heads · head_dim]` float, the gate z; None (default): no gating.
        initial_state: `[batch, heads, head_dim, state]` float, the state before the first token; None
            (default): zeros.
        conv_state: Any array led by `batch`, returned unchanged; None (default).
        n_groups: Groups of B and C, a positive divisor of `heads` (default 1).
        act_fn: The gate's activation, a callable on arrays; None (default): SiLU (`jax.nn.silu`).
        use_gated_rmsnorm: Normalise y before gating it, as above (default False); needs a `gate`.
        rmsnorm_eps: The norm's epsilon, a positive number (default 1e-5).
        precision: The matmul precision of XLA's chunked form, a `jax.lax.Precision` or its name (`"default"`,
            `"high"`, `"highest"`, `"bfloat16"`, `"tensorfloat32"`, `"float32"`); None (default): JAX's
            default. The Triton kernels multiply float32 inputs in float32 whatever it says.
        platform: `"auto"`, `"xla"` or `"triton"`; None (default): `cfg.platform`, else auto.
        cfg: A `StateSpaceV2Config` fixing platform and chunk; None (default): the executor's choice (cache,
            tuning or heuristics).
        mesh: A `jax.sharding.Mesh` to run the scan on under `shard_map`; None (default): no sharding. Needs
            `in_specs` and `out_specs`.
        in_specs: A `PartitionSpec` per tensor passed, or per positional slot (None where not passed). They
            may shard the batch, or the heads together with the groups of B and C (B and C replicated when
            `n_groups` is 1); never the sequence, `head_dim` or the state axis, nor the heads under
            `use_gated_rmsnorm`.
        out_specs: `(y, state)` or `(y, state, conv_state)` specs, laid out as the inputs.

    Returns:
        tuple: `(y, final_state, conv_state)`, with `y [batch, seq, heads · head_dim]` in `x`'s dtype;
        `final_state [batch, heads, head_dim, state]` in `initial_state`'s dtype when given, else `x`'s;
        `conv_state` as given.

    Raises:
        TypeError: An argument of another rank, dtype kind, named size or type than above (one line naming
            it), a non-callable `act_fn`, or a `cfg` of another class.
        ValueError: `n_groups` not a positive divisor of `heads`, or B, C or `gate` of a wrong shape;
            `use_gated_rmsnorm` without a gate; `rmsnorm_eps` not positive; an unknown `precision`;
            `conv_state` not led by `batch`; only some of `mesh`, `in_specs`, `out_specs`, or `out_specs`
            not 2 or 3 specs; specs that split what the op computes across, or that disagree; a `platform`
            that is unknown, has no implementation on this device or contradicts `cfg.platform`.
        NotImplementedError: `platform="triton"` with inputs not float32, bfloat16 or float16, or a
            `head_dim` or `state` above 256.

    Example:
        >>> import jax, jax.numpy as jnp, numpy as np
        >>> from ejkernel.modules import state_space_v2
        >>> rng = np.random.default_rng(0)
        >>> batch, seq, heads, head_dim, groups, state = 1, 8, 4, 2, 2, 3
        >>> x = rng.standard_normal((batch, seq, heads, head_dim), np.float32)
        >>> A = -np.arange(1, heads + 1, dtype=np.float32)
        >>> B, C = rng.standard_normal((2, batch, seq, groups, state), np.float32)
        >>> D = np.ones(heads, np.float32)
        >>> dt = rng.random((batch, seq, heads), np.float32)
        >>> z = rng.standard_normal((batch, seq, heads * head_dim), np.float32)
        >>> ssd = jax.jit(state_space_v2, static_argnames=("n_groups", "use_gated_rmsnorm"))
        >>> y, h, _ = ssd(x, A, B, C, D, dt, z, n_groups=groups, use_gated_rmsnorm=True)
        >>> print(y.shape, h.shape)
        (1, 8, 8) (1, 4, 2, 3)
        >>> plain, _, _ = ssd(x, A, B, C, D, dt, n_groups=groups)  # no gate
        >>> normed = plain * jax.lax.rsqrt(jnp.mean(plain**2, axis=-1, keepdims=True) + 1e-5)
        >>> bool(jnp.allclose(y, normed * jax.nn.silu(z), atol=1e-5))  # normalised, then gated
        True
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
