"""The Mosaic GPU weight-only quantized matmul for decoding (Hopper): the entry point, its declines and its tiles.

Serves the decode case with 8-bit codes (affine int8, mxfp8, nvfp8) in both layouts: at most `DECODE_ROWS` rows
of bfloat16/float16 x, N a multiple of `CTA_FEATURES` (128), K a multiple of 64, groups that fit the step's tile
(a tile holds whole groups or lies inside one; groups of at least 16 values). It declines the rest
(NotImplementedError, before anything is traced, so `platform="auto"` falls back to Triton): 4-bit and other code
widths, nf4, float32 x, more rows, other sizes, devices other than Hopper GPUs; and, unless the config names a
`mosaic_tiling`, the calls `FASTER_THAN_TRITON` does not list as measured faster than Triton. The kernel is
`_kernel`; the backward (`∂x` only: the weights are frozen) is `_common.quantized_matmul`'s plain-JAX product, as
the Triton path's.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ejkernel.kernels._common.code_bits import as_bytes
from ejkernel.kernels._common.device import is_hopper, num_sms
from ejkernel.kernels._common.quantized_matmul import DECODE_ROWS, QuantizedMatmulStatic, default_tile, with_vjp
from ejkernel.quantization.modes import QuantParams

WHO = "mosaic gpu quantized_matmul"
X_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
MODES = ("affine", "mxfp8", "nvfp8")
CTA_FEATURES = 128  # (`_kernel.CTA_FEATURES`, here so that declining loads no Mosaic GPU)
TOKEN_ALIGN = 16
MIN_GROUP = 16  # the narrowest group a tile's scale columns are spread over (a whole wgmma column tile)
BLOCK_KS = (256, 128, 64)
DEFAULT_BLOCK_K = 256  # measured best in round one (H200, K = N = 8192): bk64 s8 and bk128 s4/s6/s8 were slower
DEFAULT_STAGES = 4
MIN_DEFAULT_STAGES = 3  # the default step shrinks rather than run a shallower ring; an asked step keeps 2
SMEM_BUDGET = 227 * 1024
MIN_STEPS_PER_SPLIT = 4
SCALE_AFTER_MAX_TOKENS = 32
"""The most rows of x (padded) at which affine codes with transpose take their scales after the product: each
group's `64 x tokens` product is scaled and offset in float32 (2 FMAs a product), cheaper than scaling its
`64 x group` codes only while tokens are few; and a warpgroup holds a step's group products in registers."""
SCALE_AFTER_PART_VALUES = 64
"""The most group products a step holds with `scale_after`, as groups x tokens (their float32 registers a thread:
half of it), beside two steps' codes: the step shrinks to keep within it (256 at 16 tokens, 128 at 32 with groups
of 64)."""
FASTER_THAN_TRITON = {
    ("affine", True, 64): (0.0466, 0.0621),
    ("mxfp8", False, 16): (0.0522, 0.0708),
    ("mxfp8", True, 64): (0.0390, 0.0605),
    ("nvfp8", False, 16): (0.0697, 0.1000),
}
"""`(mode, transpose, tokens)` (x's rows padded: 16, else counted as 64) where the Mosaic GPU kernel's default
tiles ran at least 5% faster than the Triton kernel: `(mosaic, triton)` ms a layer, 8-bit codes, K = N = 8192 on
an H200 (session 32, call 4, `exp/s32_qmm_mosaic.py`). The other calls were slower or within 5% (int8 col 16
0.0353 against 0.0329, mxfp8 row 64 0.0561 / 0.0392, mxfp8 col 16 0.0353 / 0.0362, nvfp8 row 64 0.0700 / 0.0396,
nvfp8 col 0.0483 / 0.0384 and 0.0541 / 0.0521; session 33: int8 col 16 0.0374 / 0.0343, int8 row 64 0.0736 at its
best step against Triton's 0.048 of round one): they decline (so `auto` runs Triton) unless the config names a
`mosaic_tiling`."""


def _decline(x, params: QuantParams, k: int, n: int) -> None:
    """NotImplementedError for the calls the kernel does not serve (see the module's docstring)."""
    if jnp.dtype(x.dtype) not in X_DTYPES:
        raise NotImplementedError(f"{WHO} takes bfloat16/float16 x, got {x.dtype}")
    if params.bits != 8 or params.mode not in MODES:
        raise NotImplementedError(f"{WHO} takes 8-bit codes ({', '.join(MODES)}), got {params.mode} {params.bits}-bit")
    if not 0 < x.shape[0] <= DECODE_ROWS:
        raise NotImplementedError(f"{WHO} serves 1 to {DECODE_ROWS} rows of x (decoding), got {x.shape[0]}")
    if n % CTA_FEATURES or k % 64 or k == 0:
        raise NotImplementedError(f"{WHO} needs N a multiple of {CTA_FEATURES} and K of 64, got N {n} and K {k}")
    if params.group_size < MIN_GROUP:
        raise NotImplementedError(f"{WHO} needs groups of at least {MIN_GROUP} values, got {params.group_size}")


def _decline_unmeasured(cfg, params: QuantParams, transpose: bool, m: int) -> None:
    """NotImplementedError where `FASTER_THAN_TRITON` does not list the call and the config names no
    `mosaic_tiling`."""
    tokens = 16 if m <= TOKEN_ALIGN else 64
    if (params.mode, transpose, tokens) not in FASTER_THAN_TRITON and getattr(cfg, "mosaic_tiling", None) is None:
        layout = "transposed" if transpose else "untransposed"
        raise NotImplementedError(
            f"{WHO}: {params.mode} {layout} weights at {m} rows were not measured faster than Triton on an H200; "
            "a config's mosaic_tiling asks for the kernel anyway"
        )


def smem_fits(st, tiling) -> bool:
    """Whether a CTA of `tiling` fits the shared memory of a Hopper SM (`SMEM_BUDGET`)."""
    from ejkernel.kernels._pallas.gpu.quantized_matmul._kernel import smem_bytes

    return smem_bytes(st, tiling) <= SMEM_BUDGET


def plan(cfg, params: QuantParams, transpose: bool, m: int, k: int, n: int, x_dtype):
    """The kernel's tiling from `cfg.mosaic_tiling` (None fields: `DEFAULT_BLOCK_K`, `DEFAULT_STAGES`, splits that
    fill the GPU's SMs), fitted: the step the largest of `BLOCK_KS` up to the one asked that divides K, holds
    whole groups (with transpose) or lies inside one, holds at most `SCALE_AFTER_PART_VALUES` group products where
    scales apply after them, and leaves shared memory for `MIN_DEFAULT_STAGES` slots (2 where the config asked the
    step); stages cut to shared memory; splits at most one per `MIN_STEPS_PER_SPLIT` steps, none empty.
    NotImplementedError where no step fits."""
    from ejkernel.kernels._pallas.gpu.quantized_matmul._kernel import (
        MosaicGpuQuantizedMatmulStatic,
        MosaicGpuQuantizedMatmulTiling,
    )

    given = getattr(cfg, "mosaic_tiling", None)
    asked = getattr(given, "block_k", None)
    min_stages = 2 if asked else MIN_DEFAULT_STAGES
    asked = asked or DEFAULT_BLOCK_K
    g = params.group_size
    tokens = -(-m // TOKEN_ALIGN) * TOKEN_ALIGN
    scale_after = params.mode == "affine" and transpose and g % 64 == 0 and tokens <= SCALE_AFTER_MAX_TOKENS
    st = MosaicGpuQuantizedMatmulStatic(params, transpose, k, n, tokens, jnp.dtype(x_dtype), scale_after)
    cols = (lambda bk: bk) if transpose else (lambda bk: 64)  # the code tile's columns, along which groups run

    def fits(bk, stages):
        whole_groups = cols(bk) % g == 0 or g % cols(bk) == 0
        parts_fit = not scale_after or max(1, bk // g) * tokens <= SCALE_AFTER_PART_VALUES
        tiling = MosaicGpuQuantizedMatmulTiling(bk, stages, 1)
        return bk <= max(asked, 64) and k % bk == 0 and whole_groups and parts_fit and smem_fits(st, tiling)

    block_k = next((bk for bk in BLOCK_KS if fits(bk, min_stages)), None)
    block_k = block_k or next((bk for bk in BLOCK_KS if fits(bk, 2)), None)
    if block_k is None:
        raise NotImplementedError(f"{WHO}: no step of {BLOCK_KS} divides K = {k} and fits groups of {g}")
    stages = max(2, getattr(given, "num_stages", None) or DEFAULT_STAGES)
    while stages > 2 and not fits(block_k, stages):
        stages -= 1
    steps = k // block_k
    splits = getattr(given, "split_k", None) or max(1, num_sms() // (n // CTA_FEATURES))
    splits = max(1, min(splits, steps // MIN_STEPS_PER_SPLIT))
    splits = -(-steps // -(-steps // splits))  # (the kernel's split of ceil(steps / splits) steps: none empty)
    return st, MosaicGpuQuantizedMatmulTiling(block_k, stages, splits)


def _forward(x, w, scales, zeros, *, st, tiling):
    from ejkernel.kernels._pallas.gpu.quantized_matmul._kernel import part_width, partial_products

    m, k = x.shape
    codes = as_bytes(w, jnp.uint8 if st.params.mode == "affine" else jnp.float8_e4m3fn)
    x = jnp.pad(x, ((0, st.tokens - m), (0, 0)))
    x_sums = None
    if st.scale_after:  # x summed over each group's part of a step: what the offsets multiply
        width = part_width(st, tiling)
        x_sums = x.astype(jnp.float32).reshape(st.tokens, k // width, width).sum(axis=2).T
    partial = partial_products(st, tiling, x, codes, scales, zeros, x_sums)
    out = partial[0] if tiling.splits == 1 else partial.sum(axis=0)
    return out[:, :m].T


@functools.partial(jax.jit, static_argnames=("static", "st", "tiling"))
def _run(x, w, scales, zeros, *, static: QuantizedMatmulStatic, st, tiling):
    return with_vjp(functools.partial(_forward, st=st, tiling=tiling), x, w, scales, zeros, static)


def _served(x, w, scales, cfg, *, transpose: bool, group_size: int, bits: int, mode: str):
    """`(params, N)` of a call the kernel serves; NotImplementedError (see the module's docstring) for the rest."""
    params = QuantParams(mode, group_size, bits)
    n = w.shape[0] if transpose else scales.shape[1] * group_size
    _decline(x, params, x.shape[1], n)
    _decline_unmeasured(cfg, params, transpose, x.shape[0])
    return params, n


def _product(x, w, scales, zeros, cfg, params: QuantParams, transpose: bool, n: int):
    st, tiling = plan(cfg, params, transpose, x.shape[0], x.shape[1], n, x.dtype)
    columns = scales.shape[1] * params.group_size
    static = QuantizedMatmulStatic(params, transpose, default_tile(w.shape[0], columns), jnp.dtype(x.dtype))
    return _run(x, w, scales, zeros, static=static, st=st, tiling=tiling)


def mosaic_quantized_matmul(x, w, scales, zeros=None, *, cfg, transpose: bool, group_size: int, bits: int, mode: str):
    """The kernel's differentiable product without the device check (lets CPU tests lower it for CUDA and run it
    in Mosaic GPU interpret mode)."""
    params, n = _served(x, w, scales, cfg, transpose=transpose, group_size=group_size, bits=bits, mode=mode)
    return _product(x, w, scales, zeros, cfg, params, transpose, n)


def quantized_matmul_mosaic_gpu(
    x, w, scales, zeros=None, *, cfg, transpose: bool, group_size: int, bits: int, mode: str, fuse: bool
):
    """float32 `[M, N]`: `x [M, K]` (M at most `DECODE_ROWS`) times the packed weights (checked by the public
    function) in one Mosaic GPU kernel on a Hopper GPU; `fuse` changes nothing here (W is never dequantized
    whole). Tiles from `cfg.mosaic_tiling` as `plan` says; none changes the result beyond float32 summation
    order. Differentiable in `x` (`∂x` in x's dtype, from the plain-JAX product). NotImplementedError, before
    anything is traced, for calls it does not serve (see the module's docstring).
    """
    del fuse
    # the call's own reasons first, then the device's
    params, n = _served(x, w, scales, cfg, transpose=transpose, group_size=group_size, bits=bits, mode=mode)
    if not is_hopper():
        raise NotImplementedError(
            f"{WHO} needs a Hopper GPU (compute capability 9.x), not {jax.devices()[0].device_kind}"
        )
    return _product(x, w, scales, zeros, cfg, params, transpose, n)
