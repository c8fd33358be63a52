"""Session 54: a device timeline of block-sparse attention's training step at 10% (issue 42; call 1: its kernels
summed to 1.59 ms of the 1.74 ms timed, and the device has no nsys), from JAX's profiler, held in memory: every GPU
event of the last step in order, with the gap before it.

    PYTHONPATH=src python exp/s54_timeline.py
"""

from __future__ import annotations

import jax
from jax._src.profiler import ProfileSession  # (in-memory profile data; not in jax.profiler's namespace)
from s52_ncu_step import sparse_step


def main() -> None:
    run, args = sparse_step(16384, 16, 128)
    for _ in range(3):
        jax.block_until_ready(run(*args))
    session = ProfileSession().start()
    for _ in range(3):
        jax.block_until_ready(run(*args))
    data = session.stop()
    for plane in data.planes:
        if "GPU" not in plane.name:
            continue
        for line in plane.lines:
            events = sorted(line.events, key=lambda e: e.start_ns)
            if not events:
                continue
            print(f"== {plane.name} / {line.name}: {len(events)} events")
            tail = events[-14:]
            previous_end = None
            for e in tail:
                gap = "" if previous_end is None else f"gap {(e.start_ns - previous_end) / 1e3:8.1f} us"
                print(f"{e.start_ns / 1e3:14.1f} {e.duration_ns / 1e3:9.1f} us {gap:>16}  {e.name[:80]}")
                previous_end = e.end_ns


if __name__ == "__main__":
    main()
