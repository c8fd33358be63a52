"""Session 41: the MXFP4 grouped matmul with its scales streamed as bf16 `2^e` (`_mxfp4.step_scales`), beside the
kernel as it stood before (`s41_mxfp4_before.py`: scale bytes turned into float32 `2^e` in the kernel, about a dozen
instructions each, four a thread a step, and one conversion to a bf16 pair a register in the PTX).

- The MoE shape (`s39_mxfp4.moe_run`: M 32768, K 4096, N 1536, 64 groups), each kernel checked against XLA and timed
  beside bf16 `auto`;
- extreme exponents: 3001 x 512 x 384 over 7 groups with every scale byte drawn from e in [-128, -118] (2^-127 and
  2^-128 are bf16 subnormals) and lhs times 2^118, float32 out, against a float64 NumPy product of the weights
  rounded to bf16 as the reference rounds them (XLA on a GPU flushes float32 subnormals, so it is no reference here).

    python exp/s41_mxfp4_scales.py --out $OUT
"""

import argparse
import functools
import pathlib
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import s41_mxfp4_before as before
from s39_mxfp4 import moe_case, moe_run, report

from ejkernel.kernels._common.code_bits import as_bytes
from ejkernel.kernels._common.device import num_sms
from ejkernel.kernels._pallas.gpu.grouped_matmul import _mxfp4

KERNELS = {"scales as bytes (before)": before, "scales as bf16": _mxfp4}


def extreme_exponents():
    """Each kernel's largest error, relative to the largest output, at exponents down to -128 (see the docstring)."""
    lhs, _, sizes, q = moe_case("3001,512,384,7")
    rng = np.random.default_rng(0)
    exponents = rng.integers(-128, -117, size=q.scales.shape).astype(np.int8)
    codes = as_bytes(q.data)
    lhs = lhs * jnp.bfloat16(2.0**118)
    e2m1 = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64)
    b = np.asarray(codes)
    values = np.stack([e2m1[b & 0xF], e2m1[b >> 4]], axis=-1).reshape(*b.shape[:2], -1)  # [G, N, K]
    weights = (values * np.exp2(np.repeat(exponents.astype(np.float64), 32, axis=-1))).astype(ml_dtypes.bfloat16)
    starts = np.concatenate([[0], np.cumsum(np.asarray(sizes))])
    x = np.asarray(lhs, np.float64)
    ref = np.zeros((x.shape[0], weights.shape[1]))
    for g in range(weights.shape[0]):
        ref[starts[g] : starts[g + 1]] = x[starts[g] : starts[g + 1]] @ weights[g].astype(np.float64).T
    scales = jnp.asarray(exponents.view(np.uint8))
    for label, module in KERNELS.items():
        tiling = module.MosaicGpuMxfp4GroupedMatmulTiling(256, 4, num_sms())
        out = module.mxfp4_gmm(lhs, codes, scales, sizes, None, out_dtype=jnp.float32, tiling=tiling)
        err = np.max(np.abs(np.asarray(out, np.float64) - ref)) / np.max(np.abs(ref))
        print(f"extreme exponents, {label}: max |out - ref| / max |ref| = {err:.3e}", flush=True)


def main():
    args, lhs, sizes, q, codes, check, calls = moe_run(argparse.ArgumentParser())
    tiling = _mxfp4.MosaicGpuMxfp4GroupedMatmulTiling(256, 4, num_sms())
    for label, module in KERNELS.items():
        fn = jax.jit(
            lambda a, m=module: m.mxfp4_gmm(a, codes, q.scales, sizes, None, out_dtype=jnp.bfloat16, tiling=tiling)
        )
        check(label, fn(lhs))
        calls[label] = fn
    report({key: functools.partial(fn, lhs) for key, fn in calls.items()}, args.repeats, args.out, "s41_mxfp4_scales")
    extreme_exponents()


if __name__ == "__main__":
    main()
