"""Where a step's time goes: every GPU kernel of one call, from JAX's profiler, summed by kernel name.

On an H100/H200 from the repository root:

    XLA_FLAGS=--xla_gpu_enable_command_buffer= python3 exp/kernel_split.py WORKLOAD [WORKLOAD ...]

Each workload is compiled and run once, then run `--repeats` times inside `jax.profiler.trace`; the
kernels of the device's streams (CUPTI's timestamps: real speed, kernels as they overlap) are summed by
name and divided by the repeats. Without XLA's command buffers every kernel is its own launch, which the
trace names one by one. Workloads (bf16, the issues' bench shapes): `gla`, `gdr` (forward+backward,
B=2 S=16384 H=16 D=128), `gdr_decode`, `gdr_prefill` (`ragged_gated_delta_rule`, 256 x 1 and 8 x 2048
tokens), `ssd_fwd`, `ssd` (Mamba-2 B=2 S=16384 H=32 P=64 N=128), `bsa10`
(block-sparse, forward+backward, random 128x128 blocks at 10%, B=1 S=16384 H=16 D=128), `gmm_fwd`
(grouped matmul M=32768 K=4096 N=1536, 64 groups), `ssm1_decode` (Mamba-1 decode step at batch 64),
`decode_b8_4k`, `decode_b8_8k` (page_attention on Triton, batch 8, contexts 4096 / 8192, the serving
bench's shapes).
"""

from __future__ import annotations

import argparse
import collections
import functools
import glob
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from jax.profiler import ProfileData


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


def _ragged_gdr(requests: int, length: int):
    """`ragged_gated_delta_rule` on Triton, `requests` x `length` tokens, H 32, D 128, pool of 2 x requests slots
    (the pool not donated: a copy of it per call is in the split)."""
    from ejkernel.modules import ragged_gated_delta_rule

    tokens = requests * length
    q, k, v = (_normal(i, (tokens, 32, 128)) for i in range(3))
    beta = jax.nn.sigmoid(_normal(3, (tokens, 32), jnp.float32))
    decay = -0.05 * jax.nn.softplus(_normal(4, (tokens, 32), jnp.float32))
    pool = _normal(5, (2 * requests, 32, 128, 128), jnp.float32)
    bounds = jnp.arange(0, tokens + 1, length, dtype=jnp.int32)
    slots = jnp.arange(requests, dtype=jnp.int32) * 2
    call = jax.jit(functools.partial(ragged_gated_delta_rule, platform="triton"))
    return functools.partial(call, q, k, v, beta, decay, pool, bounds, slots)


def gdr_decode():
    return _ragged_gdr(256, 1)


def gdr_prefill():
    return _ragged_gdr(8, 2048)


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


def _decode(context: int):
    from ejkernel.benchmarks import serving_attention as serving

    shape = dict(heads=serving.HEADS, kv_heads=serving.KV_HEADS, dim=serving.DIM, page=serving.PAGE)
    args, _ = serving.make_problem("page_attention", [1] * 8, [context] * 8, **shape)
    return serving.make_call("page_attention", "triton", args)


def ssm1_decode():
    from ejkernel.benchmarks.state_space import DECODE_BATCH, V1_SHAPE, v1_inputs
    from ejkernel.modules import state_space_v1

    args = v1_inputs(DECODE_BATCH, 1, V1_SHAPE["channels"], V1_SHAPE["state"])
    h = _normal(20, (DECODE_BATCH, *args[1].shape), jnp.float32)
    return functools.partial(jax.jit(lambda *a: state_space_v1(*a, platform="triton")[:2]), *args, None, h)


def decode_b8_4k():
    return _decode(4096)


def decode_b8_8k():
    return _decode(8192)


WORKLOADS = {
    f.__name__: f
    for f in (gla, gdr, gdr_decode, gdr_prefill, ssd_fwd, ssd, bsa10, gmm_fwd, ssm1_decode, decode_b8_4k, decode_b8_8k)
}


def split(name: str, repeats: int, trace_dir: str) -> None:
    """Print the workload's kernel time per call, in total and by kernel name (largest first)."""
    call = WORKLOADS[name]()
    jax.block_until_ready(call())  # compile and warm up outside the trace
    folder = tempfile.mkdtemp(prefix=f"{name}-", dir=trace_dir)
    with jax.profiler.trace(folder):
        for _ in range(repeats):
            jax.block_until_ready(call())
    (path,) = glob.glob(f"{folder}/**/*.xplane.pb", recursive=True)
    by_name = collections.defaultdict(lambda: [0, 0.0])  # kernel name -> [launches, nanoseconds]
    for plane in ProfileData.from_file(path).planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        for line in plane.lines:
            if line.name.startswith("Stream"):
                for event in line.events:
                    entry = by_name[event.name[:100]]
                    entry[0] += 1
                    entry[1] += event.duration_ns
    total = sum(ns for _, ns in by_name.values()) / repeats
    launches = sum(n for n, _ in by_name.values()) // repeats
    print(f"\n== {name}: {launches} kernels per call, {total / 1e6:.3f} ms of kernel time per call")
    for kernel, (count, ns) in sorted(by_name.items(), key=lambda x: -x[1][1]):
        ns /= repeats
        print(f"  {ns / 1e6:8.3f} ms {100 * ns / max(total, 1):5.1f}%  x{count // repeats:<3} {kernel}")
    sys.stdout.flush()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workloads", nargs="+", choices=list(WORKLOADS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--trace-dir", default=tempfile.gettempdir())
    args = p.parse_args()
    for name in args.workloads:
        try:
            split(name, args.repeats, args.trace_dir)
        except Exception as err:  # one failure hides nothing else
            print(f"\n== {name}: FAILED {type(err).__name__}: {str(err)[:400]}", flush=True)


if __name__ == "__main__":
    main()
