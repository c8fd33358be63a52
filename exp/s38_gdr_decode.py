"""Session 38: the gated delta rule's decode batch (256 requests x 1 token, H 32, Dk = Dv = 128, float32 pool of 512
slots donated), beside the device copy, in one run:

- `op`: `ragged_gated_delta_rule(query_start_loc=None, platform="triton")`, the bench's decode batch;
- `one kernel bv W [evict]` (`--one`, call 1): `exp/s38_gdr_one_kernel.py`'s `decode_step` alone, the fused kernel
  at `block_v` bv and W warps;
- `two kernels [evict L/S]`: session 37's `decode_step` alone (`_triton/ragged_gated_delta_rule/_decode.py`,
  unchanged since; in calls 1-8 a copy of it in `exp/`);
- `looped per<P> st<S> w<W>` (`--looped`, call 8): its writers looping over P heads a program, `num_stages` S
  (`exp/s38_gdr_looped.py`);
- `narrow bv<columns> w<warps>` (`--narrow`, call 11): the op with narrow tiles and one or two warps a program (so
  that the column sums stay within a warp).

`evict L/S`: the pool's tile loaded (L) and/or stored (S) with `eviction_policy="evict_first"`, patched in at trace
time. `--ceiling` (call 6) adds what the step's memory traffic alone costs: `tile copy` (a Pallas-Triton kernel on
the writers' grid loading each request's `[Dk, 64]` float32 tile and storing it plus one in place) and `xla pool + 1`
(the requests' slots gathered, plus one, scattered back, the pool donated).

Bytes: the pool tiles read and written, q, k, v, out in bf16, beta and decay. Prints a table and writes
`gdr_decode.json` to `--out`.

    python3 exp/s38_gdr_decode.py --out $OUT
"""

import argparse
import functools
import json
import pathlib
import sys

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from ejkernel.benchmarks._harness import copy_bandwidth, time_variants
from ejkernel.kernels._triton.ragged_gated_delta_rule import _decode
from ejkernel.modules import RaggedGatedDeltaRuleConfig, ragged_gated_delta_rule
from ejkernel.ops import FwdParams

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import s38_gdr_looped as looped_writers
import s38_gdr_one_kernel as one
from _kit import evicting, patched

N, H, D = 256, 32, 128


def tile_copy(pool, slots):
    """Each request's slot tiles `[Dk, 64]` loaded and stored plus one, in place: the writers' traffic alone."""

    def kernel(slot_ref, pool_ref, out_ref):
        r, head, tile = pl.program_id(0), pl.program_id(1), pl.program_id(2)
        cols = pl.ds(pl.multiple_of(tile * 64, 64), 64)
        slot = slot_ref[r]
        out_ref[slot, head, :, cols] = pool_ref[slot, head, :, cols] + 1.0

    return pl.pallas_call(
        kernel,
        grid=(slots.shape[0], pool.shape[1], pool.shape[3] // 64),
        out_shape=jax.ShapeDtypeStruct(pool.shape, pool.dtype),
        input_output_aliases={1: 0},
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1),
    )(slots, pool)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="out")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--one", action="store_true", help="also time the one fused kernel (call 1)")
    p.add_argument("--ceiling", action="store_true", help="also time the traffic alone (call 6)")
    p.add_argument("--looped", action="store_true", help="also time the looped writers (call 8)")
    p.add_argument("--narrow", action="store_true", help="also time narrow tiles of few warps (call 11)")
    args = p.parse_args()
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 8))
    x = lambda *shape: jax.random.normal(next(keys), shape, jnp.float32)
    q, k, v = (x(N, H, D).astype(jnp.bfloat16) for _ in range(3))
    beta, decay = jax.nn.sigmoid(x(N, H)), -0.05 * jax.nn.softplus(x(N, H))
    slots = jax.random.permutation(jax.random.PRNGKey(1), 2 * N)[:N].astype(jnp.int32)
    pool0 = x(2 * N, H, D, D)
    token = jnp.arange(N, dtype=jnp.int32)

    def looped(step, *rest, module=None, patch=None):
        state = {"pool": jnp.copy(pool0)}
        fn = jax.jit(step, donate_argnums=0)

        def call():
            out, state["pool"] = fn(state["pool"], *rest)
            return out

        if patch is not None:  # traced (and compiled) now, with the patch in place
            with patched(module, plgpu=patch):
                jax.block_until_ready(call())
        return call

    op = lambda pool, *a: ragged_gated_delta_rule(*a[:5], pool, None, a[5], platform="triton")
    builders = {"op": functools.partial(looped, op, q, k, v, beta, decay, slots)}
    old = lambda pool, *a: _decode.decode_step(_decode.TritonRaggedDecodeTiling(), True, *a[:5], pool, token, a[5])
    for evict in ("", "L", "S", "LS"):
        patch = evicting(evict) if evict else None
        name = "two kernels" + (f" evict {evict}" if evict else "")
        builders[name] = functools.partial(looped, old, q, k, v, beta, decay, slots, module=_decode, patch=patch)
    one_kernel = ((64, 4, ""), (64, 4, "LS"), (128, 4, ""), (128, 8, ""), (32, 2, "")) if args.one else ()
    for bv, warps, evict in one_kernel:
        tiling = one.TritonRaggedDecodeTiling(block_v=bv, num_warps=warps)
        step = lambda pool, *a, t=tiling: one.decode_step(t, True, *a[:5], pool, token, a[5])
        patch = evicting(evict) if evict else None
        name = f"one kernel {bv} {warps}" + (" evict" if evict else "")
        builders[name] = functools.partial(looped, step, q, k, v, beta, decay, slots, module=one, patch=patch)
    for per, stages, warps in ((2, 2, 4), (4, 2, 4), (4, 3, 4), (8, 3, 4), (4, 1, 4), (4, 2, 8)) if args.looped else ():
        step = lambda pool, *a, c=(per, warps, stages): looped_writers.decode_step(
            64, c[1], c[0], c[2], *a[:5], pool, token, a[5]
        )
        builders[f"looped per{per} st{stages} w{warps}"] = functools.partial(looped, step, q, k, v, beta, decay, slots)
    for bv, warps in ((16, 1), (32, 1), (16, 2), (32, 2), (64, 2)) if args.narrow else ():
        cfg = RaggedGatedDeltaRuleConfig(fwd_params=FwdParams(block_d=bv, num_warps=warps))
        narrow = lambda pool, *a, cfg=cfg: ragged_gated_delta_rule(*a[:5], pool, None, a[5], platform="triton", cfg=cfg)
        builders[f"narrow bv{bv} w{warps}"] = functools.partial(looped, narrow, q, k, v, beta, decay, slots)
    if args.ceiling:
        builders["tile copy"] = functools.partial(looped, lambda pool, s: (s, tile_copy(pool, s)), slots)
        plus_one = lambda pool, s: (s, pool.at[s].set(pool[s] + 1.0))
        builders["xla pool + 1"] = functools.partial(looped, plus_one, slots)
    copy_bw = copy_bandwidth(quick=False, repeats=args.repeats)
    timings = time_variants(builders, repeats=args.repeats, where="gdr decode")
    nbytes = 2 * N * H * D * D * 4 + 4 * N * H * D * 2 + 2 * N * H * 4
    rows = []
    for name, s in timings.items():
        rows.append(dict(name=name, ms=1e3 * s, TBps=nbytes / s / 1e12, ratio_to_copy=nbytes / s / copy_bw))
        print(f"{name:24s} {1e3 * s:.4f} ms  {nbytes / s / 1e12:.3f} TB/s  {nbytes / s / copy_bw:.3f} of copy")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gdr_decode.json").write_text(json.dumps(dict(copy_TBps=copy_bw / 1e12, rows=rows), indent=1))


if __name__ == "__main__":
    main()
