"""`grouped_matmul`: the MoE expert matmul, rows of `lhs` grouped by `group_sizes`, one `rhs` per group."""

import dataclasses
import numbers
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec
from jaxtyping import Array, Float, Int, Shaped

from ejkernel.kernels._common.grouped_matmul import check_args, check_versions, result_dtype, tile_params
from ejkernel.modules.operations._common import executor, typechecked
from ejkernel.ops import BwdParams, FwdParams, Invocation, Kernel, KernelConfig
from ejkernel.ops.config import BOOL, POSITIVE_INT, KernelTiling, Rule
from ejkernel.ops.fingerprint import describe_device
from ejkernel.ops.kernel import FORWARD
from ejkernel.quantization import QuantizedArray
from ejkernel.registry import Backend, Platform, current_backend, implementations

IMPLEMENTATIONS = implementations(
    "grouped_matmul",
    (Platform.PALLAS, Backend.GPU, "ejkernel.kernels._pallas.gpu.grouped_matmul:grouped_matmul_mosaic_gpu"),
    (Platform.TRITON, Backend.GPU, "ejkernel.kernels._triton.grouped_matmul:grouped_matmul_triton"),
    (Platform.XLA, Backend.ANY, "ejkernel.kernels._xla.grouped_matmul:grouped_matmul_xla"),
    (Platform.PALLAS, Backend.TPU, "ejkernel.kernels._pallas.tpu.grouped_matmul:grouped_matmul_tpu"),
)
"""Best first. On an H100 at M=32768, K=4096, N=1536, 64 groups, bf16, the Mosaic GPU kernels ran forward+backward
at 0.71 of a dense matmul against Triton's 0.48 (the forward alone at 0.53 against 0.59: the shipped H100 table
sends that signature's undifferentiated calls to Triton); on an H200, on spans, 0.98 against 0.71 (the forward,
ping-pong, 0.84 against 0.71); calls they decline (other GPUs, group_offset,
existing_out, v3 scales except `fp8_lhs` with FP8 `[G, N, K]` weights, which run their FP8 forward) fall to
Triton. The TPU kernels, checked only in Pallas' TPU interpret mode so far, come after XLA (`platform="pallas"`
asks for them) until the suite has passed on a real TPU."""


@dataclasses.dataclass(frozen=True)
class GroupedMatmulMosaicFp8Tiling(KernelTiling):
    """The tiles of the Mosaic GPU FP8 x FP8 forward (`GroupedMatmulConfig.mosaic_fp8_tiling`): the `fp8_lhs`
    calls with FP8 `[G, N, K]` weights on a Hopper GPU; no other path reads it. A field left None keeps the
    kernel's default (in brackets); none changes the result beyond float32 summation order. The kernel fits
    them to the call (`block_n` down to a multiple of 64 dividing N and fitting the registers, stages to
    shared memory).

    Attributes:
        block_m: Output rows per tile, shared by two compute warpgroups: 128 or 256 (at least 256 asks 256) [128].
        block_n: Output columns per tile, a multiple of 64 up to 256 (wider than 128 per 64 rows: each K step's
            wgmma is split into column chunks, as the registers need) [128].
        num_stages: Shared-memory slots of the operand ring (each one 128-wide K step) [5].
        overlap: Promote each K step's product into the accumulator while the next step's wgmma runs (three
            float32 tiles in registers), rather than after waiting for it [False].
        round_in_kernel: Round lhs to FP8 in a Mosaic GPU pass at copy speed (False: in XLA); the same codes
            and scales either way [True].
        column_blocks: Where the call's `rhs_scale` is constant over each 128 output columns (DeepSeek-V3's
            128 x 128 blocks; checked on the device per call), promote each product with one scale per row
            (False: per element, always) [True].
        spans: Output tiles that follow each group from its first row (rounded down to 8), so that every tile
            runs one K loop in one group and stores only its own rows, in place of fixed row tiles that run a K
            loop per group they straddle (`GroupedMatmulConfig.mosaic_spans`' schedule); the output tile is stored
            in column pieces of at most 128 columns, narrower where more stages need the room; 128-row tiles only
            (256-row spans tiles hit a misaligned address on an H200; a kernel declines them)
            [`GroupedMatmulConfig.mosaic_spans` for 128-row tiles, else False].

    Raises:
        ValueError: A tile or stage count that is not a positive int, or a switch (`overlap`, `round_in_kernel`,
            `column_blocks`, `spans`) that is not a bool; one line naming the field.

    Example:
        >>> from ejkernel.modules import GroupedMatmulConfig, GroupedMatmulMosaicFp8Tiling
        >>> cfg = GroupedMatmulConfig(platform="pallas", mosaic_fp8_tiling=GroupedMatmulMosaicFp8Tiling(block_n=64))
        >>> cfg.mosaic_fp8_tiling.block_n
        64
    """

    block_m: int | None = None
    block_n: int | None = None
    num_stages: int | None = None
    overlap: bool | None = None
    round_in_kernel: bool | None = None
    column_blocks: bool | None = None
    spans: bool | None = None

    RULES: ClassVar[dict[str, Rule]] = {
        **dict.fromkeys(("block_m", "block_n", "num_stages"), POSITIVE_INT),
        **dict.fromkeys(("overlap", "round_in_kernel", "column_blocks", "spans"), BOOL),
    }


@dataclasses.dataclass(frozen=True)
class GroupedMatmulConfig(KernelConfig):
    """Tiling of the forward product (`fwd_params`) and of both backward products (`bwd_params`).

    In matmul terms: `block_q` rows of lhs per tile (M), `block_k` the contraction step (K), `block_d`
    output columns per tile (N), plus `num_warps` and `num_stages`. Upstream's flat fields set one tiling
    for all three products; they fill what `fwd_params` / `bwd_params` leave unset and must not contradict
    them; tiles are rounded down to a power of two and each implementation fits them to the call
    (`_common.grouped_matmul.tile_params`). None of these fields changes results.

    Attributes:
        platform: `"auto"` (default), `"xla"`, `"triton"` or `"pallas"` (Mosaic GPU, or TPU).
        fwd_params: The forward product's tiling, a `FwdParams` of `block_q`, `block_k`, `block_d`,
            `num_warps` and `num_stages`; None (default): the implementation's. On XLA only `block_q` is
            read (rows per tile, default 512).
        bwd_params: The tiling of both backward products, as `fwd_params`; None (default): the
            implementation's (on XLA the forward's `block_q`).
        backend: `"any"` (default), `"gpu"`, `"tpu"` or `"cpu"`: the device kind the config is meant for; a
            call on another kind refuses it.
        block_m: Upstream's rows per tile (our `block_q`), a positive int; None (default, upstream's 128):
            left to the implementation.
        block_n: Upstream's output columns per tile (our `block_d`); None (default, upstream's 128).
        block_k: Upstream's contraction step; None (default, upstream's 128).
        num_warps: Upstream's warps per program; None (default, upstream's 4).
        num_stages: Upstream's pipeline stages; None (default, upstream's 2).
        bypass_xla_tiling: True makes the XLA platform run XLA's own ragged dot (no tiling, no padding);
            other platforms ignore it. Default False.
        mosaic_fp8_tiling: A `GroupedMatmulMosaicFp8Tiling`: the tiles of the Mosaic GPU FP8 x FP8 forward
            (`fp8_lhs`), read by it only. None (default): its defaults.
        mosaic_spans: True (default) makes the Mosaic GPU kernels' forward and lhs-gradient products run output
            tiles that follow each group from its first row (rounded down to 8) and store only their own rows, as
            the Triton forward does (the FP8 forward too, unless `mosaic_fp8_tiling.spans` says otherwise); False:
            fixed row tiles, which run one K loop per group they straddle (on an H200 at the bench's MoE shape
            12-20% slower). Other platforms ignore it.

    Raises:
        ValueError: A flat field that is not a positive int or None, a non-bool `bypass_xla_tiling` or
            `mosaic_spans`, a flat
            field contradicting `fwd_params` or `bwd_params`, a `mosaic_fp8_tiling` of another type, or an
            unknown `platform` or `backend`.
    """

    block_m: int | None = None
    block_n: int | None = None
    block_k: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    bypass_xla_tiling: bool = False
    mosaic_fp8_tiling: GroupedMatmulMosaicFp8Tiling | None = None
    mosaic_spans: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        tiling = self.mosaic_fp8_tiling
        if tiling is not None and not isinstance(tiling, GroupedMatmulMosaicFp8Tiling):
            raise ValueError(
                f"GroupedMatmulConfig.mosaic_fp8_tiling must be a GroupedMatmulMosaicFp8Tiling, got {tiling!r}"
            )
        for name in ("block_m", "block_n", "block_k", "num_warps", "num_stages"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"GroupedMatmulConfig.{name} must be a positive int or None, got {value!r}")
            object.__setattr__(self, name, int(value))
        for name in ("bypass_xla_tiling", "mosaic_spans"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"GroupedMatmulConfig.{name} must be a bool, got {getattr(self, name)!r}")
        tile_params(self)  # a flat field that contradicts fwd_params or bwd_params is an error now, not at the call


TRITON_FORWARD_GPU = "H100"
"""The GPU (a part of its device kind) whose undifferentiated calls prefer the Triton kernel
(`GroupedMatmul.heuristic_cfg`)."""


class GroupedMatmul(Kernel):
    """The executor's `Kernel` for `grouped_matmul`: op id `"grouped_matmul"`, config `GroupedMatmulConfig`.

    `out_shard_callback`, when given, is applied to every implementation's output. Configs tile the backward
    too, so a differentiated call gets its own config; autotuning (policy `autotune`) times a few tilings
    per platform.
    """

    op_id = "grouped_matmul"
    config_type = GroupedMatmulConfig
    tune_argnums = (0, 1)  # configs tile the backward products too

    def axis_roles(self, args, kwargs):
        """Never the rows M nor `group_sizes` (which lay the groups out over all rows); the contraction K
        only with an `out_shard_callback` to sum the shards' parts; the columns N freely, the output's split
        as the weights'; experts (with `group_offset`) are the op's own check."""
        contraction = None if self.out_shard_callback is not None else "dim"
        rhs = (None, "features", contraction) if kwargs.get("transpose_rhs") else (None, contraction, "features")
        inputs = {0: ("lhs", ("tokens", contraction)), 1: ("rhs", rhs), 2: ("group_sizes", ("tokens",))}
        return inputs | {4: ("existing_out", ("tokens", "features"))}, ("tokens", "features")

    def __init__(self, out_shard_callback: Callable[[jax.Array], jax.Array] | None = None):
        self.out_shard_callback = out_shard_callback

    def busy_integers(self, args):
        """Rows shared evenly by the groups (zeros would leave every row in none)."""
        lhs, sizes = args[0], args[2]
        rows, groups = lhs.shape[0], sizes.shape[0]
        return {2: (rows // groups + (jnp.arange(groups) < rows % groups)).astype(sizes.dtype)}

    def heuristic_cfg(self, inv: Invocation) -> GroupedMatmulConfig:
        """Undifferentiated calls on an H100 prefer the Triton kernel (where it declines, `auto`'s order serves the
        call): its forward beat the Mosaic GPU one there before the spans schedule (0.69 against 0.52 of a dense
        matmul's speed, M=32768 K=4096 N=1536, 64 groups), while the Mosaic GPU kernels, first in `auto`'s order,
        train faster (0.71 against 0.55). Elsewhere every call keeps `auto`'s order: on an H200 the Mosaic GPU forward
        on spans took 0.758 / 0.834 / 0.070 ms against Triton's 0.889 / 0.994 / 0.072 (M x K x N / groups 32768 x
        4096 x 1536 / 64, 16384 x 7168 x 2048 / 32, 8192 x 2048 x 768 / 8; session 42, `exp/s41_gmm_forward_route.py`).
        `fp8_lhs` calls and `QuantizedArray` weights keep `auto`'s order on every GPU: the Mosaic GPU FP8 x FP8
        forward and 4-bit forward (MXFP4 0.92 ms on an H200 at the first shape, session 41, against 1.81 for
        Triton's in session 39) where they serve the call; where they decline (other formats), Triton's."""
        forward_on_gpu = inv.platform == "auto" and inv.mode == FORWARD and current_backend() == Backend.GPU
        quantized = isinstance(inv.args[1], QuantizedArray)
        plain_forward = forward_on_gpu and not inv.kwargs.get("fp8_lhs") and not quantized
        if plain_forward and TRITON_FORWARD_GPU in describe_device()["device_kind"]:  # (the device asked last)
            return GroupedMatmulConfig(platform="triton")
        return super().heuristic_cfg(inv)

    def call_impl(self, impl, args, kwargs, cfg):
        out = impl.fn(*args, cfg=cfg, **kwargs)
        return out if self.out_shard_callback is None else self.out_shard_callback(out)

    def platform_cfgs(self, platform: str, inv: Invocation):
        yield GroupedMatmulConfig(platform=platform)  # the implementation's own defaults
        if platform == "xla":
            for block in (256, 1024):
                yield GroupedMatmulConfig(platform=platform, fwd_params=FwdParams(block_q=block))
        if platform == "pallas" and current_backend() == Backend.GPU:
            if inv is not None and inv.kwargs.get("fp8_lhs"):
                yield from (GroupedMatmulConfig(platform=platform, mosaic_fp8_tiling=t) for t in MOSAIC_FP8_TILINGS)
            yield from _mosaic_gpu_cfgs()
        if platform != "triton":
            return
        forward = [
            FwdParams(block_q=128, block_k=64, block_d=256, num_warps=8, num_stages=3),
            FwdParams(block_q=128, block_k=64, block_d=128, num_warps=4, num_stages=4),
            FwdParams(block_q=64, block_k=64, block_d=256, num_warps=4, num_stages=4),
        ]
        backward = [
            BwdParams(block_q=128, block_k=128, block_d=128, num_warps=8, num_stages=3),
            BwdParams(block_q=64, block_k=128, block_d=128, num_warps=4, num_stages=3),
        ]
        for fwd in forward:
            for bwd in backward:
                yield GroupedMatmulConfig(platform=platform, fwd_params=fwd, bwd_params=bwd)

    def kwarg_specs(self, kwargs: dict[str, Any], in_specs) -> dict[str, Any]:
        """`rhs_scale` and `rhs_bias` follow rhs's group and output-column sharding."""
        rhs_spec = tuple(in_specs[1]) + (None,) * 3
        groups, columns = rhs_spec[0], rhs_spec[1] if kwargs.get("transpose_rhs") else rhs_spec[2]
        specs = {}
        if kwargs.get("rhs_scale") is not None:
            specs["rhs_scale"] = PartitionSpec(groups, None, None, columns)
        if kwargs.get("rhs_bias") is not None:
            specs["rhs_bias"] = PartitionSpec(groups, None, columns)
        return specs


MOSAIC_FP8_TILINGS = (
    GroupedMatmulMosaicFp8Tiling(block_n=256, num_stages=4),  # less of lhs read per FLOP, the output in 4 pieces
    GroupedMatmulMosaicFp8Tiling(block_n=256, num_stages=3),  # 3 stages, the output in 2 column pieces
    GroupedMatmulMosaicFp8Tiling(block_n=256, num_stages=4, overlap=True),  # four 64-column wgmmas, overlapped
    GroupedMatmulMosaicFp8Tiling(block_n=256, num_stages=3, spans=False),  # fixed row tiles (session 31's default)
)
"""FP8 forward tilings autotuning times beside the default (128 x 128 tiles on spans, 5 stages, promotion waited
for)."""


def _mosaic_gpu_cfgs():
    """Tilings of the Mosaic GPU kernels worth timing beside their defaults (128 x 256 output tiles shared by
    two warpgroups, 64-wide steps): narrower tiles with deeper rings, 256-row tiles, 128-row steps for the
    weights' gradient, ping-pong (`num_warps=4`: one warpgroup per tile, tiles alternating), and fixed row tiles
    (`mosaic_spans=False`)."""
    pingpong = FwdParams(block_q=128, block_d=128, block_k=64, num_warps=4)
    yield GroupedMatmulConfig(platform="pallas", mosaic_spans=False)
    yield GroupedMatmulConfig(
        platform="pallas", fwd_params=FwdParams(block_q=128, block_d=128, block_k=64, num_stages=6)
    )
    yield GroupedMatmulConfig(
        platform="pallas", fwd_params=FwdParams(block_q=256, block_d=128, block_k=64, num_stages=3)
    )
    yield GroupedMatmulConfig(platform="pallas", fwd_params=pingpong)
    yield GroupedMatmulConfig(platform="pallas", bwd_params=BwdParams(block_k=128, num_stages=3))
    yield GroupedMatmulConfig(
        platform="pallas", bwd_params=BwdParams(block_q=128, block_d=128, block_k=64, num_stages=6)
    )
    yield GroupedMatmulConfig(
        platform="pallas", fwd_params=pingpong, bwd_params=BwdParams(block_q=128, block_d=128, num_warps=4)
    )


@typechecked
def grouped_matmul(
    lhs: Float[Array, "m k"],
    rhs: Shaped[Array, "groups _ _"] | QuantizedArray,
    group_sizes: Int[Array, " num_groups"],
    group_offset: Int[Array, "..."] | int | None = None,
    existing_out: Float[Array, "m _"] | None = None,
    /,
    *,
    preferred_element_type: Any = jnp.float32,
    rhs_scale: Float[Array, "groups blocks 1 _"] | None = None,
    rhs_bias: Float[Array, "groups 1 _"] | None = None,
    transpose_rhs: bool = False,
    interpret: bool = False,
    do_padding: bool = True,
    precision: Any = jax.lax.Precision.DEFAULT,
    use_v2: bool = False,
    use_v3: bool = False,
    fp8_lhs: bool = False,
    out_shard_callback: Callable[[jax.Array], jax.Array] | None = None,
    platform: str | None = None,
    cfg: GroupedMatmulConfig | None = None,
    mesh: jax.sharding.Mesh | None = None,
    in_specs: Any = None,
    out_specs: Any = None,
) -> Float[Array, "m _"]:
    """The MoE expert matmul: rows `[start_g, end_g)` of `lhs [M, K]` times `rhs[g] [K, N]`, group by group.

    `group_sizes` lays the groups out back to back along M (empty groups allowed, sum at most M). `rhs`
    holds groups `o .. o + L - 1` with `o = group_offset` (an expert-parallel shard). Rows of other groups,
    and rows past the last group, are zeros; `existing_out`, where given, is cast to the result's dtype and
    added to every row, as upstream does: owned rows accumulate onto it, the others keep it. Negative sizes,
    sizes summing past M and an offset outside `[0, G - L]` are a ValueError outside `jit` (under it too
    with `EJKERNEL_CHECKS=1`); otherwise, under `jit`, each size is clamped to >= 0 and their running sum to
    M (the group crossing M ends there, later groups are empty), and an out-of-range offset owns no rows
    (zeros, plus `existing_out`).

    Dtypes, as upstream and `jax.lax.ragged_dot`: lhs and rhs may be different float dtypes (bfloat16
    activations with float32 weights); they are multiplied in their promoted dtype (lhs's for an int8 or
    8-bit float rhs), products accumulate in float32, and each gradient comes back in its own input's dtype.
    Differentiable in lhs, rhs, existing_out, rhs_scale and rhs_bias.

    Quantized weights: `rhs` may be a `QuantizedArray` (`ejkernel.quantization.quantize_array(w, ...)` of
    `w [L, K, N]`, or `[L, N, K]` with `transpose_rhs`; any mode and `axis`): the result is that of the
    dequantized `w` (decoded in the Triton kernel's registers on a GPU; MXFP4 and affine int4 with codes along K on
    Hopper in a Mosaic GPU kernel, into the registers its tensor cores read; per row span on XLA). Its weights
    are frozen: only lhs (and existing_out, rhs_bias) get gradients, its arrays zero cotangents. With
    `use_v3`, an int8 or float8_e4m3fn `rhs` with `rhs_scale` is DeepSeek-V3's block-scaled form (128 x 128
    scale blocks broadcast along N), scaled in the Triton kernel.

    Args:
        lhs: `[M, K]` float, the rows (tokens sorted by group).
        rhs: `[L, K, N]` (`[L, N, K]` with `transpose_rhs`), float, or integer (int8) with `rhs_scale`: the
            weights of L groups; `L` is the number of groups G without `group_offset`. Or a `QuantizedArray`
            with a leading group axis L, as above.
        group_sizes: `[G]` integer, the rows of each group, in order.
        group_offset: Scalar or `[1]` integer array, or an int: the first group `rhs` holds; None (default):
            0, and then `L` must be G.
        existing_out: `[M, N]`, any float dtype, added as above; None (default): nothing.
        preferred_element_type: The result's float dtype (default float32; None: float32).
        rhs_scale: `[L, blocks, 1, N]` float, v3 only: multiplies each of `blocks` equal K blocks of each
            output column of `rhs`; `blocks` divides K. None (default).
        rhs_bias: `[L, 1, N]` float, v3 only: added to each owned row. None (default).
        transpose_rhs: `rhs` is `[L, N, K]` (default False).
        interpret: Run Pallas kernels in interpret mode (default False); a bool.
        do_padding: Accepted for compatibility (default True; every implementation takes any M); a bool.
        precision: The XLA platform's matmul precision (default `jax.lax.Precision.DEFAULT`); the kernels
            of other platforms accumulate in float32 whatever it says.
        use_v2: Upstream's second kernel; computes the same (default False).
        use_v3: Allow the v3 options `rhs_scale` and `rhs_bias` (default False).
        fp8_lhs: Opt-in FP8 x FP8 product for a float8_e4m3fn `rhs` with `rhs_scale` (default False): lhs is
            rounded to float8_e4m3fn per row and K block of `rhs_scale` (scale `absmax / 448`, 1 for an
            all-zero block) and the products run on FP8 tensor cores, `Σ_blocks (a8 · w8) · sa · sb`, so the
            result is that of the rounded lhs (`grouped_matmul_reference(..., fp8_lhs=True)`); the gradient
            passes straight through the rounding. The Triton kernel rounds on the fly; other platforms round
            lhs first. On a Hopper GPU, weights laid out `[L, N, K]` (`transpose_rhs=True`) with scale blocks of a
            multiple of 128 rows run the Mosaic GPU FP8 forward (tiles: `cfg.mosaic_fp8_tiling`).
        out_shard_callback: Applied to the output (of each shard, under `mesh`), e.g. a `psum` over a
            tensor-parallel axis; None (default).
        platform: `"auto"`, `"xla"`, `"triton"` or `"pallas"`; None (default): `cfg.platform`, else auto.
        cfg: A `GroupedMatmulConfig` tiling the kernels; None (default): the executor's choice (cache,
            tuning or heuristics).
        mesh: A `jax.sharding.Mesh` to run the op on under `shard_map`; None (default): no sharding. Needs
            `in_specs` and `out_specs`. Each shard checks its own shapes.
        in_specs: A `PartitionSpec` per tensor passed, or per positional slot. They may split N (the output
            as the weights); K only with an `out_shard_callback` that sums the shards' parts; never M or
            `group_sizes`. `rhs_scale` and `rhs_bias` follow `rhs`.
        out_specs: The output's spec, laid out as the inputs.

    Returns:
        `out [M, N]` in `preferred_element_type`.

    Raises:
        TypeError: An argument of another rank, dtype kind or named size than above (one line naming it),
            an integer `rhs` without `rhs_scale`, a non-float `preferred_element_type`, non-bool
            `interpret` or `do_padding`, or a `cfg` of another class.
        ValueError: `use_v2` and `use_v3` together, or a v3 option without `use_v3`; mismatched K or other
            shapes; a `QuantizedArray` rhs without a leading group axis, of an unknown mode, whose groups do
            not divide K, with `rhs_scale` or with `mesh`; `fp8_lhs` without a float8_e4m3fn rhs and
            `rhs_scale`; `group_sizes` with fewer than L entries, or more without
            `group_offset`; bad `group_sizes` or `group_offset` values (rule above); sharding specs that
            split what the op computes across, or that disagree; a `platform` that is unknown, has no
            implementation on this device or contradicts `cfg.platform`.

    Example:
        >>> import jax, numpy as np
        >>> from ejkernel.modules import grouped_matmul
        >>> rng = np.random.default_rng(0)
        >>> lhs = rng.standard_normal((6, 4), np.float32)
        >>> rhs = rng.standard_normal((3, 4, 5), np.float32)
        >>> group_sizes = np.array([2, 0, 3])  # rows 0-1: group 0, rows 2-4: group 2, row 5: none
        >>> out = jax.jit(grouped_matmul)(lhs, rhs, group_sizes)
        >>> print(out.shape, out.dtype)
        (6, 5) float32
        >>> bool(np.allclose(out[2:5], lhs[2:5] @ rhs[2], atol=1e-5)), bool((out[5] == 0).all())
        (True, True)
    """
    check_versions(use_v2, use_v3, rhs_scale, rhs_bias)
    if not isinstance(do_padding, bool) or not isinstance(interpret, bool):
        raise TypeError(f"do_padding and interpret must be bools, got {do_padding!r}, {interpret!r}")
    options = dict(
        preferred_element_type=result_dtype(preferred_element_type),
        rhs_scale=rhs_scale,
        rhs_bias=rhs_bias,
        transpose_rhs=bool(transpose_rhs),
        precision=precision,
        use_v3=bool(use_v3),
    )
    if interpret:
        options["interpret"] = True
    if fp8_lhs is not False:
        options["fp8_lhs"] = fp8_lhs  # (absent by default: invocations and cache keys stay as they were)
    if isinstance(group_offset, int):
        group_offset = jnp.asarray(group_offset, jnp.int32)
    if mesh is not None and isinstance(rhs, QuantizedArray):
        raise ValueError("grouped_matmul: a QuantizedArray rhs is not sharded by mesh=: call it inside your shard_map")
    if mesh is None:  # under a mesh each shard's implementation checks its own (local) shapes
        check_args(
            lhs,
            rhs,
            group_sizes,
            group_offset,
            existing_out,
            preferred_element_type=preferred_element_type,
            rhs_scale=rhs_scale,
            rhs_bias=rhs_bias,
            transpose_rhs=transpose_rhs,
            use_v3=use_v3,
            fp8_lhs=fp8_lhs,
        )
    return executor(
        GroupedMatmul(out_shard_callback),
        lhs,
        rhs,
        group_sizes,
        group_offset,
        existing_out,
        platform=platform,
        cfg=cfg,
        mesh=mesh,
        in_specs=in_specs,
        out_specs=out_specs,
        **options,
    )
