"""Session 54: the float8 forward's Vᵀ in device time (issue 42). Call 2 timed XLA's transpose at 40-45 us for 32 MiB
and a uint8 `+ 1` at 45 us: one dispatch per call, so the host's dispatch, not the device; here 50 of each inside one
jitted loop, each pass's result the next one's input.

    PYTHONPATH=src python exp/s54_vt_device.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from s54_vt import codes, xla_vt

from ejkernel.ops.autotune import time_fns

TIMES = 50


def looped(fn):
    """`fn` applied TIMES times in turn, each result (reshaped) the next input: nothing for XLA to drop."""
    return jax.jit(lambda v: lax.fori_loop(0, TIMES, lambda _, x: fn(x).reshape(x.shape).astype(x.dtype), v))


def main() -> None:
    for shape in ((8, 2048, 16, 128), (2, 8192, 16, 128)):
        v = codes(shape)
        fns = {
            "vt": looped(xla_vt),
            "bytes + 1": looped(lambda v: lax.bitcast_convert_type(v, jnp.uint8) + jnp.uint8(1)),
        }
        calls = {name: (lambda fn=fn, v=v: fn(v)) for name, fn in fns.items()}
        for fn in calls.values():
            jax.block_until_ready(fn())
        for name, seconds in time_fns(calls, repeats=10).items():
            print(f"{shape} {name}: {1e6 * seconds / TIMES:.1f} us a pass")


if __name__ == "__main__":
    main()
