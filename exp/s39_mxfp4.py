"""Issue 45, session 39: the Mosaic GPU MXFP4 grouped matmul forward (`_mxfp4.mxfp4_gmm`, E2M1 codes decoded into
wgmma's B tile in shared memory) at the bench's MoE shape (M 32768, K 4096, N 1536, 64 groups, bf16 lhs), against
XLA's dequantize-then-multiply (accuracy) and timed in one run beside our bf16 grouped matmul (`auto`) and the
MXFP4 call as `auto` serves it (Triton's kernel decoding in registers until call 6; from call 7 this kernel). Tiles
`bm x bn x stages`, with `j` the kernel's `in_ptx=False` (calls 3-4: a jnp decoding through the words' view; since
then the interpret-mode decoding, which does not lower for a GPU). Calls 2-3 ran the kernel in ping-pong tiles
(`block_m` rows a warpgroup), calls 4-6 the shared tiles with the bits placed by shifts, call 7 the table lookup.
Session 40's calls 1-2 ran it at commit 900269c; since then the kernel decodes into wgmma's A registers (swap AB) in
128-column tiles, and tiles are `bm x stages`.

    python exp/s39_mxfp4.py --out $OUT [--tiles 256x4,256x3]
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
from ejkernel.kernels._pallas.gpu.grouped_matmul import _mxfp4
from ejkernel.kernels._pallas.gpu.grouped_matmul._mxfp4 import MosaicGpuMxfp4GroupedMatmulTiling, mxfp4_gmm
from ejkernel.modules import grouped_matmul
from ejkernel.ops.autotune import time_fns
from ejkernel.quantization import quantize_array


def moe_case(shape: str):
    """The bench's MoE call: bf16 `lhs [M, K]`, bf16 weights `w [G, K, N]`, random group sizes, `w` in MXFP4."""
    m, k, n, groups = map(int, shape.split(","))
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    lhs = jax.random.normal(keys[0], (m, k), jnp.bfloat16)
    w = (jax.random.normal(keys[1], (groups, k, n), jnp.float32) * k**-0.5).astype(jnp.bfloat16)
    return lhs, w, random_group_sizes(m, groups), quantize_array(w, mode="mxfp4", axis="row")


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
    """`p` parsed with `--shape`, `--repeats` and `--out` added, the MoE case, the codes, XLA's result on the decoded
    weights, a check against it, and the calls to time, bf16 `auto` first."""
    p.add_argument("--shape", default="32768,4096,1536,64")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", default="out")
    args = p.parse_args()
    lhs, w, sizes, q = moe_case(args.shape)
    dense = q.dequantize().astype(jnp.bfloat16)  # [G, N, K]
    out = dict(preferred_element_type=jnp.bfloat16)
    ref = jax.jit(lambda a: grouped_matmul(a, dense, sizes, transpose_rhs=True, platform="xla", **out))(lhs)

    def check(label, got):
        diff = jnp.max(jnp.abs(got.astype(jnp.float32) - ref.astype(jnp.float32)))
        print(f"{label}: max |out - xla| / max |xla| = {float(diff / jnp.max(jnp.abs(ref))):.3e}", flush=True)

    calls = {"bf16 auto": jax.jit(lambda a: grouped_matmul(a, w, sizes, **out))}
    return args, lhs, sizes, q, as_bytes(q.data), check, calls


def patched_variants(attribute: str, variants: dict, name: str):
    """A/B of `_mxfp4.<attribute>` (a PTX string, a decoding function): the kernel in 256-row tiles, 4 stages, traced
    with each of `variants` ({label: value}) in turn, checked against XLA and timed beside bf16 `auto` at the MoE
    shape (`moe_run`'s command line); the results go to `<out>/<name>.json`."""
    args, lhs, sizes, q, codes, check, calls = moe_run(argparse.ArgumentParser())
    tiling = MosaicGpuMxfp4GroupedMatmulTiling(256, 4, num_sms())
    for label, value in variants.items():
        fn = jax.jit(lambda a: mxfp4_gmm(a, codes, q.scales, sizes, None, out_dtype=jnp.bfloat16, tiling=tiling))
        today = getattr(_mxfp4, attribute)
        setattr(_mxfp4, attribute, value)
        check(label, fn(lhs))  # (traced and compiled with this variant)
        setattr(_mxfp4, attribute, today)
        calls[label] = fn
    report({key: functools.partial(fn, lhs) for key, fn in calls.items()}, args.repeats, args.out, name)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tiles", default="256x4", help="bm x stages, comma-separated (j: in_ptx=False)")
    args, lhs, sizes, q, codes, check, calls = moe_run(p)
    calls["mxfp4 auto (today)"] = jax.jit(lambda a: grouped_matmul(a, q, sizes, preferred_element_type=jnp.bfloat16))
    for spec in args.tiles.split(","):
        bm, stages = map(int, spec.rstrip("j").split("x"))
        tiling = MosaicGpuMxfp4GroupedMatmulTiling(bm, stages, num_sms())
        in_ptx = not spec.endswith("j")
        fn = jax.jit(
            lambda a, tiling=tiling, ptx=in_ptx: mxfp4_gmm(
                a, codes, q.scales, sizes, None, out_dtype=jnp.bfloat16, tiling=tiling, in_ptx=ptx
            )
        )
        try:
            got = fn(lhs).block_until_ready()
        except Exception as err:  # a tiling that does not compile: reported, the others timed
            print(f"mosaic {spec}: {type(err).__name__}: {str(err)[:600]}", flush=True)
            continue
        check(f"mosaic {spec}", got)
        calls[f"mosaic {spec}"] = fn
    report({key: functools.partial(fn, lhs) for key, fn in calls.items()}, args.repeats, args.out, "s39_mxfp4")


if __name__ == "__main__":
    main()
