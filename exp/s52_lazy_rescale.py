"""Session 52: the Mosaic GPU forwards with lazy rescaling (issue 42: the float8 forward at 1.19x cuDNN bf16, target
1.6x; the bf16 forward >= 1.10x on every anchor shape), A/B in one process.

Nsight Compute put the bf16 forward's instructions at 13% each FMNMX, FADD, FMUL, FFMA and MUFU.EX2: the FMULs are the
accumulator's rescale by alpha, one per output value a step, as many as the scores' exponentials. Lazy: a row's
offset is raised only where the tile's maximum passes it by more than a slack (`_parts.raised_max`; P up to 2^slack:
0.8 past e4m3's 2^8 shift, 8 in bf16), and each warp whose 16 rows all keep theirs skips the rescale
(`_parts.rescale_rows`, a vote). Switches `_fwd_fp8.LAZY_RESCALE`, `_fwd.LAZY_RESCALE` (read when traced) live in
the prototype, `exp/s52_lazy_rescale.patch` (from `a707e01`; slower on every shape, reverted: BENCHMARKS.md).

    git apply exp/s52_lazy_rescale.patch && PYTHONPATH=src python exp/s52_lazy_rescale.py   # H100/H200, ~2 minutes
"""

from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp
from _kit import log, patched, rel, start_watchdog

from ejkernel.kernels._pallas.gpu.flash_attention import _fwd, _fwd_fp8
from ejkernel.kernels._pallas.gpu.flash_attention._interface import float8_attention, mosaic_attention
from ejkernel.ops.autotune import time_fns

SHAPES = [(2, 8192, 16, 128), (1, 16384, 16, 128), (8, 2048, 16, 128)]


def compiled(fn, args, **switches):
    """`fn(*args)` compiled with the module switches (`bf16`, `fp8`: `LAZY_RESCALE`) set while it is traced."""
    modules = {"bf16": _fwd, "fp8": _fwd_fp8}
    with contextlib.ExitStack() as stack:
        for name, value in switches.items():
            stack.enter_context(patched(modules[name], LAZY_RESCALE=value))
        return functools.partial(jax.jit(fn).lower(*args).compile(), *args)


def main() -> None:
    start_watchdog(150.0)
    log(f"device {jax.devices()[0].device_kind}, jax {jax.__version__}")
    for batch, seq, heads, dim in SHAPES:
        for causal in (False, True):
            run_case(batch, seq, heads, dim, causal)
    log("done")


def run_case(batch: int, seq: int, heads: int, dim: int, causal: bool) -> None:
    where = f"{batch}x{seq}x{heads}x{dim} causal={causal}"
    keys = jax.random.split(jax.random.PRNGKey(seq + int(causal)), 3)
    q, k, v = (jax.random.normal(key, (batch, seq, heads, dim), jnp.bfloat16) for key in keys)
    q8, k8, v8 = ((4 * x).astype(jnp.float8_e4m3fn) for x in (q, k, v))
    descales = tuple(jnp.full((heads,), 0.25, jnp.float32) for _ in range(3))
    scale = dim**-0.5
    fp8 = lambda q, k, v, d: float8_attention(q, k, v, d, softmax_scale=scale, causal=causal)
    bf16 = lambda q, k, v: mosaic_attention(q, k, v, softmax_scale=scale, causal=causal, sliding_window=None)
    cudnn = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="cudnn")
    calls = {
        "fp8 eager": compiled(fp8, (q8, k8, v8, descales), fp8=False),
        "fp8 lazy": compiled(fp8, (q8, k8, v8, descales), fp8=True),
        "bf16 eager": compiled(bf16, (q, k, v), bf16=False),
        "bf16 lazy": compiled(bf16, (q, k, v), bf16=True),
        "cudnn bf16": compiled(cudnn, (q, k, v)),
    }
    outs = {name: jax.block_until_ready(call()) for name, call in calls.items()}
    log(
        f"{where}: compiled; rel fp8 lazy/eager {rel(outs['fp8 lazy'], outs['fp8 eager']):.1e}, to cudnn "
        f"{rel(outs['fp8 lazy'], outs['cudnn bf16']):.1e} / {rel(outs['fp8 eager'], outs['cudnn bf16']):.1e}; "
        f"bf16 lazy/eager {rel(outs['bf16 lazy'], outs['bf16 eager']):.1e}, to cudnn "
        f"{rel(outs['bf16 lazy'], outs['cudnn bf16']):.1e} / {rel(outs['bf16 eager'], outs['cudnn bf16']):.1e}"
    )
    seconds = time_fns(calls, repeats=10)
    flops = 4 * batch * heads * seq * seq * dim * (0.5 if causal else 1.0)
    base = seconds["cudnn bf16"]
    for name, s in seconds.items():
        log(f"{where}: {name:11s} {s * 1e3:7.3f} ms {flops / s / 1e12:6.1f} TFLOP/s  x{base / s:.3f} cuDNN")


if __name__ == "__main__":
    main()
