"""Session 55: the landed decode step on float32 and bf16 pools (issue 44), after 16-bit pools took 128-column items
(call 6's variant: 0.190 ms against 0.219), beside Triton's, as the serving bench's decode-batch rows time them.

    PYTHONPATH=src python exp/s55_pools.py
"""

from __future__ import annotations

import functools

import jax.numpy as jnp

from ejkernel.benchmarks._harness import copy_bandwidth, time_variants
from ejkernel.benchmarks.linear_attention import _ragged, _serving_loop, decode_bytes, decode_case


def main() -> None:
    copy_bw = copy_bandwidth(quick=False, repeats=20)
    inputs, slots, base = decode_case()
    builders = {
        (pool.dtype.name, p): functools.partial(_serving_loop, _ragged(p), (*inputs, None, slots), pool)
        for pool in (base, base.astype(jnp.bfloat16))
        for p in ("pallas", "triton")
    }
    for (dtype, p), seconds in time_variants(builders, repeats=20, where="decode batch").items():
        print(f"{dtype} pool, {p}: {1e3 * seconds:.4f} ms, {decode_bytes(dtype) / seconds / copy_bw:.3f} of copy")


if __name__ == "__main__":
    main()
