"""Session 54: host dispatch time of block-sparse attention's training step (issue 42: the device runs the step's
kernels back to back in 1.58 ms, time_fns measures 1.73 ms): 20 calls queued without waiting, host time a call, then
the wall time a call once the device is done.

    PYTHONPATH=src python exp/s54_dispatch.py
"""

import time

import jax
from s52_ncu_step import sparse_step

run, args = sparse_step(16384, 16, 128)
for _ in range(3):
    jax.block_until_ready(run(*args))
for _ in range(3):
    t0 = time.perf_counter()
    outs = [run(*args) for _ in range(20)]
    t1 = time.perf_counter()
    jax.block_until_ready(outs)
    t2 = time.perf_counter()
    print(f"host {1e3 * (t1 - t0) / 20:.3f} ms a call, wall {1e3 * (t2 - t0) / 20:.3f} ms a call")
