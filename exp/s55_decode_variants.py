"""Session 55: the Mosaic GPU decode step's shape on float32 and bf16 pools (issue 44). Calls 4-5 put a decode batch at
0.85 of copy on a float32 pool and at 0.59 on a bf16 one (Triton alike): half the bytes, the same steps and
reductions an item, so latency-bound. Variants, each beside the landed kernel in one run: three compute warpgroups
(152 registers each, the memory warpgroup's 40: 63,488 of 65,536) over 6 ring stages (a multiple of 3, so that each
slot stays one warpgroup's: the barriers' phases are per thread); 128 value columns an item (bf16 only: a float32
ring of them overflows shared memory); 8 ring stages. Each matched the XLA step in interpret mode first.

    PYTHONPATH=src python exp/s55_decode_variants.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from _kit import patched

from ejkernel.benchmarks._harness import copy_bandwidth, time_variants
from ejkernel.benchmarks.linear_attention import DECODE, _inputs, _serving_loop
from ejkernel.kernels._pallas.gpu.ragged_gated_delta_rule import _decode

VARIANTS = {  # name: (tiling fields, module constants)
    "landed": ({}, {}),
    "3 compute warpgroups, 6 stages": ({"compute_wgs": 3, "stages": 6}, {"COMPUTE_REGISTERS": 152}),
    "8 stages": ({"stages": 8}, {}),
    "128 columns an item": ({}, {"BLOCK_V": 128}),
}


def main() -> None:
    copy_bw = copy_bandwidth(quick=False, repeats=20)
    requests, heads, dim = DECODE
    d = _inputs(1, requests, heads, dim)
    inputs = tuple(d[n][0] for n in ("q", "k", "v", "beta", "decay"))
    slots = jax.random.permutation(jax.random.PRNGKey(1), 2 * requests)[:requests].astype(jnp.int32)
    base = jax.random.normal(jax.random.PRNGKey(2), (2 * requests, heads, dim, dim), jnp.float32)
    for pool in (base, base.astype(jnp.bfloat16)):
        builders, firsts = {}, {}
        for name, (fields, constants) in VARIANTS.items():
            if name == "128 columns an item" and pool.dtype == jnp.float32:
                continue
            tiling = _decode.MosaicGpuRaggedDecodeTiling(**fields)

            def fn(q, k, v, beta, decay, pool, qsl, slots, tiling=tiling):
                del qsl
                return _decode.decode_batch(tiling, True, q, k, v, beta, decay, pool, slots)

            def build(fn=fn, constants=constants, name=name, pool=pool, firsts=firsts):
                call = _serving_loop(fn, (*inputs, None, slots), pool)
                with patched(_decode, clear=False, **constants):
                    firsts[name] = jax.block_until_ready(call())  # compiled under the variant's constants
                return call

            builders[name] = build
        timings = time_variants(builders, repeats=20, where=f"decode pool {pool.dtype}")
        nbytes = 2 * base.size // 2 * pool.dtype.itemsize + 4 * requests * heads * dim * 2 + 2 * requests * heads * 4
        for name, seconds in timings.items():
            err = float(jnp.max(jnp.abs(firsts[name].astype(jnp.float32) - firsts["landed"].astype(jnp.float32))))
            print(
                f"{pool.dtype} {name}: {1e3 * seconds:.4f} ms, {nbytes / seconds / copy_bw:.3f} of copy, "
                f"first output {err:.2e} from the landed kernel's"
            )


if __name__ == "__main__":
    main()
