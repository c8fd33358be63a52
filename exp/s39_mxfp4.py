"""Issue 45, session 39: the Mosaic GPU MXFP4 grouped matmul forward (`_mxfp4.mxfp4_gmm`, E2M1 codes decoded into
wgmma's B tile in shared memory) at the bench's MoE shape (M 32768, K 4096, N 1536, 64 groups, bf16 lhs), against
XLA's dequantize-then-multiply (accuracy) and timed in one run beside our bf16 grouped matmul (`auto`) and the
MXFP4 call as `auto` serves it (Triton's kernel decoding in registers until call 6; from call 7 this kernel). Tiles
`bm x bn x stages`, with `j` the kernel's `in_ptx=False` (calls 3-4: a jnp decoding through the words' view; since
then the interpret-mode decoding, which does not lower for a GPU). Calls 2-3 ran the kernel in ping-pong tiles
(`block_m` rows a warpgroup), calls 4-6 the shared tiles with the bits placed by shifts, call 7 the table lookup.
Session 40's calls 1-2 ran it at commit 900269c; since then the kernel decodes into wgmma's A registers (swap AB) in
128-column tiles, and tiles are `bm x stages`. Session 41 renamed the kernel (`_four_bit.four_bit_gmm`, MXFP4 and affine
int4); `--format affine` sweeps int4 weights in groups of 128 instead.

    python exp/s39_mxfp4.py --out $OUT [--tiles 256x4,256x3] [--format affine]
"""

import argparse
import functools
import json
import pathlib

import jax
import jax.numpy as jnp

from ejkernel.benchmarks.grouped_matmul import random_group_sizes
from ejkernel.kernels._common.code_bits import as_bytes
from ejkernel.kernels._common.device import num_sms
from ejkernel.kernels._pallas.gpu.grouped_matmul import _four_bit
from ejkernel.kernels._pallas.gpu.grouped_matmul._four_bit import (
    CodeFormat,
    MosaicGpuFourBitGroupedMatmulTiling,
    four_bit_gmm,
)
from ejkernel.modules import grouped_matmul
from ejkernel.ops.autotune import time_fns
from ejkernel.quantization import quantize_array

FORMATS = {"mxfp4": dict(mode="mxfp4"), "affine": dict(mode="affine", bits=4, group_size=128)}


def moe_case(shape: str, fmt: str = "mxfp4"):
    """The bench's MoE call: bf16 `lhs [M, K]`, bf16 weights `w [G, K, N]`, random group sizes, `w` in `fmt`."""
    m, k, n, groups = map(int, shape.split(","))
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    lhs = jax.random.normal(keys[0], (m, k), jnp.bfloat16)
    w = (jax.random.normal(keys[1], (groups, k, n), jnp.float32) * k**-0.5).astype(jnp.bfloat16)
    return lhs, w, random_group_sizes(m, groups), quantize_array(w, axis="row", **FORMATS[fmt])


def report(calls: dict, repeats: int, out: str, name: str):
    """Times `calls` (zero-argument, one "bf16 auto") interleaved; prints and writes ms and the ratio to bf16."""
    times = time_fns(calls, repeats=repeats, warmup=3)
    results = {key: {"ms": t * 1e3, "x_bf16": times["bf16 auto"] / t} for key, t in times.items()}
    for key, row in results.items():
        print(f"  {key:22s} {row['ms']:8.3f} ms  {row['x_bf16']:5.2f}x bf16", flush=True)
    out_dir = pathlib.Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(results, indent=1))


def moe_run(p: argparse.ArgumentParser):
    """`p` parsed with `--shape`, `--format`, `--repeats` and `--out` added, the MoE case, the codes, XLA's result on
    the decoded weights, a check against it, and the calls to time, bf16 `auto` first."""
    p.add_argument("--shape", default="32768,4096,1536,64")
    p.add_argument("--format", default="mxfp4", choices=tuple(FORMATS))
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", default="out")
    args = p.parse_args()
    lhs, w, sizes, q = moe_case(args.shape, args.format)
    dense = q.dequantize().astype(jnp.bfloat16)  # [G, N, K]
    out = dict(preferred_element_type=jnp.bfloat16)
    ref = jax.jit(lambda a: grouped_matmul(a, dense, sizes, transpose_rhs=True, platform="xla", **out))(lhs)

    def check(label, got):
        diff = jnp.max(jnp.abs(got.astype(jnp.float32) - ref.astype(jnp.float32)))
        print(f"{label}: max |out - xla| / max |xla| = {float(diff / jnp.max(jnp.abs(ref))):.3e}", flush=True)

    calls = {"bf16 auto": jax.jit(lambda a: grouped_matmul(a, w, sizes, **out))}
    return args, lhs, sizes, q, as_bytes(q.data), check, calls


def kernel_call(q, codes, sizes, tiling, in_ptx=True):
    """`_four_bit.four_bit_gmm` on `q`'s codes at `tiling`, jitted (bf16 out)."""
    fmt = CodeFormat(q.mode, q.group_size)
    return jax.jit(
        lambda a: four_bit_gmm(
            a, codes, q.scales, q.zeros, sizes, None, fmt=fmt, out_dtype=jnp.bfloat16, tiling=tiling, in_ptx=in_ptx
        )
    )


def patched_variants(attribute: str, variants: dict, name: str):
    """A/B of `_four_bit.<attribute>` (a PTX string, a decoding function): the kernel in 256-row tiles, 4 stages,
    traced with each of `variants` ({label: value}) in turn, checked against XLA and timed beside bf16 `auto` at the
    MoE shape (`moe_run`'s command line); the results go to `<out>/<name>.json`."""
    args, lhs, sizes, q, codes, check, calls = moe_run(argparse.ArgumentParser())
    tiling = MosaicGpuFourBitGroupedMatmulTiling(256, 4, num_sms())
    for label, value in variants.items():
        fn = kernel_call(q, codes, sizes, tiling)
        today = getattr(_four_bit, attribute)
        setattr(_four_bit, attribute, value)
        check(label, fn(lhs))  # (traced and compiled with this variant)
        setattr(_four_bit, attribute, today)
        calls[label] = fn
    report({key: functools.partial(fn, lhs) for key, fn in calls.items()}, args.repeats, args.out, name)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tiles", default="256x4", help="bm x stages, comma-separated (j: in_ptx=False)")
    args, lhs, sizes, q, codes, check, calls = moe_run(p)
    calls[f"{args.format} auto"] = jax.jit(lambda a: grouped_matmul(a, q, sizes, preferred_element_type=jnp.bfloat16))
    for spec in args.tiles.split(","):
        bm, stages = map(int, spec.rstrip("j").split("x"))
        tiling = MosaicGpuFourBitGroupedMatmulTiling(bm, stages, num_sms())
        fn = kernel_call(q, codes, sizes, tiling, in_ptx=not spec.endswith("j"))
        try:
            got = fn(lhs).block_until_ready()
        except Exception as err:  # a tiling that does not compile: reported, the others timed
            print(f"mosaic {spec}: {type(err).__name__}: {str(err)[:600]}", flush=True)
            continue
        check(f"mosaic {spec}", got)
        calls[f"mosaic {spec}"] = fn
    name = "s39_mxfp4" if args.format == "mxfp4" else f"s39_mxfp4_{args.format}"
    report({key: functools.partial(fn, lhs) for key, fn in calls.items()}, args.repeats, args.out, name)


if __name__ == "__main__":
    main()
