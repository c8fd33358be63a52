"""Thirty-first session: MLA paged decode on Mosaic GPU (issue 44) against today's Triton kernel and a device copy.

The bench's paged decode case (`ejkernel bench mla --cases paged`): 64 sequences x 8192 context, 128 query heads,
latent 512 + RoPE 64 in bf16 cache rows of 640, pages of 64 (each sequence's pages a slice of a random
permutation), run as a serving loop runs it (the cache donated and fed back). One flushed line per variant: ms,
TFLOP/s (`2 * Hq * (2L + R)` per visible position), the bytes of the latent and RoPE parts read per second as a
fraction of a copy `x + 1` (2 GiB, timed first in the same run), and the error against Triton's output.
Variants: `triton` (the default before this session), `mosaic both s<splits>` (both compute warpgroups compute S;
`sown`: the kernel's own tiling, 1 split here) and `mosaic shared s<splits>` (warpgroup 0 computes S and hands P
to warpgroup 1). Run on the GPU: `python3 exp/s31_mla.py`; `--quick`: a tiny shape in Mosaic GPU interpret mode
(a CPU smoke run of the variants' plumbing).
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
from _kit import first_lines, interpret_context, log, rel, start_watchdog

from ejkernel.benchmarks._harness import COPY_BYTES
from ejkernel.benchmarks.mla import PAGED_DECODE, PAGED_WIDTHS, paged_inputs
from ejkernel.kernels._pallas.gpu.multi_latent_ragged_page_attention._interface import mosaic_latent_paged
from ejkernel.kernels._pallas.gpu.multi_latent_ragged_page_attention._kernel import MosaicGpuLatentPagedTiling
from ejkernel.ops.autotune import time_fns
from ejkernel.registry import kernel_registry

OP = "multi_latent_ragged_page_attention"
QUICK = (((1,) * 2, (200,) * 2), (64, 128, 64, 64))  # (query lengths, contexts), widths (heads, latent, rope, page)


def variants(quick: bool) -> dict:
    """name -> the implementation called as the op's implementations are (None: not run in `--quick`)."""
    out = {"triton": None if quick else kernel_registry.get(OP, "triton")}
    out["mosaic own"] = mosaic_latent_paged  # the kernel's own tiling
    for shared, splits in ((False, 2), (False, 4), (True, 1), (True, 2), (True, 4)):
        tiling = MosaicGpuLatentPagedTiling(num_splits=splits, stages=2, shared_scores=shared)
        out[f"mosaic {'shared' if shared else 'both'} s{splits}"] = functools.partial(
            mosaic_latent_paged, tiling=tiling
        )
    return out


def serving_step(fn, args):
    """A zero-argument call of `fn` on `args` whose cache is donated and fed back, as a serving loop does."""
    step = jax.jit(lambda cache, *rest: fn(*rest[:4], cache, *rest[4:]), donate_argnums=0)
    state = {"cache": jnp.copy(args[4])}

    def call():
        out, state["cache"] = step(state["cache"], *args[:4], *args[5:])
        return out

    return call


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a tiny shape in Mosaic GPU interpret mode (CPU)")
    p.add_argument("--only", help="comma-separated variant names (triton is always run, as the reference)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--stall", type=float, default=150.0, help="watchdog: seconds without progress before exiting")
    args = p.parse_args()
    start_watchdog(args.stall)
    (q_lens, kv_lens), widths = QUICK if args.quick else (PAGED_DECODE, PAGED_WIDTHS)
    problem, nbytes, flops = paged_inputs(q_lens, kv_lens, *widths)
    chosen = {name: fn for name, fn in variants(args.quick).items() if fn is not None}
    if args.only:
        keep = set(args.only.split(",")) | {"triton"}
        chosen = {name: fn for name, fn in chosen.items() if name in keep}
    log(f"device {jax.devices()[0].device_kind}, jax {jax.__version__}, {len(q_lens)} seqs x {max(kv_lens)} ctx, "
        f"widths {widths}, variants {list(chosen)}")  # fmt: skip

    x = jnp.zeros(((2**20 if args.quick else COPY_BYTES) // 2,), jnp.bfloat16)
    copy = functools.partial(jax.jit(lambda a: a + 1), x)
    jax.block_until_ready(copy())
    copy_bw = 2 * x.nbytes / time_fns({"copy": copy}, repeats=args.repeats)["copy"]
    log(f"copy: {copy_bw / 1e12:.3f} TB/s (read + write)")

    context = interpret_context(args.quick)
    reference = None
    with context:
        for name, fn in chosen.items():
            log(f"compiling and running {name}")
            try:
                call = serving_step(fn, problem)
                out = jax.block_until_ready(call())
                seconds = time_fns({name: call}, repeats=1 if args.quick else args.repeats)[name]
            except Exception as err:  # declined, out of shared memory, a compile error: report it, go on
                log(f"{name} failed: {first_lines(err)}")
                continue
            reference = out if reference is None else reference
            error = rel(out, reference)
            log(
                f"{name:22s} {1e3 * seconds:8.3f} ms {flops / seconds / 1e12:7.1f} TFLOP/s "
                f"{nbytes / seconds / copy_bw:6.3f} of copy  rel err vs first {error:.2e}"
            )
    log("done")


if __name__ == "__main__":
    main()
