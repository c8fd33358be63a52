"""`quantized_matmul`: `x` times weights packed by `ejkernel.quantization` (affine, nf4, mxfp4/8, nvfp4/8).

Layouts (`ejkernel.quantization.matmul`): without transpose `w` packs `W [K, N]` grouped along N and
`y = x @ W`; with it `w` packs `W [N, K]` grouped along K and `y = x @ Wᵀ`. Weights from
`prepack_quantized_weights(kernel[in, out], transpose=False)` fit the first.
"""

import dataclasses
import math
import os
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from ejkernel.kernels._common.quantized_matmul import DECODE_BITS, DECODE_ROWS, TILE_VALUES
from ejkernel.modules.operations._common import executor
from ejkernel.ops import Invocation, Kernel, KernelConfig
from ejkernel.ops.config import POSITIVE_INT, KernelTiling, Rule
from ejkernel.quantization.matmul import check_matmul_operands, resolve_transpose
from ejkernel.quantization.modes import resolve_params
from ejkernel.registry import Backend, Platform, current_backend, implementations

IMPLEMENTATIONS = implementations(
    "quantized_matmul",
    (Platform.PALLAS, Backend.GPU, "ejkernel.kernels._pallas.gpu.quantized_matmul:quantized_matmul_mosaic_gpu"),
    (Platform.TRITON, Backend.GPU, "ejkernel.kernels._triton.quantized_matmul:quantized_matmul_triton"),
    (Platform.XLA, Backend.ANY, "ejkernel.kernels._xla.quantized_matmul:quantized_matmul_xla"),
)
"""Best first on a GPU: the Mosaic GPU kernel serves decoding with 8-bit codes (affine, mxfp8, nvfp8; bfloat16 or
float16 x, N a multiple of 128) on a Hopper GPU, in the layouts and row counts where it was measured faster than
Triton (`FASTER_THAN_TRITON` of its interface); Triton serves the other decode calls (up to `DECODE_ROWS` rows of
x, 4- and 8-bit codes); XLA the rest."""

TPU_PATHS = ("packed", "hybrid", "predecode")
GEMV_MODES = ("auto", "on", "off")
REVSPLIT_MODES = ("auto", "on", "off")
REVSPLIT_PARTS = (1, 2, 4, 8, 16)
STRICT_FUSE_ENV = "EJKERNEL_QMM_STRICT_FUSED"
TRITON_TILES = {
    (False, 4): (64, 256, 4, 4),
    (False, 8): (256, 64, 4, 8),
    (True, 4): (64, 256, 4, 2),
    (True, 8): (64, 256, 4, 2),
}
"""The Triton kernel's heuristic `(block_n, block_k, num_warps, split_k)` by `(transpose, bits)` (the kernel serves 4
and 8 bits only): the fastest of sweeps on an H200 at M = 16, K = N = 8192. Without transpose `exp/s28_qmm_sweep.py`
(4-bit 0.0576 ms a layer against 0.0792 for the earlier (64, 256, 8 warps, unsplit); 8-bit 0.0681 against 0.0906);
with it `exp/s46_qmm_tiles.py`, two contraction splits of 4 warps where one of 8 warps had a program an SM (4-bit
0.0388 -> 0.0341 ms; 8-bit 0.0334 -> 0.0333 at M 16, 0.0645 -> 0.0616 at M 64)."""

MOSAIC_CANDIDATES = ((64, 8), (128, 4), (128, 8), (256, 4))
"""`(block_k, num_stages)` autotuning tries on the Mosaic GPU kernel, beside its defaults (in session 32's first
round none beat 256-wide steps with 4 stages, now the default, at K = N = 8192)."""


def _power_of_two(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0 and not value & (value - 1)


@dataclasses.dataclass(frozen=True)
class QuantizedMatmulMosaicTiling(KernelTiling):
    """The tiles of the Mosaic GPU decode kernel (`QuantizedMatmulConfig.mosaic_tiling`); no other path reads it.
    A field left None keeps the kernel's default (in brackets); none changes the result beyond float32 summation
    order. The kernel fits them to the call (the step down to 128 or 64 where K or the groups ask it, or where a
    default step leaves shared memory for fewer than 3 slots; stages to shared memory; splits to at least 4 steps
    each). A config that names a tiling, even an empty one, runs the kernel where its defaults were not measured
    faster than Triton (those calls decline otherwise, and `auto` runs Triton).

    Attributes:
        block_k: Contraction per step, 64, 128 or 256 [256].
        num_stages: Shared-memory slots of the ring of code and x tiles [4].
        split_k: Contraction splits (float32 partial sums added by XLA) [enough to fill the GPU's SMs].

    Raises:
        ValueError: A field set to anything but a positive int; one line naming the field.

    Example:
        >>> from ejkernel.modules import QuantizedMatmulConfig, QuantizedMatmulMosaicTiling
        >>> cfg = QuantizedMatmulConfig(platform="pallas", mosaic_tiling=QuantizedMatmulMosaicTiling(block_k=256))
        >>> cfg.mosaic_tiling.block_k
        256
    """

    block_k: int | None = None
    num_stages: int | None = None
    split_k: int | None = None

    RULES: ClassVar[dict[str, Rule]] = dict.fromkeys(("block_k", "num_stages", "split_k"), POSITIVE_INT)


@dataclasses.dataclass(frozen=True)
class QuantizedMatmulConfig(KernelConfig):
    """Tiling and operand precision of a quantized matmul.

    Only the fields a platform reads have any effect there, and none changes what is computed.

    Attributes:
        block_m: Rows of x per tile, a positive power of two (default 128); the Triton kernel fits it to the
            rows (16 to 64).
        block_n: Output columns per tile, a positive power of two (default 128); the XLA path tiles the
            packed rows of W by it with transpose (rows are N); the Triton kernel's columns per program
            (16 to 256).
        block_k: Contraction per tile, a positive power of two (default 64); the XLA path tiles the packed
            rows of W by it without transpose (rows are K); the Triton kernel's contraction per step (16 to
            512, and at most 32768 decoded values a step).
        num_warps: The Triton kernel's warps, a positive power of two (default 4).
        num_stages: The Triton kernel's pipeline stages, a positive int (default 3).
        use_bf16: Upstream's choice of bf16 or f16 dot operands for 16-bit `x`, accepted for compatibility
            (default True): operands here are in `x`'s dtype, so that a config never changes a result.
        split_k: The Triton kernel's contraction splits (float32 partial sums added by XLA), a positive int;
            None (default): enough splits to fill the GPU's SMs.
        tpu_path: `"packed"` or None (default); legacy `"hybrid"` / `"predecode"` are accepted.
        mosaic_tiling: A `QuantizedMatmulMosaicTiling`: the Mosaic GPU decode kernel's tiles, read by it only.
            None (default): its defaults.
        platform: `"auto"` (default), `"pallas"` (Mosaic GPU on a Hopper GPU; up to 64 rows of x, 8-bit codes),
            `"triton"` (GPU; up to 64 rows of x, 4- and 8-bit codes) or `"xla"`.
        fwd_params: Not read by this op.
        bwd_params: Not read by this op.
        backend: `"any"` (default), `"gpu"`, `"tpu"` or `"cpu"`: the device kind the config is meant for; a
            call on another kind refuses it.

    Raises:
        ValueError: A field outside the domain above, a `mosaic_tiling` of another type, or an unknown `platform`
            or `backend`.
    """

    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 3
    use_bf16: bool = True
    split_k: int | None = None
    tpu_path: str | None = None
    mosaic_tiling: QuantizedMatmulMosaicTiling | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        name = type(self).__name__
        if self.mosaic_tiling is not None and not isinstance(self.mosaic_tiling, QuantizedMatmulMosaicTiling):
            raise ValueError(f"{name}.mosaic_tiling must be a QuantizedMatmulMosaicTiling, got {self.mosaic_tiling!r}")
        for field in ("block_m", "block_n", "block_k", "num_warps"):
            if not _power_of_two(getattr(self, field)):
                raise ValueError(f"{name}.{field} must be a positive power of two, got {getattr(self, field)!r}")
        for field, optional in (("num_stages", False), ("split_k", True)):
            value = getattr(self, field)
            if not (optional and value is None) and (
                not isinstance(value, int) or isinstance(value, bool) or value < 1
            ):
                raise ValueError(
                    f"{name}.{field} must be a positive int{' or None' if optional else ''}, got {value!r}"
                )
        if not isinstance(self.use_bf16, bool):
            raise ValueError(f"{name}.use_bf16 must be a bool, got {self.use_bf16!r}")
        if self.tpu_path is not None and self.tpu_path not in TPU_PATHS:
            raise ValueError(f"{name}.tpu_path must be one of {TPU_PATHS} or None, got {self.tpu_path!r}")


def _tile_field(inv: Invocation) -> str:
    return "block_n" if inv.kwargs["transpose"] else "block_k"


def _triton_serves(inv: Invocation) -> bool:
    """Whether the call goes to the Triton kernel: asked for, or auto on a GPU with a call it serves."""
    if inv.platform != "auto":
        return inv.platform == "triton"
    return (
        current_backend() == Backend.GPU and inv.args[0].shape[0] <= DECODE_ROWS and inv.kwargs["bits"] in DECODE_BITS
    )


def _triton_cfg(
    block_n: int, block_k: int, num_warps: int, platform: str, split_k: int | None = None
) -> QuantizedMatmulConfig:
    tiles = dict(block_m=DECODE_ROWS, block_n=block_n, block_k=block_k, num_warps=num_warps, split_k=split_k)
    return QuantizedMatmulConfig(platform=platform, **tiles)


class QuantizedMatmul(Kernel):
    """The executor's `Kernel` for `quantized_matmul`: op id `"quantized_matmul"`, config `QuantizedMatmulConfig`.

    Without a measured config: for the Triton kernel `TRITON_TILES`; for XLA, row tiles of about
    `TILE_VALUES` dequantized values; the Mosaic GPU kernel its own defaults (`QuantizedMatmulMosaicTiling`).
    Autotuning (policy `autotune`) also times 128, 512 and 2048 packed rows per tile on XLA, Triton tiles of 32
    to 256 columns by 64 to 512 contraction steps (at most 32K values; 8 warps above 8K), the heuristic tiles
    with 1, 2 or 4 contraction splits, and the Mosaic GPU kernel's `MOSAIC_CANDIDATES`.
    """

    op_id = "quantized_matmul"
    config_type = QuantizedMatmulConfig

    def axis_roles(self, args, kwargs):
        """Rows of x only: the contraction and the packed columns (codes of several columns share a word,
        groups share a scale) stay whole."""
        inputs = {0: ("x", ("batch", "dim"))}
        inputs |= {i: (name, ("packed", "packed")) for i, name in ((1, "w"), (2, "scales"), (3, "zeros"))}
        return inputs, ("batch", None)

    def heuristic_cfg(self, inv: Invocation) -> QuantizedMatmulConfig:
        """The Triton kernel's tiles where it serves the call; else row tiles of about `TILE_VALUES` dequantized
        values (a power of two of rows, at least 8): a large matrix is walked in a few tiles, a small one in one."""
        if _triton_serves(inv):
            key = (inv.kwargs["transpose"], 4 if inv.kwargs["bits"] <= 4 else 8)  # other widths: the kernel declines
            block_n, block_k, warps, split_k = TRITON_TILES[key]
            return _triton_cfg(block_n, block_k, warps, inv.platform, split_k)
        w, scales = inv.args[1], inv.args[2]
        columns = max(1, scales.shape[1] * inv.kwargs["group_size"])
        rows = max(8, min(1 << max(0, (TILE_VALUES // columns).bit_length() - 1), 1 << (w.shape[0] - 1).bit_length()))
        return QuantizedMatmulConfig(platform=inv.platform, **{_tile_field(inv): rows})

    def platform_cfgs(self, platform: str, inv: Invocation):
        yield self.heuristic_cfg(dataclasses.replace(inv, platform=platform))
        if platform == "xla":
            for rows in (128, 512, 2048):
                yield QuantizedMatmulConfig(platform=platform, **{_tile_field(inv): rows})
        if platform == "triton":
            for block_n in (32, 64, 128, 256):
                for block_k in (64, 128, 256, 512):
                    if block_n * block_k <= 1 << 15:
                        yield _triton_cfg(block_n, block_k, 4 if block_n * block_k <= 1 << 13 else 8, platform)
            heuristic = self.heuristic_cfg(dataclasses.replace(inv, platform=platform))
            for split_k in (1, 2, 4):
                yield dataclasses.replace(heuristic, split_k=split_k)
        if platform == "pallas" and current_backend() == Backend.GPU:
            for block_k, stages in MOSAIC_CANDIDATES:
                tiling = QuantizedMatmulMosaicTiling(block_k=block_k, num_stages=stages)
                yield QuantizedMatmulConfig(platform=platform, mosaic_tiling=tiling)


def _choice(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


def _flag(name: str, value, optional: bool = True) -> None:
    if not (isinstance(value, bool) or (optional and value is None)):
        raise ValueError(f"{name} must be a bool{' or None' if optional else ''}, got {value!r}")


def _strict_from_env() -> bool:
    return os.environ.get(STRICT_FUSE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def quantized_matmul(
    x: jax.Array,
    w: jax.Array,
    scales: jax.Array,
    zeros: jax.Array | None = None,
    /,
    *,
    transpose: bool = False,
    group_size: int | None = None,
    bits: int | None = None,
    mode: str = "affine",
    axis: str | None = None,
    gemv_mode: str = "auto",
    revsplit_k: str = "auto",
    revsplit_k_parts: int | None = None,
    fuse: bool = True,
    strict_fuse: bool | None = None,
    tpu_path: str | None = None,
    allow_dense_fallback: bool | None = None,
    use_best_config: bool = False,
    platform: str | None = None,
    cfg: QuantizedMatmulConfig | None = None,
    mesh: jax.sharding.Mesh | None = None,
    in_specs: Any = None,
    out_specs: Any = None,
) -> jax.Array:
    """`x [..., K]` times weights packed by `ejkernel.quantization` (affine, nf4, mxfp4/8, nvfp4/8).

    Leading dims of x are flattened into M. Layouts (`ejkernel.quantization.matmul`): with `transpose=False`,
    `w [K, ceil(N·b/32)]` and `scales [K, N/g]` pack `W [K, N]` grouped along N and `y = x @ W`; with
    `transpose=True`, `w [N, ceil(K·b/32)]` and `scales [N, K/g]` pack `W [N, K]` grouped along K and
    `y = x @ Wᵀ`. `prepack_quantized_weights(kernel[in, out])` gives the second layout, and with
    `transpose=False` the first. Row tiles of W are dequantized, rounded to x's dtype and multiplied in it,
    accumulating in float32, so the full float W never exists (`fuse=False`: one tile of all rows). On a GPU,
    calls of up to 64 rows of x with 4- or 8-bit codes run a kernel that reads the packed words once and decodes
    them in registers: on a Hopper GPU with 8-bit codes (affine, mxfp8, nvfp8), bfloat16/float16 x and N a
    multiple of 128, a Mosaic GPU kernel (`platform="pallas"`), else a Triton one (`platform="triton"`); XLA
    serves the others.

    Strategy knobs are validated and never change the result: `strict_fuse` forbids dense fallbacks, which
    the XLA path never needs (it computes every width, odd ones too); `allow_dense_fallback`, `tpu_path`,
    `gemv_mode`, `revsplit_k` and `revsplit_k_parts` select kernel variants of platforms that have them
    (neither XLA nor Triton has any). Differentiable in `x` (`∂x` in x's dtype); `w`, `scales` and `zeros`
    get zero cotangents.

    Args:
        x: `[..., K]` float, rank >= 2.
        w: uint32 packed codes, `[K, ceil(N·b/32)]`, or `[N, ceil(K·b/32)]` with `transpose`.
        scales: `[K, N/g]` (`[N, K/g]` with `transpose`): float for affine and nf4, uint8 codes for mx and nv
            modes.
        zeros: Affine zero points, float, shaped like `scales`; None (default) for the other modes.
        transpose: Which layout `w` has, as above (default False).
        group_size: Values per group, g; None (default): `quantize`'s default for the mode (64; 32 for mx,
            16 for nv modes, which allow nothing else). Must be the one `w` was quantized with.
        bits: Code width of affine, 1 to 8; None (default): 4. Other modes fix it.
        mode: `"affine"` (default), `"nf4"`, `"mxfp4"`, `"mxfp8"`, `"nvfp4"` or `"nvfp8"`, any case.
        axis: Upstream's name of the layout: `"row"` is `transpose=False`, `"col"` is `transpose=True` (not
            the `axis` given to `quantize`); it wins when given. None (default).
        gemv_mode: `"auto"` (default), `"on"` (x must be one row) or `"off"`.
        revsplit_k: `"auto"` (default), `"on"` (needs a 4-bit mode) or `"off"`.
        revsplit_k_parts: 1, 2, 4, 8 or 16; None (default).
        fuse: True (default): dequantize row tiles of W; False: all of W before one matmul.
        strict_fuse: Forbid dense fallbacks; None (default): env `EJKERNEL_QMM_STRICT_FUSED` (1, true, yes,
            on).
        tpu_path: `"packed"`, or the legacy `"hybrid"` / `"predecode"`; None (default).
        allow_dense_fallback: A bool or None (default).
        use_best_config: True: the tiling from the executor's config selection (caches, autotuning when the
            policy allows it, else a size heuristic); False (default): `QuantizedMatmulConfig()`'s
            defaults. `cfg` always wins.
        platform: `"auto"`, `"pallas"` (Mosaic GPU, Hopper; up to 64 rows of x, 8-bit codes), `"triton"` (GPU;
            up to 64 rows of x, 4- and 8-bit codes) or `"xla"`; None (default): `cfg.platform`, else auto.
        cfg: A `QuantizedMatmulConfig`; None (default): as `use_best_config` says.
        mesh: A `jax.sharding.Mesh` to run the op on under `shard_map`; None (default): no sharding. Needs
            `in_specs` and `out_specs`, and a 2-D `x`.
        in_specs: A `PartitionSpec` per tensor passed, or per positional slot. They may split the rows of
            `x`; the packed weights and their metadata stay whole on every shard.
        out_specs: The output's spec, laid out as the inputs.

    Returns:
        `y [..., N]`, float32.

    Raises:
        ValueError: A `mode`, `group_size`, `bits`, `axis`, `transpose` or knob outside its domain;
            `strict_fuse` with `allow_dense_fallback=True` or `fuse=False`; `gemv_mode="on"` with more
            than one row, or `revsplit_k="on"` with another width than 4 bits; x, `w`, `scales` or `zeros`
            of a wrong dtype or shape (`zeros` given outside affine, or missing for it); `mesh` with x not
            2-D; sharding specs that split the packed axes; a `platform` that is unknown, has no
            implementation on this device or contradicts `cfg.platform`.
        TypeError: A `cfg` of another class.

    Example:
        >>> import numpy as np
        >>> from ejkernel.modules import quantized_matmul
        >>> from ejkernel.quantization import prepack_quantized_weights
        >>> kernel = np.random.default_rng(0).standard_normal((64, 128), np.float32)  # [in, out]
        >>> w, scales, zeros = prepack_quantized_weights(kernel, transpose=False)  # 4-bit affine, g = 64
        >>> print(w.shape, w.dtype, scales.shape)
        (64, 16) uint32 (64, 2)
        >>> y = quantized_matmul(np.ones((2, 3, 64), np.float32), w, scales, zeros)
        >>> print(y.shape, y.dtype)
        (2, 3, 128) float32
    """
    params = resolve_params(mode, group_size, bits)
    transpose = resolve_transpose(transpose, axis)
    _flag("fuse", fuse, optional=False)
    _flag("use_best_config", use_best_config, optional=False)
    _flag("strict_fuse", strict_fuse)
    _flag("allow_dense_fallback", allow_dense_fallback)
    strict = _strict_from_env() if strict_fuse is None else strict_fuse
    if strict and allow_dense_fallback:
        raise ValueError("strict_fuse=True forbids dense fallbacks: allow_dense_fallback=True contradicts it")
    if strict and not fuse:
        raise ValueError("strict_fuse=True requires fuse=True (fuse=False is the dense path)")
    if tpu_path is not None:
        _choice("tpu_path", tpu_path, TPU_PATHS)
    _choice("gemv_mode", gemv_mode, GEMV_MODES)
    _choice("revsplit_k", revsplit_k, REVSPLIT_MODES)
    if revsplit_k == "on" and params.bits != 4:
        raise ValueError(f"revsplit_k='on' needs a 4-bit mode, got mode={params.mode!r} with {params.bits} bits")
    if revsplit_k_parts is not None:
        _choice("revsplit_k_parts", revsplit_k_parts, REVSPLIT_PARTS)
    x, w, scales = jnp.asarray(x), jnp.asarray(w), jnp.asarray(scales)
    zeros = None if zeros is None else jnp.asarray(zeros)
    k, n = check_matmul_operands(x, w, scales, zeros, params, transpose)
    lead = x.shape[:-1]
    if gemv_mode == "on" and math.prod(lead) != 1:
        raise ValueError(f"gemv_mode='on' needs a single row of x (M = 1), got x of shape {tuple(x.shape)}")
    if cfg is None and not use_best_config:
        cfg = QuantizedMatmulConfig(platform="auto" if platform is None else platform)
    if mesh is not None and x.ndim != 2:
        raise ValueError(f"with mesh=, x must be 2-D [M, K] (its specs name its axes), got shape {tuple(x.shape)}")
    out = executor(
        QuantizedMatmul(),
        x.reshape(-1, k),
        w,
        scales,
        zeros,
        platform=platform,
        cfg=cfg,
        mesh=mesh,
        in_specs=in_specs,
        out_specs=out_specs,
        transpose=transpose,
        group_size=params.group_size,
        bits=params.bits,
        mode=params.mode,
        fuse=fuse,
    )
    return out.reshape(*lead, n)
