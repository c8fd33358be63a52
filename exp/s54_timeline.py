"""Session 54: a device timeline of block-sparse attention's training step at 10% (issue 42; call 1: its kernels
summed to 1.59 ms of the 1.74 ms timed, and the device has no nsys), from JAX's profiler, held in memory: every GPU
event of the last step in order, with the gap before it.

    PYTHONPATH=src python exp/s54_timeline.py
"""

from __future__ import annotations

import gzip
import json
import pathlib
import tempfile

import jax
from s52_ncu_step import sparse_step


def main() -> None:
    run, args = sparse_step(16384, 16, 128)
    for _ in range(3):
        jax.block_until_ready(run(*args))
    with tempfile.TemporaryDirectory() as log_dir:
        with jax.profiler.trace(log_dir, create_perfetto_trace=True):
            for _ in range(3):
                jax.block_until_ready(run(*args))
        with gzip.open(next(pathlib.Path(log_dir).rglob("*perfetto_trace.json.gz"))) as f:
            trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    names = {
        (e.get("pid"), e.get("tid")): e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") in ("process_name", "thread_name")
    }
    by_line = {}
    for e in events:
        if e.get("ph") == "X" and "dur" in e:
            by_line.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    for key, line in by_line.items():
        if "GPU" not in str(names.get((key[0], None), "")):
            continue
        line.sort(key=lambda e: e["ts"])
        label = f"{names.get((key[0], None), key[0])} / {names.get(key, key[1])}"
        print(f"== {label}: {len(line)} events")
        previous_end = None
        for e in line[-14:]:
            gap = "" if previous_end is None else f"gap {e['ts'] - previous_end:8.1f} us"
            print(f"{e['ts']:16.1f} {e['dur']:9.1f} us {gap:>16}  {e['name'][:80]}")
            previous_end = e["ts"] + e["dur"]


if __name__ == "__main__":
    main()
