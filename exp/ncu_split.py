"""Where a step's time goes: every GPU kernel of one call, timed by Nsight Compute, summed by kernel name.

On an H100/H200 from the repository root (the machine's `ncu`, clocks left alone):

    ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv \
        python3 exp/ncu_split.py WORKLOAD > WORKLOAD.csv
    python3 exp/ncu_split.py --summarise WORKLOAD.csv [...]

The workload is compiled and run once outside the profiled range, then run once inside it
(`cuProfilerStart` / `cuProfilerStop` of the driver), so the CSV holds one call's kernels. Nsight
Compute serialises the kernels and flushes the caches between them, so the sum is an upper bound of the
step's time; the split between kernels is what it is for. Workloads (bf16, the issues' bench shapes):
`gla`, `gdr` (forward+backward, B=2 S=16384 H=16 D=128), `ssd_fwd`, `ssd` (Mamba-2 B=2 S=16384 H=32
P=64 N=128), `bsa10` (block-sparse on Mosaic GPU, forward+backward, random 128x128 blocks at 10%,
B=1 S=16384 H=16 D=128), `gmm_fwd` (grouped matmul M=32768 K=4096 N=1536, 64 groups).
"""

from __future__ import annotations

import argparse
import collections
import csv
import ctypes
import functools

import jax
import jax.numpy as jnp
import numpy as np


def _grad_step(fn, *args):
    loss = lambda *a: jnp.sum(fn(*a).astype(jnp.float32))
    return functools.partial(jax.jit(jax.grad(loss, argnums=tuple(range(len(args))))), *args)


def _normal(key, shape, dtype=jnp.bfloat16):
    return jax.random.normal(jax.random.PRNGKey(key), shape, jnp.float32).astype(dtype)


def gla():
    from ejkernel.modules import gla_attention

    q, k, v = (_normal(i, (2, 16384, 16, 128)) for i in range(3))
    g = -0.05 * jax.nn.softplus(_normal(3, (2, 16384, 16, 128), jnp.float32))
    return _grad_step(lambda q, k, v, g: gla_attention(q, k, v, g), q, k, v, g)


def gdr():
    from ejkernel.modules import gated_delta_rule

    q, k, v = (_normal(i, (2, 16384, 16, 128)) for i in range(3))
    beta = jax.nn.sigmoid(_normal(3, (2, 16384, 16), jnp.float32))
    decay = -0.05 * jax.nn.softplus(_normal(4, (2, 16384, 16), jnp.float32))
    return _grad_step(lambda q, k, v, b, d: gated_delta_rule(q, k, v, b, d), q, k, v, beta, decay)


def _ssd_inputs():
    from ejkernel.benchmarks.state_space import V2_SHAPE, v2_inputs

    return v2_inputs(**V2_SHAPE)


def ssd_fwd():
    from ejkernel.modules import state_space_v2

    return functools.partial(jax.jit(lambda *a: state_space_v2(*a)[0]), *_ssd_inputs())


def ssd():
    from ejkernel.modules import state_space_v2

    return _grad_step(lambda *a: state_space_v2(*a)[0], *_ssd_inputs())


def bsa10():
    from ejkernel.modules import blocksparse_attention

    seq, block = 16384, 128
    tiles = np.random.default_rng(0).random((seq // block, seq // block)) < 0.10
    mask = jnp.asarray(np.repeat(np.repeat(tiles, block, 0), block, 1)[None, None])
    q, k, v = (_normal(i, (1, 16, seq, 128)) for i in range(3))
    return _grad_step(lambda q, k, v: blocksparse_attention(q, k, v, attention_mask=mask, causal=False), q, k, v)


def gmm_fwd():
    from ejkernel.benchmarks.grouped_matmul import random_group_sizes
    from ejkernel.modules import grouped_matmul

    m, k, n, groups = 32768, 4096, 1536, 64
    sizes = random_group_sizes(m, groups)
    lhs, rhs = _normal(0, (m, k)), _normal(1, (groups, k, n))
    call = jax.jit(lambda lhs, rhs: grouped_matmul(lhs, rhs, sizes, preferred_element_type=lhs.dtype))
    return functools.partial(call, lhs, rhs)


WORKLOADS = {f.__name__: f for f in (gla, gdr, ssd_fwd, ssd, bsa10, gmm_fwd)}


def profile(name):
    call = WORKLOADS[name]()
    jax.block_until_ready(call())  # compile and warm up, outside the profiled range
    driver = ctypes.CDLL("libcuda.so.1")
    driver.cuProfilerStart()
    jax.block_until_ready(call())
    driver.cuProfilerStop()


def summarise(path):
    """The profiled call's total kernel time and its split by kernel name, largest first."""
    with open(path) as f:
        rows = [r for r in csv.DictReader(line for line in f if line.startswith('"')) if r.get("Metric Name")]
    split = collections.defaultdict(lambda: [0, 0.0])  # name -> [launches, microseconds]
    for r in rows:
        scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}[r["Metric Unit"]]
        entry = split[r["Kernel Name"][:90]]
        entry[0] += 1
        entry[1] += float(r["Metric Value"].replace(",", "")) * scale
    total = sum(t for _, t in split.values())
    print(f"{path}: {len(rows)} kernels, {total / 1e3:.3f} ms")
    for name, (count, t) in sorted(split.items(), key=lambda x: -x[1][1]):
        print(f"  {t / 1e3:8.3f} ms {100 * t / max(total, 1e-9):5.1f}%  x{count:<3} {name}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workload", nargs="?", choices=list(WORKLOADS))
    p.add_argument("--summarise", metavar="CSV", nargs="+")
    args = p.parse_args()
    for path in args.summarise or ():
        summarise(path)
    if args.workload:
        profile(args.workload)


if __name__ == "__main__":
    main()
