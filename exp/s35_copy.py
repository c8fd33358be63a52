"""What "a device copy's bandwidth" is on this GPU: the benches' reference (`x + 1` over 2 GiB of bf16 under `jit`)
beside other JAX forms of the same bytes and PyTorch's, timed in one process (JAX first, then PyTorch).
TB/s = bytes read + written / time.

    python3 exp/s35_copy.py
"""

import functools
import statistics

import jax
import jax.numpy as jnp

from ejkernel.ops.autotune import time_fns

N = 2**31  # bytes of each input


def jax_rows():
    variants = {
        "bf16 x + 1, 1-D (the benches' copy)": (jnp.bfloat16, (N // 2,), lambda a: a + 1),
        "bf16 x + 1, [65536, 16384]": (jnp.bfloat16, (65536, 16384), lambda a: a + 1),
        "f32 x + 1, 1-D": (jnp.float32, (N // 4,), lambda a: a + 1),
        "f32 x + 1, [32768, 16384]": (jnp.float32, (32768, 16384), lambda a: a + 1),
        "uint32 x ^ 1, 1-D": (jnp.uint32, (N // 4,), lambda a: a ^ 1),
        "2 x bf16 in uint32, + 0x00010001": (jnp.uint32, (N // 4,), lambda a: a + jnp.uint32(0x00010001)),
    }
    calls = {}
    for name, (dtype, shape, fn) in variants.items():
        x = jnp.zeros(shape, dtype)
        calls[name] = functools.partial(jax.jit(fn), x)
        jax.block_until_ready(calls[name]())
    times = time_fns(calls, repeats=10, warmup=2)
    for name, seconds in times.items():
        print(f"jax   {name:40s} {1e3 * seconds:7.3f} ms  {2 * N / seconds / 1e12:5.2f} TB/s", flush=True)


def torch_rows():
    import torch

    x = torch.zeros(N // 2, dtype=torch.bfloat16, device="cuda")
    y = torch.empty_like(x)
    for name, fn in (("bf16 x + 1", lambda: x + 1), ("y.copy_(x)", lambda: y.copy_(x)), ("x.clone()", x.clone)):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        samples = []
        for _ in range(10):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(10):
                fn()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end) / 1e3 / 10)
        seconds = statistics.median(samples)
        print(f"torch {name:40s} {1e3 * seconds:7.3f} ms  {2 * N / seconds / 1e12:5.2f} TB/s", flush=True)


if __name__ == "__main__":
    jax_rows()
    torch_rows()
