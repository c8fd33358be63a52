"""Session 55: the Mosaic GPU decode step's item shape on float32 and bf16 pools (issue 44). Call 6 (this script at
`e3f7097`, with module constants patched) put a bf16 pool's decode batch at 0.190 ms with 128-column items against
0.219 with 64 (0.69 / 0.60 of copy; three compute warpgroups 0.195, 8 stages 0.215) and found nothing faster than
the landed float32 step (0.857; three warpgroups 0.835). 128-column items then landed for 16-bit pools
(`MosaicGpuRaggedDecodeTiling.for_pool`). Here, beside the landed tilings: float32 in 128-column items over 2 ring
slots (64 KB a slot: 4 overflow shared memory, and the slots must be a multiple of the 2 compute warpgroups), bf16 in
64-column items (the old default) and in 128-column items over 2 and 6 slots. Each variant's first output is
compared with the landed tiling's.

    PYTHONPATH=src python exp/s55_decode_variants.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ejkernel.benchmarks._harness import copy_bandwidth, time_variants
from ejkernel.benchmarks.linear_attention import DECODE, _serving_loop, decode_bytes, decode_case
from ejkernel.kernels._pallas.gpu.ragged_gated_delta_rule import _decode

VARIANTS = {  # pool dtype: {name: tiling fields over the landed ones}
    "float32": {"landed": {}, "128 columns, 2 slots": {"block_v": 128, "stages": 2}},
    "bfloat16": {
        "landed": {},
        "64 columns": {"block_v": 64},
        "128 columns, 2 slots": {"stages": 2},
        "128 columns, 6 slots": {"stages": 6},
    },
}


def main() -> None:
    copy_bw = copy_bandwidth(quick=False, repeats=20)
    inputs, slots, base = decode_case()
    tokens, dim = (*inputs, None), DECODE[2]
    for dtype, variants in VARIANTS.items():
        pool, builders, firsts = base.astype(dtype), {}, {}
        for name, fields in variants.items():
            landed = _decode.MosaicGpuRaggedDecodeTiling.for_pool(pool.dtype, dim)
            tiling = _decode.MosaicGpuRaggedDecodeTiling(**{**landed.__dict__, **fields})

            def fn(q, k, v, beta, decay, pool, qsl, slots, tiling=tiling):
                del qsl
                return _decode.decode_batch(tiling, True, q, k, v, beta, decay, pool, slots)

            def build(fn=fn, name=name, pool=pool, firsts=firsts):
                call = _serving_loop(fn, (*tokens, slots), pool)
                firsts[name] = jax.block_until_ready(call())
                return call

            builders[name] = build
        timings = time_variants(builders, repeats=20, where=f"decode pool {dtype}")
        nbytes = decode_bytes(pool.dtype)
        for name, seconds in timings.items():
            err = float(jnp.max(jnp.abs(firsts[name].astype(jnp.float32) - firsts["landed"].astype(jnp.float32))))
            print(
                f"{dtype} {name}: {1e3 * seconds:.4f} ms, {nbytes / seconds / copy_bw:.3f} of copy, "
                f"first output {err:.2e} from the landed tiling's"
            )


if __name__ == "__main__":
    main()
