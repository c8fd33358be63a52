"""Session 36: the gated delta rule's decode step (256 requests x 1 token, H 32, Dk = Dv = 128, float32 pool of 512
slots) split into its parts and its Triton tile swept, beside the device copy, in one run:

- `op`: `ragged_gated_delta_rule(platform="triton")` as the bench times it (pool donated and fed back);
- `branch`: the op's decode branch called directly (its `requests` prologue, the kernels, the output
  placement; no `lax.cond` between the decode and prefill forms);
- `kernels bv W`: `decode_step` alone (the readers' and the writers' kernels) at `block_v` bv and W warps, with
  the per-request token / slot / mode arrays computed once beforehand (so op - kernels = the XLA prologue and
  the output placement).

Bytes: the pool tiles read and written, q, k, v, out in bf16, beta and decay. Prints a table and writes
`gdr_decode.json` to `--out`.

    python3 exp/s36_gdr_decode.py --out $OUT
"""

import argparse
import functools
import json
import pathlib

import jax
import jax.numpy as jnp

from ejkernel.benchmarks._harness import copy_bandwidth, time_variants
from ejkernel.kernels._common.linear_attention.ragged import requests
from ejkernel.kernels._triton.ragged_gated_delta_rule._decode import WRITES, TritonRaggedDecodeTiling, decode_step
from ejkernel.kernels._triton.ragged_gated_delta_rule._interface import _decode
from ejkernel.modules import ragged_gated_delta_rule

N, H, D = 256, 32, 128


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="out")
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args()
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 8))
    x = lambda *shape: jax.random.normal(next(keys), shape, jnp.float32)
    q, k, v = (x(N, H, D).astype(jnp.bfloat16) for _ in range(3))
    beta, decay = jax.nn.sigmoid(x(N, H)), -0.05 * jax.nn.softplus(x(N, H))
    slots = jax.random.permutation(jax.random.PRNGKey(1), 2 * N)[:N].astype(jnp.int32)
    pool0 = x(2 * N, H, D, D)
    bounds = jnp.arange(N + 1, dtype=jnp.int32)

    def looped(step, *rest):
        state = {"pool": jnp.copy(pool0)}
        fn = jax.jit(step, donate_argnums=0)

        def call():
            out, state["pool"] = fn(state["pool"], *rest)
            return out

        return call

    op = lambda pool, *a: ragged_gated_delta_rule(*a[:5], pool, a[5], a[6], platform="triton")
    builders = {"op": functools.partial(looped, op, q, k, v, beta, decay, bounds, slots)}
    branch = lambda pool, *a: _decode(
        TritonRaggedDecodeTiling(), True, a[:5], pool, requests(a[5], a[6], N, pool.shape[0])
    )
    builders["branch"] = functools.partial(looped, branch, q, k, v, beta, decay, bounds, slots)
    token, mode = jnp.arange(N, dtype=jnp.int32), jnp.full((N,), WRITES, jnp.int32)
    for bv, warps in ((64, 4), (128, 4), (128, 2)):
        tiling = TritonRaggedDecodeTiling(block_v=bv, num_warps=warps)
        step = lambda pool, *a, t=tiling: decode_step(t, True, *a[:5], pool, *a[5:])
        builders[f"kernels {bv} {warps}"] = functools.partial(looped, step, q, k, v, beta, decay, token, slots, mode)
    copy_bw = copy_bandwidth(quick=False, repeats=args.repeats)
    timings = time_variants(builders, repeats=args.repeats, where="gdr decode")
    nbytes = 2 * N * H * D * D * 4 + 4 * N * H * D * 2 + 2 * N * H * 4
    rows = []
    for name, s in timings.items():
        rows.append(dict(name=name, ms=1e3 * s, TBps=nbytes / s / 1e12, ratio_to_copy=nbytes / s / copy_bw))
        print(f"{name:18s} {1e3 * s:.4f} ms  {nbytes / s / 1e12:.3f} TB/s  {nbytes / s / copy_bw:.3f} of copy")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gdr_decode.json").write_text(json.dumps(dict(copy_TBps=copy_bw / 1e12, rows=rows), indent=1))


if __name__ == "__main__":
    main()
