"""Session 54: a device timeline of block-sparse attention's training step at 10% (issue 42; call 1: its kernels
summed to 1.59 ms of the 1.74 ms timed, and the device has no nsys), from JAX's profiler, held in memory: every GPU
event of the last step in order, with the gap before it.

    PYTHONPATH=src python exp/s54_timeline.py
"""

from __future__ import annotations

from _kit import print_gpu_timeline
from s52_ncu_step import sparse_step


def main() -> None:
    run, args = sparse_step(16384, 16, 128)
    print_gpu_timeline(lambda: run(*args))


if __name__ == "__main__":
    main()
