"""Session 55: the float8 forward's device timeline at 8 x 2048 (issue 42): XLA's Vᵀ beside the kernel. Session 54
put Vᵀ at 44.8 us a pass from 50 passes in one `fori_loop`, 11.8% / 18.2% of the forward; session 55's call 2 found a
Pallas-Triton byte copy of the same 32 MiB at 35 us a pass in that loop (1.9 TB/s, half a copy's bandwidth) and no
change in the forward with a faster transpose, so the loop's own cost per pass was in those numbers. Here the
profiler's events.

    PYTHONPATH=src python exp/s55_fp8_timeline.py
"""

from __future__ import annotations

import functools

import jax
from _kit import print_gpu_timeline
from s54_vt import codes

from ejkernel.modules import flash_attention


def main() -> None:
    q8, k8, v8 = (codes((8, 2048, 16, 128)) for _ in range(3))
    for causal in (False, True):
        run = jax.jit(functools.partial(flash_attention, causal=causal, q_descale=0.25, k_descale=0.25, v_descale=0.25))
        print(f"#### causal={causal}")
        print_gpu_timeline(lambda run=run: run(q8, k8, v8), last=6)


if __name__ == "__main__":
    main()
