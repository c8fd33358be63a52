"""Session 41: the gated delta rule's decode step with its two column sums taken from the loaded tile at once.

`_decode._step` sums `hᵀk` over the tile, updates the tile, then sums `qᵀh` over the updated tile: two reductions
across warps, the second waiting for the first and for the update. Since `h' = g h + k uᵀ`, the output is
`qᵀh' = g (qᵀh) + (q·k) u`: both sums can be taken from the tile as loaded, and the decay folds into them
(`u = β (v − g hᵀk)`), so the update is one multiply-add a value, off the output's path. Variants:

- `two sums` (the landed `_step`, at its tiling: 64 value columns a program, 4 warps);
- `sums at once bv W`: `hᵀk` and `hᵀq` as two reductions of the loaded tile, at `block_v` bv and W warps (the
  shorter path may move the best tiling). (One reduction of a stacked product does not lower: Pallas Triton stacks
  on the last axis only, and has no slices.)

Each is timed as `_decode.decode_step` on the bench's decode batch (256 requests x 1 token, H 32, Dk = Dv = 128,
float32 pool of 512 slots donated) beside the device copy, and checked against the landed step's output and pool.
Prints a table; writes `gdr_fused.json` to `--out`.

    python3 exp/s41_gdr_fused.py --out $OUT
"""

import argparse
import functools
import json
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas import triton as plgpu

from ejkernel.benchmarks._harness import copy_bandwidth, time_variants
from ejkernel.kernels._triton.ragged_gated_delta_rule import _decode

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _kit import patched

N, H, D = 256, 32, 128
F32 = jnp.float32


def step_at_once(refs, r, head, cols, s):
    """`_decode._step` with `hᵀk` and `hᵀq` summed from the tile as loaded."""
    token_ref, slot_ref, q_ref, k_ref, v_ref, beta_ref, decay_ref, pool_ref, out_ref, new_pool_ref = refs
    token, slot = token_ref[r], slot_ref[r]
    q = _decode._normalised(q_ref[token, head, :], s["l2norm"]) * s["scale"]
    k = _decode._normalised(k_ref[token, head, :], s["l2norm"])
    h = plgpu.load(pool_ref.at[slot, head, :, cols]).astype(F32)
    hk, hq = jnp.sum(h * k[:, None], 0), jnp.sum(h * q[:, None], 0)
    g = jnp.exp(decay_ref[token, head].astype(F32)) if decay_ref is not None else None
    if g is not None:
        hk, hq = g * hk, g * hq
    u = beta_ref[token, head].astype(F32) * (v_ref[token, head, cols].astype(F32) - hk)
    out_ref[r, head, cols] = (hq + jnp.sum(q * k) * u).astype(out_ref.dtype)
    if new_pool_ref is not None:
        decayed = h if g is None else g * h
        plgpu.store(
            new_pool_ref.at[slot, head, :, cols], (decayed + k[:, None] * u[None, :]).astype(new_pool_ref.dtype)
        )


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="out")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--interpret", action="store_true", help="a CPU check of the variants (interpret mode, N 8, H 2)")
    args = p.parse_args()
    global N, H
    if args.interpret:
        N, H = 8, 2
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 8))
    x = lambda *shape: jax.random.normal(next(keys), shape, F32)
    q, k, v = (x(N, H, D).astype(jnp.bfloat16) for _ in range(3))
    beta, decay = jax.nn.sigmoid(x(N, H)), -0.05 * jax.nn.softplus(x(N, H))
    slots = jax.random.permutation(jax.random.PRNGKey(1), 2 * N)[:N].astype(jnp.int32)
    pool0 = x(2 * N, H, D, D)
    token = jnp.arange(N, dtype=jnp.int32)
    tiling = functools.partial(_decode.TritonRaggedDecodeTiling, interpret=args.interpret)
    variants = {"two sums": (_decode._step, tiling())}
    for bv, warps in ((64, 4), (128, 4), (128, 8), (64, 2), (32, 2)):
        variants[f"sums at once {bv} {warps}"] = (step_at_once, tiling(block_v=bv, num_warps=warps))
    firsts = {}

    def looped(name):
        state = {"pool": jnp.copy(pool0)}
        step, t = variants[name]
        # a fresh function per variant, traced with its step patched in
        fn = jax.jit(lambda pool, *a: _decode.decode_step(t, True, *a, pool, token, slots), donate_argnums=0)

        def call():
            out, state["pool"] = fn(state["pool"], q, k, v, beta, decay)
            return out

        with patched(_decode, _step=step):
            first = call()
            firsts[name] = (np.asarray(first, np.float32), np.asarray(state["pool"][slots], np.float32))
        return call

    copy_bw = copy_bandwidth(quick=False, repeats=args.repeats)
    timings = time_variants(
        {name: functools.partial(looped, name) for name in variants}, repeats=args.repeats, where="gdr"
    )
    nbytes = 2 * N * H * D * D * 4 + 4 * N * H * D * 2 + 2 * N * H * 4
    rows = []
    ref_out, ref_pool = firsts["two sums"]
    for name, s in timings.items():
        out, pool = firsts[name]
        err = dict(
            out=float(np.max(np.abs(out - ref_out)) / np.max(np.abs(ref_out))),
            pool=float(np.max(np.abs(pool - ref_pool)) / np.max(np.abs(ref_pool))),
        )
        rows.append(dict(name=name, ms=1e3 * s, TBps=nbytes / s / 1e12, ratio_to_copy=nbytes / s / copy_bw, **err))
        print(
            f"{name:20s} {1e3 * s:.4f} ms  {nbytes / s / 1e12:.3f} TB/s  {nbytes / s / copy_bw:.3f} of copy  "
            f"max err out {err['out']:.1e} pool {err['pool']:.1e}"
        )
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gdr_fused.json").write_text(json.dumps(dict(copy_TBps=copy_bw / 1e12, rows=rows), indent=1))


if __name__ == "__main__":
    main()
