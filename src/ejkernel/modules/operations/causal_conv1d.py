"""`causal_conv1d`: the short causal depthwise convolution before a Mamba, gated-delta-rule or KDA scan.

Dense for training (`x [B, S, C]`), or packed for serving (`x [T, C]`, `cu_seqlens`, a state pool and
`state_indices`); `ragged_causal_conv1d` takes EasyDeL 0.3.0's call form of the packed one.
"""

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from ejkernel.kernels._common.bounds import check_packed, check_with
from ejkernel.kernels._common.checks import is_traced, require_float, require_int
from ejkernel.modules.operations._common import executor, require_rank, typechecked
from ejkernel.ops import FwdParams, Invocation, Kernel, KernelConfig
from ejkernel.ops.config import BOOL, POWER_OF_TWO, KernelTiling, Rule, one_of
from ejkernel.registry import Backend, Platform, implementations

IMPLEMENTATIONS = implementations(
    "causal_conv1d",
    (Platform.TRITON, Backend.GPU, "ejkernel.kernels._triton.causal_conv1d:causal_conv1d_triton"),
    (Platform.XLA, Backend.ANY, "ejkernel.kernels._xla.causal_conv1d:causal_conv1d_xla"),
)
"""Triton first on GPUs, XLA everywhere else and where Triton declines (more than 8 taps, other dtypes). The Triton
forward slides a window over each run of tokens, reading every input row once, and writes the pool in place; its
backward is XLA's autodiff of the plain-JAX forward. On an H200 (16384 tokens x 8192 channels, width 4, bf16) the
dense forward with SiLU and bias took 0.176 ms against XLA's 0.345, the packed one on a conv-state pool 0.189 ms
against 0.483 (`exp/s30_conv_variants.py`): 0.72 and 0.68 of the device's copy bandwidth (4.18 TB/s, BENCHMARKS.md,
session 35), and 2.2x faster than flash-linear-attention's Triton kernel. Dense forward+backward took 1.800 ms with
a Triton backward kernel, which this backward replaced: 0.864 ms with it, against XLA's 0.854 (`ejkernel bench
causal_conv1d`)."""

ACTIVATIONS = (None, "silu", "swish")
FORWARD_DESIGNS = ("window", "shifted")


@dataclasses.dataclass(frozen=True)
class CausalConv1dTritonTiling(KernelTiling):
    """The Triton forward's design (`CausalConv1dConfig.triton_tiling`); XLA does not read it. A field left None
    keeps the default (in brackets); none changes the result beyond float32 summation order.

    Attributes:
        forward: `"window"`: a program walks its run of tokens row by row, keeping the last W - 1 input rows
            in registers, so each input row is read once; `"shifted"`: each tap's input is loaded as the
            program's tile shifted back (overlapping loads) ["window"].
        step_rows: Rows per step of the window's walks (forward and backward), a power of two: the loads in flight
            together [8].
        prefetch: Whether each step of the window's walk loads the next step's rows, so that they are in flight
            while it computes and stores its own (twice the rows in registers) [False].

    Raises:
        ValueError: A field that breaks its rule above; one line naming it.

    Example:
        >>> from ejkernel.modules import CausalConv1dConfig, CausalConv1dTritonTiling
        >>> CausalConv1dConfig(platform="triton", triton_tiling=CausalConv1dTritonTiling(step_rows=8)).to_json()
        '{"backend": "any", "platform": "triton", "triton_tiling": {"step_rows": 8}, "type": "CausalConv1dConfig"}'
    """

    forward: str | None = None
    step_rows: int | None = None
    prefetch: bool | None = None

    RULES: ClassVar[dict[str, Rule]] = {
        "forward": one_of(*FORWARD_DESIGNS),
        "step_rows": POWER_OF_TWO,
        "prefetch": BOOL,
    }


@dataclasses.dataclass(frozen=True)
class CausalConv1dConfig(KernelConfig):
    """How `causal_conv1d` runs; no field changes the result.

    Attributes:
        platform: `"auto"` (default), `"triton"` or `"xla"`.
        fwd_params: The Triton forward's tile: `block_k` tokens (default 64 for the window design, 32 for the
            shifted one) x `block_d` channels (1024; 256), `num_warps` (8; 4), `num_stages` (1); None (default):
            defaults. XLA reads none.
        bwd_params: The Triton backward kernel's tile (calls without a state): runs of at most `block_k` tokens
            (default 256; dense: the largest power of two dividing the sequence length, packed: no longer than
            the mean sequence), `block_d` channels (1024), `num_warps` (8); None (default): defaults. A call
            with a state takes the plain-JAX backward.
        triton_tiling: A `CausalConv1dTritonTiling`: the Triton forward's design; None (default): its defaults.
        backend: `"any"` (default), `"gpu"`, `"tpu"` or `"cpu"`: the device kind the config is meant for; a
            call on another kind refuses it.

    Raises:
        ValueError: An unknown `platform` or `backend`; a `triton_tiling` of another type.
    """

    triton_tiling: CausalConv1dTritonTiling | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.triton_tiling is not None and not isinstance(self.triton_tiling, CausalConv1dTritonTiling):
            raise ValueError(
                f"{type(self).__name__}.triton_tiling must be a CausalConv1dTritonTiling, got {self.triton_tiling!r}"
            )


TRITON_FORWARD_DESIGNS = (
    CausalConv1dTritonTiling(forward="shifted"),
    CausalConv1dTritonTiling(step_rows=1),
    CausalConv1dTritonTiling(step_rows=4),
    CausalConv1dTritonTiling(prefetch=True),
)
"""The Triton forward's designs autotuning times beside the default (the sliding window, 8 rows a step)."""


class CausalConv1d(Kernel):
    """The executor's `Kernel` for `causal_conv1d`: op id `"causal_conv1d"`, config `CausalConv1dConfig`.

    Positional arguments: `x, weight, bias, conv_state, cu_seqlens, state_indices` (None where absent).
    """

    op_id = "causal_conv1d"
    config_type = CausalConv1dConfig

    def platform_cfgs(self, platform: str, inv: Invocation):
        if platform != "triton":
            yield CausalConv1dConfig(platform=platform)
            return
        for block_k, block_d in ((16, 256), (32, 128), (32, 256), (64, 128), (16, 512), (64, 256)):
            for warps in (4, 8):
                tile = FwdParams(block_k=block_k, block_d=block_d, num_warps=warps)
                yield CausalConv1dConfig(platform=platform, fwd_params=tile)
        for design in TRITON_FORWARD_DESIGNS:
            yield CausalConv1dConfig(platform=platform, triton_tiling=design)

    def busy_integers(self, args):
        """Sequences of equal length filling the tokens, each on its own slot (zeros would be all empty)."""
        x, state, cu = args[0], args[3], args[4]
        if cu is None:
            return {}
        bounds = np.linspace(0, x.shape[0], cu.shape[0]).astype(np.int32)
        busy = {4: jnp.asarray(bounds)}
        if args[5] is not None:
            busy[5] = jnp.arange(args[5].shape[0], dtype=jnp.int32) % state.shape[0]
        return busy

    def axis_roles(self, args, kwargs):
        """Channels split freely (alike in `x`, `weight`, `bias` and the state), and the batch; the sequence,
        the packed tokens, the taps, the state's width, its slots and the index arrays never."""
        packed = args[4] is not None
        x_roles = ("tokens", "features") if packed else ("batch", "seq", "features")
        state_roles = ("slots", "features", "seq") if packed else ("batch", "features", "seq")
        inputs = {0: ("x", x_roles), 1: ("weight", ("features", "taps")), 2: ("bias", ("features",))}
        inputs |= {3: ("conv_state", state_roles), 4: ("cu_seqlens", ("tokens",)), 5: ("state_indices", ("tokens",))}
        return inputs, (x_roles if args[3] is None else (x_roles, state_roles))


def _check_call(x, weight, bias, activation, cu_seqlens, conv_state, state_indices) -> None:
    """Ranks, shapes and the values of the index arrays (outside `jit`, or under it with EJKERNEL_CHECKS=1)."""
    require_float("x", x)
    packed = cu_seqlens is not None
    if packed:
        require_rank("x", x, (2,), "[tokens, channels] when cu_seqlens is given")
    else:
        require_rank("x", x, (3,), "[batch, seq, channels] (or [tokens, channels] with cu_seqlens)")
    channels, width = weight.shape
    if x.shape[-1] != channels:
        raise ValueError(
            f"weight must be [channels, width] with channels = {x.shape[-1]} (x's last axis), got {tuple(weight.shape)}"
        )
    if width < 1:
        raise ValueError(f"weight must have at least one tap ([channels, width >= 1]), got {tuple(weight.shape)}")
    if bias is not None and bias.shape != (channels,):
        raise ValueError(f"bias must be [channels] = ({channels},), got {tuple(bias.shape)}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be None, 'silu' or 'swish', got {activation!r}")
    if packed:
        check_packed("cu_seqlens", cu_seqlens, x.shape[0])
    if state_indices is not None and (conv_state is None or not packed):
        raise ValueError(
            "state_indices needs cu_seqlens and conv_state (it picks each packed sequence's slot), "
            "got " + ("no conv_state" if conv_state is None else "no cu_seqlens")
        )
    if conv_state is None:
        return
    rows = conv_state.shape[0]
    if conv_state.shape[1] != channels or conv_state.shape[2] not in (width - 1, width):
        layout = "[slots, channels, width - 1 or width]" if packed else "[batch, channels, width - 1 or width]"
        raise ValueError(
            f"conv_state must be {layout} with channels = {channels}, width = {width}, got {tuple(conv_state.shape)}"
        )
    if not packed:
        if rows != x.shape[0]:
            raise ValueError(
                f"conv_state must be [batch, channels, width] with batch = {x.shape[0]}, got {tuple(conv_state.shape)}"
            )
        return
    num_seqs = cu_seqlens.shape[0] - 1
    if state_indices is None:
        if rows != num_seqs:
            raise ValueError(
                f"conv_state must have one slot per sequence ({num_seqs}) when state_indices is "
                f"None, got shape {tuple(conv_state.shape)}"
            )
        return
    require_int("state_indices", state_indices)
    if state_indices.shape != (num_seqs,):
        raise ValueError(
            f"state_indices must be [num_seqs] = ({num_seqs},) (len(cu_seqlens) - 1), got shape "
            f"{tuple(state_indices.shape)}"
        )
    if is_traced(cu_seqlens):  # a traced bound: which sequences are empty is unknown here
        check_with("state_indices", state_indices, lambda xp, s: (s >= 0) & (s < rows), f"[0, {rows}) (the slots)")
        return

    bounds = np.asarray(cu_seqlens)  # concrete (numpy, even inside a trace that closes over it)
    busy = bounds[1:] > bounds[:-1]

    def valid(xp, slots):
        return ~xp.asarray(busy) | ((slots >= 0) & (slots < rows))

    check_with("state_indices", state_indices, valid, f"[0, {rows}) (the slots of conv_state) for a non-empty sequence")


@typechecked
def causal_conv1d(
    x: Float[Array, "..."],
    weight: Float[Array, "channels width"],
    bias: Float[Array, " channels"] | None = None,
    /,
    *,
    activation: str | None = None,
    cu_seqlens: Int[Array, " num_seqs_plus_1"] | None = None,
    conv_state: Float[Array, "rows channels state_width"] | None = None,
    state_indices: Int[Array, " num_seqs"] | None = None,
    platform: str | None = None,
    cfg: CausalConv1dConfig | None = None,
    mesh: jax.sharding.Mesh | None = None,
    in_specs=None,
    out_specs=None,
):
    """Causal depthwise 1-D convolution: `out[t, c] = act(bias[c] + Σ_j weight[c, j] · x[t - (W-1) + j, c])`.

    Each channel is convolved with its own `W` taps; tap `W - 1` is the current token's, tap 0 the one
    `W - 1` tokens back (PyTorch's `Conv1d(groups=C, padding=W-1)` weight `[C, 1, W]` squeezed, as Mamba,
    Gated DeltaNet and EasyDeL store it). Inputs before a sequence's start are zeros, or come from its
    state. A state is channels first, `[..., C, Ws]`, holding the last `Ws` inputs, the newest in column
    `Ws - 1`: `Ws = W - 1` (Mamba's and vLLM's convention) or `Ws = W` (EasyDeL's, whose oldest column is
    carried but never read). The new state has the width of the one given. Accumulates in float32; the
    output has `x`'s dtype, the new state `conv_state`'s. Differentiable in `x`, `weight`, `bias` and
    `conv_state` (plain JAX autodiff of the XLA forward on every platform: W shifts transpose to W shifts).

    Dense (training): `x [B, S, C]`, optional initial `conv_state [B, C, Ws]`.

    Packed (serving, prefill and decode alike): `x [T, C]` holding N sequences back to back,
    `cu_seqlens [N + 1]` their bounds (`[0, n1, n1 + n2, ...]`, the last at most T; vLLM's
    `query_start_loc`); `conv_state [slots, C, Ws]` a pool, `state_indices [N]` each sequence's slot (None:
    sequence r uses slot r). Each non-empty sequence starts from its slot's old state and its slot receives
    the last `Ws` inputs of history followed by its tokens (a sequence shorter than `Ws` keeps the newest
    older entries, shifted); empty sequences and unnamed slots keep their state. Non-empty sequences
    sharing a slot each read its old state; which one writes it is unspecified. Tokens past `cu_seqlens[-1]`
    output zeros. A decode step is a call with sequences of one token. The pool is updated with one
    `.at[].set`, so under `jax.jit(..., donate_argnames="conv_state")` it is updated in place. Bad bounds or
    slots are a ValueError outside `jit` (under it too with `EJKERNEL_CHECKS=1`); otherwise, under `jit`, the
    bounds are clamped as `cu_seqlens` always are (`ejkernel.kernels._common.bounds`) and a non-empty
    sequence whose slot is outside `[0, slots)` reads a zero history and writes nothing.

    Args:
        x: `[batch, seq, channels]` float; with `cu_seqlens`, `[tokens, channels]`.
        weight: `[channels, width]` float, the taps, oldest first.
        bias: `[channels]` float; None (default): no bias.
        activation: None (default): the plain convolution; `"silu"` (or `"swish"`): `y · sigmoid(y)`.
        cu_seqlens: `[N + 1]` integer bounds of the packed sequences, as above; None (default): dense.
        conv_state: The initial state `[batch, channels, Ws]` (dense) or the state pool `[slots, channels, Ws]`
            (packed), `Ws` = width - 1 or width; None (default): zero history and no state returned.
        state_indices: `[N]` integer slot of each packed sequence, in `[0, slots)` for a non-empty one; None
            (default): `arange(N)`. Only with `cu_seqlens` and `conv_state`.
        platform: `"auto"`, `"triton"` (GPU) or `"xla"`; None (default): `cfg.platform`, else auto.
        cfg: A `CausalConv1dConfig`; None (default): the executor's choice.
        mesh: A `jax.sharding.Mesh` to run the op on under `shard_map`; None (default): no sharding. Needs
            `in_specs` and `out_specs`.
        in_specs: A `PartitionSpec` per tensor passed, or per positional slot of
            `(x, weight, bias, conv_state, cu_seqlens, state_indices)`. They may split the channels (alike in
            every tensor) and the dense batch, never the sequence, the packed tokens, the taps, the state's
            width or slots, or the index arrays.
        out_specs: The output's spec, or `(out, new_state)` specs with `conv_state`, laid out as the inputs.

    Returns:
        `out`, shaped and typed like `x`; with `conv_state`, the tuple `(out, new_state)`, `new_state` shaped
        and typed like `conv_state` (the whole pool, in the packed form).

    Raises:
        TypeError: A non-float `x`, `weight`, `bias` or `conv_state`, non-integer `cu_seqlens` or
            `state_indices`, an argument of a wrong rank that the annotations catch, or a `cfg` of another
            class.
        ValueError: `x` of another rank; `weight`, `bias` or `conv_state` whose channels differ from `x`'s;
            a state width other than W - 1 or W; a dense `conv_state` whose batch differs from `x`'s;
            `state_indices` without `cu_seqlens` and `conv_state`, of a length other than N, or (outside
            `jit`) naming a slot outside the pool; bad `cu_seqlens` (rule above); an unknown `activation`;
            sharding specs that split what the op computes across; a `platform` that is unknown or has no
            implementation on this device.

    Example:
        >>> import jax, jax.numpy as jnp, numpy as np
        >>> from ejkernel.modules import causal_conv1d
        >>> rng = np.random.default_rng(0)
        >>> x = rng.standard_normal((2, 6, 8), np.float32)
        >>> weight, bias = rng.standard_normal((8, 4), np.float32), rng.standard_normal(8).astype(np.float32)
        >>> causal_conv1d(x, weight, bias, activation="silu").shape
        (2, 6, 8)
        >>> pool = jnp.zeros((3, 8, 3))  # 3 slots, width - 1 = 3 inputs each
        >>> tokens = rng.standard_normal((5, 8), np.float32)
        >>> cu_seqlens, slots = np.array([0, 4, 5]), np.array([2, 0])  # tokens 0-3 on slot 2, token 4 on slot 0
        >>> out, pool = causal_conv1d(tokens, weight, cu_seqlens=cu_seqlens, conv_state=pool, state_indices=slots)
        >>> print(out.shape, pool.shape, bool((pool[2] == tokens[1:4].T).all()), bool((pool[1] == 0).all()))
        (5, 8) (3, 8, 3) True True
    """
    _check_call(x, weight, bias, activation, cu_seqlens, conv_state, state_indices)
    if x.shape[0] == 0 or (cu_seqlens is None and x.shape[1] == 0):  # nothing to convolve
        out = jnp.zeros(x.shape, x.dtype)
        return out if conv_state is None else (out, conv_state)
    return executor(
        CausalConv1d(),
        x,
        weight,
        bias,
        conv_state,
        cu_seqlens,
        state_indices,
        activation=activation,
        platform=platform,
        cfg=cfg,
        mesh=mesh,
        in_specs=in_specs,
        out_specs=out_specs,
    )


@typechecked
def ragged_causal_conv1d(
    x: Float[Array, "tokens channels"],
    conv_state: Float[Array, "slots channels state_width"],
    kernel: Float[Array, "channels width"],
    query_start_loc: Int[Array, " num_seqs_plus_1"],
    state_indices: Int[Array, " num_seqs"],
    distribution: Int[Array, " 3"] | None = None,
    *,
    d_conv: int | None = None,
    apply_silu: bool = True,
    platform: str | None = None,
    cfg: CausalConv1dConfig | None = None,
):
    """`causal_conv1d`'s packed form in EasyDeL 0.3.0's call form (`ragged_causal_conv1d`), SiLU by default.

    The same computation as `causal_conv1d(x, kernel, activation="silu" if apply_silu else None,
    cu_seqlens=query_start_loc, conv_state=conv_state, state_indices=state_indices)`, with EasyDeL's
    `distribution = (decode_end, prefill_end, num_valid)`: only its last entry is read, and sequences from
    `num_valid` on are empty (their tokens output zeros, their slots keep their state). The state may be
    EasyDeL's `[slots, C, d_conv]` or `[slots, C, d_conv - 1]`. Use `causal_conv1d` for a bias or `mesh=`.

    Args:
        x: `[tokens, channels]` float, the packed tokens.
        conv_state: `[slots, channels, d_conv]` (or `d_conv - 1`) float, the state pool, newest input last.
        kernel: `[channels, d_conv]` float, the taps, oldest first (`kernel[:, d_conv - 1]` is the current
            token's).
        query_start_loc: `[N + 1]` integer bounds of the sequences, rising from 0 to at most the tokens.
        state_indices: `[N]` integer slot of each sequence.
        distribution: `[3]` integer, `(decode_end, prefill_end, num_valid)`, `num_valid` in `[0, N]`; None
            (default): all N sequences are valid.
        d_conv: The kernel width, checked against `kernel`; None (default): `kernel.shape[1]`.
        apply_silu: Apply SiLU to the convolution (default True).
        platform: As for `causal_conv1d`.
        cfg: As for `causal_conv1d`.

    Returns:
        tuple: `(out, new_state)`: `out [tokens, channels]` in `x`'s dtype, `new_state` the pool after the
        writes, in `conv_state`'s shape and dtype.

    Raises:
        TypeError: As for `causal_conv1d`, or `distribution` not `[3]` integers.
        ValueError: `d_conv` other than `kernel.shape[1]`; `distribution[2]` outside `[0, N]` (outside `jit`);
            otherwise as for `causal_conv1d`.

    Example:
        >>> import jax.numpy as jnp, numpy as np
        >>> from ejkernel.modules import ragged_causal_conv1d
        >>> rng = np.random.default_rng(0)
        >>> x, kernel = rng.standard_normal((5, 8), np.float32), rng.standard_normal((8, 4), np.float32)
        >>> pool = jnp.asarray(rng.standard_normal((3, 8, 4), np.float32))  # EasyDeL's full-width state
        >>> qsl, slots, dist = np.array([0, 4, 5]), np.array([2, 0]), np.array([0, 0, 1], np.int32)
        >>> out, new = ragged_causal_conv1d(x, pool, kernel, qsl, slots, dist, d_conv=4)
        >>> bool((new[2] == x[0:4].T).all()), bool((new[0] == pool[0]).all()), bool((out[4] == 0).all())
        (True, True, True)
    """
    if d_conv is not None and d_conv != kernel.shape[1]:
        raise ValueError(f"d_conv must equal kernel.shape[1] = {kernel.shape[1]}, got {d_conv!r}")
    if distribution is not None:
        num_seqs = query_start_loc.shape[0] - 1
        in_range = lambda xp, d: xp.asarray([True, True, (d[2] >= 0) & (d[2] <= num_seqs)])
        check_with("distribution", distribution, in_range, f"[0, {num_seqs}] in entry 2 (the valid sequences)")
        valid = jnp.clip(distribution[2], 0, num_seqs)
        query_start_loc = jnp.where(jnp.arange(num_seqs + 1) <= valid, query_start_loc, query_start_loc[valid])
    return causal_conv1d(
        x,
        kernel,
        activation="silu" if apply_silu else None,
        cu_seqlens=query_start_loc,
        conv_state=conv_state,
        state_indices=state_indices,
        platform=platform,
        cfg=cfg,
    )
