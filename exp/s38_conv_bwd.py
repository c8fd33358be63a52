"""Session 38: `causal_conv1d`'s dense backward (16384 tokens as 64 x 256 x 8192 channels, W 4, bf16, bias, SiLU):
XLA's autodiff of the plain-JAX forward (the backward on every platform until this session) against a written-out
backward in plain JAX (`formula`, call 9) and the Triton backward kernel (`--kernel`, call 10: `triton` and
`triton bt<run> bc<channels> w<warps>`), beside the copy, in one run. `jax.grad` of `sum(out · cotangent)` with
respect to x, weight and bias (the forward included: Triton's for `triton` and `formula`, XLA's for `xla`).
`--packed` (call 12): the same 16384 tokens packed, as 64 sequences of 256 (every run inside one) and as 17
sequences of uneven lengths (runs across bounds), `xla` against `triton`.

The formula: `pre = b + Σ_j w_j · s[t + j]` over the stream `s = zeros(W - 1) ++ x`; `dpre = dout · silu'(pre)`;
`dx[p] = Σ_j w_j · dpre[p + W - 1 - j]`; `dw_j = Σ dpre[t] · s[t + j]`; `db = Σ dpre`.

    python3 exp/s38_conv_bwd.py [--kernel | --packed]
"""

import functools
import sys

import jax
import jax.numpy as jnp

from ejkernel.benchmarks._harness import copy_builder, time_variants
from ejkernel.modules import CausalConv1dConfig, causal_conv1d
from ejkernel.ops import BwdParams

B, S, C, W = 64, 256, 8192, 4


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def formula_conv(forward, x, weight, bias):
    return forward(x, weight, bias)


def _fwd(forward, x, weight, bias):
    return forward(x, weight, bias), (x, weight, bias)


def _bwd(forward, residuals, dout):
    x, weight, bias = residuals
    w = weight.astype(jnp.float32)
    stream = jnp.pad(x.astype(jnp.float32), ((0, 0), (W - 1, 0), (0, 0)))
    pre = bias.astype(jnp.float32) + sum(stream[:, j : j + S] * w[:, j] for j in range(W))
    sig = jax.nn.sigmoid(pre)
    dpre = dout.astype(jnp.float32) * sig * (1.0 + pre * (1.0 - sig))
    padded = jnp.pad(dpre, ((0, 0), (0, W - 1), (0, 0)))
    dx = sum(padded[:, W - 1 - j : W - 1 - j + S] * w[:, j] for j in range(W))
    dw = jnp.stack([jnp.sum(dpre * stream[:, j : j + S], axis=(0, 1)) for j in range(W)], axis=1)
    db = jnp.sum(dpre, axis=(0, 1))
    return dx.astype(x.dtype), dw.astype(weight.dtype), db.astype(bias.dtype)


formula_conv.defvjp(_fwd, _bwd)


def packed():
    """`--packed`: the backward of packed calls without a state, XLA's autodiff against the kernel."""
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 4))
    x = jax.random.normal(next(keys), (B * S, C), jnp.float32).astype(jnp.bfloat16)
    weight = jax.random.normal(next(keys), (C, W), jnp.float32).astype(jnp.bfloat16)
    bias = jax.random.normal(next(keys), (C,), jnp.float32).astype(jnp.bfloat16)
    cotangent = jax.random.normal(next(keys), (B * S, C), jnp.float32).astype(jnp.bfloat16)
    uneven = [1000, 37, 3000, 1, 500, 777] * 2 + [1, 2, 3, 2000]  # and the rest: 17 sequences
    bounds = {
        "64 x 256": jnp.arange(B + 1, dtype=jnp.int32) * S,
        "17 uneven": jnp.cumsum(jnp.array([0, *uneven, B * S - sum(uneven)], jnp.int32)),
    }
    builders, grads = {"copy": copy_builder(x.nbytes)}, {}
    for label, cu in bounds.items():
        for platform in ("xla", "triton"):
            conv = functools.partial(causal_conv1d, activation="silu", platform=platform, cu_seqlens=cu)
            loss = lambda x, w, b, conv=conv: jnp.sum(conv(x, w, b).astype(jnp.float32) * cotangent)
            fn = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
            grads[(label, platform)] = fn(x, weight, bias)
            builders[f"{label} {platform}"] = lambda fn=fn: functools.partial(fn, x, weight, bias)
    timings = time_variants(builders, repeats=20, where="packed conv bwd")
    timings.pop("copy")
    for name, seconds in timings.items():
        print(f"{name:20s} {1e3 * seconds:.4f} ms")
    rel = lambda a, b: float(jnp.linalg.norm((a - b).astype(jnp.float32)) / jnp.linalg.norm(b.astype(jnp.float32)))
    for label in bounds:
        pairs = zip(grads[(label, "triton")], grads[(label, "xla")], strict=True)
        print(label, "triton vs xla:", [f"{rel(a, b):.2e}" for a, b in pairs])


def main():
    if "--packed" in sys.argv:
        return packed()
    kernel_round = "--kernel" in sys.argv
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 4))
    x = jax.random.normal(next(keys), (B, S, C), jnp.float32).astype(jnp.bfloat16)
    weight = jax.random.normal(next(keys), (C, W), jnp.float32).astype(jnp.bfloat16)
    bias = jax.random.normal(next(keys), (C,), jnp.float32).astype(jnp.bfloat16)
    cotangent = jax.random.normal(next(keys), (B, S, C), jnp.float32).astype(jnp.bfloat16)
    on = lambda platform, cfg=None: functools.partial(causal_conv1d, activation="silu", platform=platform, cfg=cfg)

    def loss(conv, x, weight, bias):
        return jnp.sum(conv(x, weight, bias).astype(jnp.float32) * cotangent.astype(jnp.float32))

    variants = {"xla": on("xla"), "triton": on("triton")}
    if not kernel_round:
        variants["formula"] = functools.partial(formula_conv, on("triton"))
    for bt, bc, warps in ((128, 1024, 8), (256, 512, 4), (256, 2048, 8), (256, 1024, 4), (64, 1024, 8)):
        if kernel_round:
            cfg = CausalConv1dConfig(bwd_params=BwdParams(block_k=bt, block_d=bc, num_warps=warps))
            variants[f"triton bt{bt} bc{bc} w{warps}"] = on("triton", cfg)
    grads, builders = {}, {"copy": copy_builder(x.nbytes)}
    for name, conv in variants.items():
        fn = jax.jit(jax.grad(functools.partial(loss, conv), argnums=(0, 1, 2)))
        grads[name] = fn(x, weight, bias)
        builders[name] = lambda fn=fn: functools.partial(fn, x, weight, bias)
        if name in ("xla", "triton", "formula"):
            builders[f"{name} fwd"] = lambda conv=conv: functools.partial(jax.jit(conv), x, weight, bias)
    timings = time_variants(builders, repeats=20, where="conv bwd")
    copy_bw = 2 * x.nbytes / timings.pop("copy")
    print(f"copy {copy_bw / 1e12:.3f} TB/s; one pass over x = {x.nbytes / copy_bw * 1e3:.4f} ms")
    for name, seconds in timings.items():
        print(f"{name:28s} {1e3 * seconds:.4f} ms")
    rel = lambda a, b: float(jnp.linalg.norm((a - b).astype(jnp.float32)) / jnp.linalg.norm(b.astype(jnp.float32)))
    for name in [n for n in grads if n != "xla"]:
        print(name, "vs xla:", [f"{rel(a, b):.2e}" for a, b in zip(grads[name], grads["xla"], strict=True)])


if __name__ == "__main__":
    main()
