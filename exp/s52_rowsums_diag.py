"""Session 52, prepared for the next session: why the float8 forward's row sums on the tensor cores (P·e₀ beside
P·V, session 48's `row_sums_on_tc`) were wrong on the GPU (relative error 0.15-0.32) though right in interpret mode.
Dropping each score's FADD would take one of its ~6 instructions off the softmax, the float8 forward's bound.

With `exp/s52_fp8_rowsums.patch` applied (session 48's options back: `p_in_registers`, `row_sums_on_tc`), one CTA's
128 query rows against 128-1024 keys: P·V is the same in every variant, so each row's output differs from the
FADD-summed one by its denominator alone. The script prints, per variant and key count, the relative error and that
per-row ratio (out / out with FADD sums) summarised by warp (rows 16w..16w+15 of each warpgroup) and by row within a
warp's 16 (lane groups): a layout fault shows as a pattern over rows, a missed or doubled tile as a ratio of
(n - 1) / n or (n + 1) / n at n key tiles.

At `fd6ce64` (the patch predates session 53's scale inside the exponent; its answer is in BENCHMARKS.md):

    git apply exp/s52_fp8_rowsums.patch && PYTHONPATH=src python exp/s52_rowsums_diag.py           # H100/H200
    git apply exp/s52_fp8_rowsums.patch && PYTHONPATH=src:tests python exp/s52_rowsums_diag.py --quick   # CPU
"""

from __future__ import annotations

import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np
from _kit import interpret_context

from ejkernel.kernels._pallas.gpu.flash_attention import _fwd_fp8
from ejkernel.kernels._pallas.gpu.flash_attention._interface import float8_attention

VARIANTS = {  # name: (overlap, p_in_registers, row_sums_on_tc)
    "fadd": (True, True, False),
    "tc ov reg": (True, True, True),
    "tc ov smem": (True, False, True),
    "tc pp reg": (False, True, True),
    "tc pp smem": (False, False, True),
}


def main() -> None:
    quick = "--quick" in sys.argv
    if quick:  # (inline Mosaic GPU, which interpret mode cannot run, as the key permutation it amounts to)
        _fwd_fp8.register_operand = _fwd_fp8.keys_in_register_order
    heads, dim = 1, 128
    with interpret_context(quick):
        for keys in (128, 256) if quick else (128, 256, 384, 1024):
            rng = np.random.default_rng(keys)
            q, k, v = (
                jnp.asarray(4 * rng.standard_normal((1, n, heads, dim)), jnp.float8_e4m3fn) for n in (128, keys, keys)
            )
            descales = tuple(jnp.full((heads,), 0.25, jnp.float32) for _ in range(3))
            outs = {}
            for name, (overlap, registers, sums) in VARIANTS.items():
                options = dict(overlap=overlap, p_in_registers=registers, row_sums_on_tc=sums)
                run = jax.jit(functools.partial(float8_attention, softmax_scale=0.1, causal=False, **options))
                outs[name] = np.asarray(run(q, k, v, descales), np.float32)[0, :, 0, :]
            base = outs["fadd"]
            for name, out in outs.items():
                if name == "fadd":
                    continue
                err = np.linalg.norm(out - base) / np.linalg.norm(base)
                ratio = np.median(out / np.where(base == 0, 1.0, base), axis=1)  # per row
                by_warp = ratio.reshape(8, 16).mean(axis=1)
                by_lane = ratio.reshape(8, 16).mean(axis=0)
                print(f"keys {keys:5d} {name:11s} rel {err:.2e}  ratio min {ratio.min():.3f} max {ratio.max():.3f}")
                print(f"    by warp (16 rows each): {' '.join(f'{x:.3f}' for x in by_warp)}")
                print(f"    by row within a warp:   {' '.join(f'{x:.3f}' for x in by_lane)}")


if __name__ == "__main__":
    main()
