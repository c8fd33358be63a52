"""The Mosaic GPU 4-bit grouped matmul forward (`QuantizedArray` weights in MXFP4 or affine int4, codes along K) on
this CPU host: the kernel matches the reference in Mosaic GPU's interpret mode (its jnp decoding: interpret mode runs
no PTX), the public path lowers for CUDA (the forward with its codes decoded in PTX; the lhs gradient to the 16-bit
kernels) and declines what it does not serve; (GPU suite) it matches the XLA path forward and in the lhs gradient on
a Hopper GPU, in both formats.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from ejkernel.kernels._common.code_bits import as_bytes
from ejkernel.kernels._pallas.gpu.grouped_matmul._four_bit import (
    CodeFormat,
    MosaicGpuFourBitGroupedMatmulTiling,
    four_bit_gmm,
)
from ejkernel.kernels._pallas.gpu.grouped_matmul._interface import grouped_matmul_mosaic_gpu, mosaic_grouped_matmul
from ejkernel.kernels._xla.grouped_matmul._interface import grouped_matmul_xla
from ejkernel.quantization import quantize_array
from ejkernel.reference.grouped_matmul import grouped_matmul_reference
from harness import assert_close, check_forward_and_grads, randn
from mosaic_gpu_interpret import interpret_mode

MXFP4, AFFINE = dict(mode="mxfp4"), dict(mode="affine", bits=4, group_size=64)


def _weights(groups, k, n, fmt=MXFP4):
    """4-bit weights of `w [G, K, N]` (`fmt`: `quantize_array`'s arguments; codes along K, as gpt-oss ships MXFP4)
    and the bf16 values they stand for, `[G, N, K]`: magnitudes varying by group, column and K group of 32 (over a
    range of powers of two; affine groups also offset from zero)."""
    values = randn((groups, k // 32, 32, n))
    magnitudes = jnp.exp2(jnp.round(randn((groups, k // 32, 1, n), scale=3.0)))
    offsets = randn((groups, k // 32, 1, n)) if fmt["mode"] == "affine" else 0.0
    q = quantize_array(((values + offsets) * magnitudes).reshape(groups, k, n), axis="row", **fmt)
    return q, q.dequantize().astype(jnp.bfloat16)


def _gmm(lhs, q, sizes, **kwargs):
    """`four_bit_gmm` on a `QuantizedArray`."""
    fmt = CodeFormat(q.mode, q.group_size)
    return four_bit_gmm(lhs, as_bytes(q.data), q.scales, q.zeros, sizes, None, fmt=fmt, **kwargs)


@pytest.mark.parametrize("fmt", [MXFP4, AFFINE], ids=["mxfp4", "affine"])
def test_interpret_forward_matches_reference(fmt, capfd):
    """Groups starting off multiples of 8, an empty group, rows past the last group (spans of zeros), two CTAs
    walking several units of two column tiles, a float32 output. MXFP4: 128-row tiles, three K steps; affine: 256-row
    tiles, spans both wider and narrower than `NARROW_ROWS`, four K steps (the kernel takes steps in pairs)."""
    if fmt is MXFP4:
        m, k, bm, sizes = 150, 192, 128, [37, 0, 70, 20]
    else:
        m, k, bm, sizes = 300, 256, 256, [37, 0, 170, 20]
    n, sizes = 256, jnp.asarray(sizes, jnp.int32)
    q, dense = _weights(len(sizes), k, n, fmt)
    lhs = randn((m, k), jnp.bfloat16)
    tiling = MosaicGpuFourBitGroupedMatmulTiling(bm, 3, 2)
    with interpret_mode():
        out = _gmm(lhs, q, sizes, out_dtype=jnp.float32, tiling=tiling, in_ptx=False)
    ref = grouped_matmul_reference(lhs.astype(jnp.float32), dense.astype(jnp.float32), sizes, transpose_rhs=True)
    assert_close(out, ref, jnp.float32)
    assert float(jnp.max(jnp.abs(out[int(sizes.sum()) :]))) == 0.0
    assert "RACE DETECTED" not in capfd.readouterr().out


def _lower(grad: bool, fmt=MXFP4, m=300, k=256, n=256, sizes=(100, 0, 120, 30)):
    sizes = jnp.asarray(sizes, jnp.int32)
    q, _ = _weights(len(sizes), k, n, fmt)

    def forward(lhs):
        return mosaic_grouped_matmul(lhs, q, sizes, preferred_element_type=jnp.bfloat16)

    fn = jax.value_and_grad(lambda lhs: jnp.sum(forward(lhs).astype(jnp.float32))) if grad else forward
    return export.export(jax.jit(fn), platforms=["cuda"])(jax.ShapeDtypeStruct((m, k), jnp.bfloat16)).mlir_module()


def test_forward_decodes_in_ptx_and_the_gradient_runs_the_16_bit_kernels():
    forward = _lower(grad=False)
    assert forward.count("@mosaic_gpu") == 1 and "mul.rn.bf16x2" in forward
    assert _lower(grad=True).count("@mosaic_gpu") == 2  # the 4-bit forward, dlhs on the decoded weights
    affine = _lower(grad=False, fmt=dict(AFFINE, group_size=128))  # (a group over two steps)
    assert affine.count("@mosaic_gpu") == 1 and "0f4B000000" in affine


def test_rejects_row_tiles_that_failed_on_a_gpu():
    """192-row tiles lower but read or wrote out of bounds on an H200: a one-line error before any tracing."""
    q, _ = _weights(2, 128, 128)
    tiling = MosaicGpuFourBitGroupedMatmulTiling(192, 4, 1)
    with pytest.raises(ValueError, match=r"block_m=192 one of \(128, 256\)"):
        _gmm(randn((64, 128), jnp.bfloat16), q, jnp.asarray([30, 34], jnp.int32), out_dtype=jnp.float32, tiling=tiling)


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (dict(lhs=jnp.float16), "bfloat16 lhs"),
        (dict(mode="nvfp4"), "MXFP4 and affine int4"),
        (dict(mode="affine", bits=8), "affine int4"),
        (dict(mode="affine", group_size=32), "multiple of 64"),
        (dict(axis="col"), "along K"),
        (dict(k=96), "steps of 64"),
        (dict(interpret=True), "interpret mode"),
        (dict(group_offset=True), "group_offset"),
    ],
)
def test_declines_what_it_does_not_serve(call, words):
    k, n, groups = call.get("k", 128), 256, 2
    w = randn((groups, k, n), jnp.float32)
    fmt = {key: call[key] for key in ("bits", "group_size") if key in call}
    q = quantize_array(w, mode=call.get("mode", "mxfp4"), axis=call.get("axis", "row"), **fmt)
    lhs = randn((64, k), call.get("lhs", jnp.bfloat16))
    sizes = jnp.asarray([30, 34], jnp.int32)
    offset = jnp.zeros((1,), jnp.int32) if call.get("group_offset") else None
    with pytest.raises(NotImplementedError, match=words):
        mosaic_grouped_matmul(lhs, q, sizes, offset, interpret=call.get("interpret"))


# ---- on a Hopper GPU ----


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("m", "k", "n", "groups", "fmt"),
    [
        (32768, 4096, 1536, 64, MXFP4),
        (3001, 512, 384, 7, MXFP4),
        (32768, 4096, 1536, 64, dict(AFFINE, group_size=128)),
        (3001, 512, 384, 7, AFFINE),
    ],
    ids=["mxfp4-moe", "mxfp4-small", "affine-g128-moe", "affine-g64-small"],
)
def test_gpu_matches_xla(m, k, n, groups, fmt):
    """Forward and lhs gradient within bf16's rounding of XLA's product of the decoded weights (the same bf16 values,
    summed in float32), zeros past the groups; the MoE shape and one of 128-column tiles, in both formats."""
    q, dense = _weights(groups, k, n, fmt)
    lhs = randn((m, k), jnp.bfloat16)
    cuts = np.sort(np.random.default_rng(m).integers(0, m - 50, groups - 1))
    sizes = jnp.asarray(np.diff(np.concatenate([[0], cuts, [m - 50]])), jnp.int32)  # 50 rows past the groups
    mosaic = functools.partial(grouped_matmul_mosaic_gpu, rhs=q, group_sizes=sizes)
    xla = functools.partial(grouped_matmul_xla, rhs=dense, group_sizes=sizes, transpose_rhs=True)
    check_forward_and_grads(jax.jit(mosaic), jax.jit(xla), [lhs], (0,), jnp.bfloat16)
    out = jax.jit(functools.partial(mosaic, preferred_element_type=jnp.bfloat16))(lhs)
    assert float(jnp.max(jnp.abs(out[m - 50 :].astype(jnp.float32)))) == 0.0
