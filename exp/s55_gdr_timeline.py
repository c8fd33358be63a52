"""Session 55: device timelines of the ragged GDR decode step (issue 44), the Mosaic GPU package against Triton, as a
decode batch and with request bounds: how much of the step the mode decision (XLA) and the readers' pass take beside
the writers' kernel, whose prototype ran at 0.840 of copy (session 54).

    PYTHONPATH=src python exp/s55_gdr_timeline.py
"""

from __future__ import annotations

import jax.numpy as jnp
from _kit import print_gpu_timeline

from ejkernel.benchmarks.linear_attention import DECODE, _ragged, _serving_loop, decode_case


def main() -> None:
    inputs, slots, pool = decode_case()
    requests = DECODE[0]
    for bounds in (None, jnp.arange(requests + 1, dtype=jnp.int32)):
        for platform in ("pallas", "triton"):
            print(f"#### {platform}, {'decode batch' if bounds is None else 'request bounds'}")
            print_gpu_timeline(_serving_loop(_ragged(platform), (*inputs, bounds, slots), pool), last=8)


if __name__ == "__main__":
    main()
