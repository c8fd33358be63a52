"""Session 54: a faster Vᵀ for the float8 forward (issue 42). XLA's transpose of e4m3 V into `[B, Hkv, D, Sk]` with
P's key order (`_fwd_fp8.keys_in_register_order`) took 44-46 us for 32 MiB on an H200 (call 1: 11.8% of the 8 x 2048
forward, 18.2% causal), where a copy of those bytes needs about 16 us. Candidates: the same XLA transpose on the
bytes as uint8, and a Pallas-Triton kernel (a `[block, D]` tile of keys, reshaped and transposed in registers).

    PYTHONPATH=src python exp/s54_vt.py --check          # interpret mode on a CPU, against XLA's
    PYTHONPATH=src python exp/s54_vt.py                  # on an H200, timed beside XLA's and a copy
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from _kit import check_or_bench
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from ejkernel.kernels._pallas.gpu.flash_attention._fwd_fp8 import keys_in_register_order, v_transposed

xla_vt = v_transposed


def xla_vt_bytes(v):
    as_bytes = lax.bitcast_convert_type(v, jnp.uint8)
    return lax.bitcast_convert_type(keys_in_register_order(jnp.transpose(as_bytes, (0, 2, 3, 1))), v.dtype)


def _vt_kernel(v_ref, vt_ref, *, block: int):
    tile = v_ref[0, :, 0, :]  # [block, D] bytes
    dim = tile.shape[1]
    # key 16 j + 8 a + 2 l + i -> column 16 j + 4 l + 2 a + i of the transposed tile
    parts = tile.reshape(block // 16, 2, 4, 2, dim)
    vt_ref[0, 0] = jnp.transpose(parts, (4, 0, 2, 1, 3)).reshape(dim, block)


def triton_vt(v, *, block: int = 128, num_warps: int = 4, interpret: bool = False):
    batch, seq, kv_heads, dim = v.shape
    as_bytes = lax.bitcast_convert_type(v, jnp.uint8)
    out = pl.pallas_call(
        functools.partial(_vt_kernel, block=block),
        grid=(batch, kv_heads, seq // block),
        in_specs=[pl.BlockSpec((1, block, 1, dim), lambda b, h, s: (b, s, h, 0))],
        out_specs=pl.BlockSpec((1, 1, dim, block), lambda b, h, s: (b, h, 0, s)),
        out_shape=jax.ShapeDtypeStruct((batch, kv_heads, dim, seq), jnp.uint8),
        compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=1),
        interpret=interpret,
    )(as_bytes)
    return lax.bitcast_convert_type(out, v.dtype)


def codes(shape):
    return (4 * jax.random.normal(jax.random.PRNGKey(0), shape, jnp.bfloat16)).astype(jnp.float8_e4m3fn)


def check() -> None:
    v = codes((2, 256, 3, 128))
    want = jnp.asarray(xla_vt(v), jnp.float32)
    for name, got in (("bytes", xla_vt_bytes(v)), ("triton", triton_vt(v, interpret=True))):
        assert bool(jnp.array_equal(jnp.asarray(got, jnp.float32), want)), name
        print(name, "equal")


def bench(repeats: int) -> None:
    from ejkernel.ops.autotune import time_fns

    for shape in ((8, 2048, 16, 128), (2, 8192, 16, 128)):
        v = codes(shape)
        fns = {"xla": jax.jit(xla_vt), "xla bytes": jax.jit(xla_vt_bytes)}
        fns["xla transpose alone (keys unpermuted)"] = jax.jit(lambda v: jnp.transpose(v, (0, 2, 3, 1)))
        for block in (64, 128):
            for warps in (4, 8):
                fns[f"triton b{block} w{warps}"] = jax.jit(functools.partial(triton_vt, block=block, num_warps=warps))
        fns["copy (bytes + 1)"] = jax.jit(lambda v: lax.bitcast_convert_type(v, jnp.uint8) + jnp.uint8(1))
        want = jnp.asarray(fns["xla"](v), jnp.float32)
        calls = {}
        for name, fn in fns.items():
            try:
                got = fn(v)
            except Exception as e:  # (a tiling that does not lower: reported, left out)
                print(f"{shape} {name}: failed, {type(e).__name__}: {str(e)[:200]}")
                continue
            same = bool(jnp.array_equal(jnp.asarray(got, jnp.float32), want))
            if "copy" not in name and "alone" not in name and not same:
                print(f"{shape} {name}: WRONG")
                continue
            calls[name] = functools.partial(fn, v)
        for name, seconds in time_fns(calls, repeats=repeats).items():
            print(f"{shape} {name}: {1e6 * seconds:.1f} us, {2 * v.size / seconds / 1e12:.2f} TB/s")


if __name__ == "__main__":
    check_or_bench(__doc__, check, bench)
