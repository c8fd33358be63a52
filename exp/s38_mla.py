"""Session 38: MLA paged decode at the head counts a tensor-parallel shard holds (DeepSeek-V3's 128 heads over 8
GPUs: 16 a GPU; over 4: 32), where a decode step is bound by memory, not by the tensor cores as at 128 heads.

64 sequences x 8192 context, latent 512 + RoPE 64 in bf16 rows of 640, pages of 64 (the bench's `paged_inputs`),
run as a serving loop runs it (the cache donated and fed back). Per head count: `triton` (the registry's Triton
implementation), `mosaic` (the Mosaic GPU kernel; call 4: below 64 heads its queries padded with zero heads to 64
and the output sliced, as a trial; `--round 2`: the kernel's own tiles of 64 / heads queries), beside a copy timed
in the same run (`_harness.copy_builder`, 2 GiB). Bandwidth = the latent and RoPE bytes of the context rows read /
time. `--round 2` adds the kernel at 16 heads with `s<splits> both|shared` tilings and the bench's mixed batch
(56 x 1@8192 + 4 x 512@2048) at 16 heads.

    python3 exp/s38_mla.py [--round 2]
"""

from __future__ import annotations

import argparse
import functools
import pathlib
import sys

import jax
import jax.numpy as jnp

from ejkernel.benchmarks._harness import COPY_BYTES, copy_builder, time_variants
from ejkernel.benchmarks.mla import PAGED_DECODE, PAGED_MIXED, paged_inputs
from ejkernel.kernels._pallas.gpu.multi_latent_ragged_page_attention._interface import mosaic_latent_paged
from ejkernel.kernels._pallas.gpu.multi_latent_ragged_page_attention._kernel import MosaicGpuLatentPagedTiling
from ejkernel.registry import kernel_registry

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from s31_mla import serving_step

OP = "multi_latent_ragged_page_attention"
ROWS = 64


def padded(fn):
    """`fn` on queries padded with zero heads to a multiple of 64, its output sliced back."""

    def call(q_nope, q_pe, *rest, **options):
        heads = q_nope.shape[1]
        extra = -heads % ROWS
        pad = lambda q: jnp.pad(q, ((0, 0), (0, extra), (0, 0)))
        out, cache = fn(pad(q_nope), pad(q_pe), *rest, **options)
        return out[:, :heads], cache

    return call


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--round", type=int, default=1)
    args = p.parse_args()
    triton = kernel_registry.get(OP, "triton")
    mosaic = padded(mosaic_latent_paged) if args.round == 1 else mosaic_latent_paged
    builders, sizes = {"copy": copy_builder(COPY_BYTES)}, {}
    outputs, label_of = {}, {}
    cases = [(f"H{heads}", PAGED_DECODE, heads, {"triton": triton, "mosaic": mosaic}) for heads in (16, 32, 128)]
    if args.round == 2:
        tilings = {
            f"mosaic s{splits} {'shared' if shared else 'both'}": functools.partial(
                mosaic_latent_paged,
                tiling=MosaicGpuLatentPagedTiling(num_splits=splits, stages=2, shared_scores=shared),
            )
            for splits in (1, 2, 4, 8)
            for shared in (True, False)
        }
        cases[0][3].update(tilings)
        cases.append(("H16 mixed", PAGED_MIXED, 16, {"triton": triton, "mosaic": mosaic}))
    for label, shape, heads, fns in cases:
        problem, nbytes, flops = paged_inputs(*shape, heads, 512, 64, 64)
        sizes[label] = nbytes, flops
        for name, fn in fns.items():
            key = f"{label} {name}"
            label_of[key] = label

            def build(fn=fn, problem=problem, key=key):
                call = serving_step(fn, problem)
                outputs[key] = jax.block_until_ready(call())
                return call

            builders[key] = build
    timings = time_variants(builders, repeats=20, where="mla")
    copy_bw = 2 * COPY_BYTES / timings.pop("copy")
    print(f"copy {copy_bw / 1e12:.3f} TB/s (mixed rows: their bandwidth means nothing, their times count)")
    for key, seconds in timings.items():
        label = label_of[key]
        nbytes, flops = sizes[label]
        other = outputs.get(f"{label} triton")
        err = float(
            jnp.linalg.norm((outputs[key] - other).astype(jnp.float32)) / jnp.linalg.norm(other.astype(jnp.float32))
        )
        rate = f"{flops / seconds / 1e12:6.1f} TFLOP/s  {nbytes / seconds / 1e12:.3f} TB/s"
        print(f"{key:14s} {1e3 * seconds:.4f} ms  {rate}  {nbytes / seconds / copy_bw:.3f} of copy  rel err {err:.2e}")


if __name__ == "__main__":
    main()
