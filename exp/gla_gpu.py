"""GLA on a GPU: the Triton path against XLA's, for correctness at a medium shape and for speed.

    PYTHONPATH=src python exp/gla_gpu.py                 # on a GPU, about 3-4 minutes with compilation
    PYTHONPATH=src python exp/gla_gpu.py --cpu-smoke     # tiny shapes, Pallas interpret mode, on a CPU

Sections (each guarded: a failure is printed and the rest runs; timing stops at --budget seconds):
1. check: forward (output, final state) and every gradient (q, k, v, g, initial state) of the Triton path
   (bf16 and float32 inputs) against the XLA path in float32 at full matmul precision, at B=1, S=2048,
   H=4, D=128; plus strongly decaying gates at S=4096 (bf16) and packed + reversed + grouped heads.
   Errors: `rel` = ‖x − ref‖ / ‖ref‖, `max` = max |x − ref| / max |ref|.
2. e2e: forward and forward+backward (gradients of q, k, v, g) of XLA, Triton (default tiling and a
   few variants), and causal flash attention, at B=2, S=16384, H=16, D=128, bf16 (`time_fns` medians).
3. kernels: each of the five Triton kernels alone at that shape, with tiling / warp variants, and the
   XLA glue (gate cumsum), so that the end-to-end time can be split.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import traceback

import jax
import jax.numpy as jnp
from _kit import elapsed, errors, gla_stages, log

from ejkernel.kernels._common.linear_attention import entries
from ejkernel.kernels._triton.linear_attention._gla import TritonGlaTiling
from ejkernel.kernels._triton.linear_attention._interface import TritonEngine
from ejkernel.kernels._triton.linear_attention._state_passes import TritonStatePassTiling
from ejkernel.modules import GLAttentionConfig, flash_attention
from ejkernel.ops.autotune import time_fns


def guarded(name):
    """Run the decorated section now; print (not raise) its failure."""

    def run(fn):
        try:
            fn()
        except Exception:
            log(f"{name} FAILED:")
            traceback.print_exc(limit=6)
            sys.stdout.flush()
        return fn

    return run


# ---- inputs and calls ----


def make_inputs(batch, seq, heads, dim, dtype, *, kv_heads=None, strength=0.05, states=None, seed=0):
    keys = iter(jax.random.split(jax.random.PRNGKey(seed), 8))
    kv_heads = kv_heads or heads
    x = lambda *shape: jax.random.normal(next(keys), shape, jnp.float32)
    q, k, v = x(batch, seq, heads, dim), x(batch, seq, kv_heads, dim), x(batch, seq, kv_heads, dim)
    g = -strength * jax.nn.softplus(x(batch, seq, heads, dim))
    h0 = 0.1 * x(states or batch, heads, dim, dim)
    return [q.astype(dtype), k.astype(dtype), v.astype(dtype), g, h0]


def engine_of(tiling: TritonGlaTiling, interpret: bool):
    return lambda cfg: TritonEngine(
        TritonStatePassTiling(32, 4, 2, interpret), dataclasses.replace(tiling, interpret=interpret)
    )


def gla_fn(engine, chunk, *, cu_seqlens=None, reverse=False, return_state=True):
    """`(q, k, v, g, h0) -> out` or `(out, state)`: gla_attention on XLA (engine None) or Triton."""
    cfg = GLAttentionConfig(chunk_size=chunk)
    extra = {} if engine is None else {"engine": engine}

    def fn(q, k, v, g, h0=None):
        return entries.gla_attention(
            q, k, v, g, None, h0, cu_seqlens, reverse=reverse, return_state=return_state, cfg=cfg, **extra
        )

    return fn


def reference(ref_fn, args):
    """`(cotangents, [out, state, *gradients])` of `ref_fn` in float32 at full matmul precision."""
    f32 = [a.astype(jnp.float32) for a in args]
    with jax.default_matmul_precision("highest"):
        (rout, rstate), rvjp = jax.vjp(jax.jit(ref_fn), *f32)
        key = jax.random.split(jax.random.PRNGKey(7))
        cts = (jax.random.normal(key[0], rout.shape, jnp.float32), jax.random.normal(key[1], rstate.shape, jnp.float32))
        return cts, [rout, rstate, *rvjp(cts)]


def compare(name, fn, ref_fn, args, ref=None):
    """Forward (out, state) and the VJP of every argument under one random cotangent (`ref`: `reference`'s
    answer, made here when None)."""
    cts, refs = ref or reference(ref_fn, args)
    (out, state), vjp = jax.vjp(jax.jit(fn), *args)
    grads = vjp((cts[0].astype(out.dtype), cts[1]))
    names = ["out", "state", "dq", "dk", "dv", "dg", "dh0"]
    values = [out, state, *grads]
    cells = []
    for n, x, r in zip(names, values, refs, strict=True):
        rel, mx, finite = errors(x, r)
        cells.append(f"{n} {rel:.1e}/{mx:.1e}{'' if finite else ' NONFINITE'}")
    log(f"{name:<34} " + "  ".join(cells))


# ---- sections ----


def check(args):
    b, s, h, d = args.check_shape
    t = TritonGlaTiling()
    triton = engine_of(t, args.interpret)
    chunk = args.chunk
    log(f"check ({t}): Triton vs XLA (float32 inputs, highest precision); rel/max errors; B={b} S={s} H={h} D={d}")
    for dtype in (jnp.bfloat16, jnp.float32):

        @guarded(f"check {jnp.dtype(dtype).name}")
        def _(dtype=dtype):
            inputs = make_inputs(b, s, h, d, dtype)
            compare(f"dense {jnp.dtype(dtype).name} C{chunk}", gla_fn(triton, chunk), gla_fn(None, chunk), inputs)

    @guarded("check strong gates")
    def _():
        sb, ss, sh, sd = args.strong_shape
        inputs = make_inputs(sb, ss, sh, sd, jnp.bfloat16, strength=5.0, seed=1)
        compare(f"strong gates bf16 S={ss}", gla_fn(triton, chunk), gla_fn(None, chunk), inputs)

    if args.check_variants:  # each end-to-end variant, dense and with strong gates, against one reference each

        @guarded("check variants")
        def _():
            sb, ss, sh, sd = args.strong_shape
            cases = [
                ("dense", make_inputs(b, s, h, d, jnp.bfloat16)),
                ("strong", make_inputs(sb, ss, sh, sd, jnp.bfloat16, strength=5.0, seed=1)),
            ]
            for case, inputs in cases:
                refs = {}
                for name, tiling, c in E2E_VARIANTS:
                    ref = refs.get(c) or refs.setdefault(c, reference(gla_fn(None, c), inputs))
                    fn = gla_fn(engine_of(tiling, args.interpret), c)
                    guarded(f"check {name}")(functools.partial(compare, f"{case} {name}", fn, None, inputs, ref))

    @guarded("check per-head gates")
    def _():
        q, k, v, g, h0 = make_inputs(b, s, h, d, jnp.bfloat16, seed=3)
        cfg = GLAttentionConfig(chunk_size=chunk)

        def per_head(engine):
            extra = {} if engine is None else {"engine": engine}
            return lambda q, k, v, g, h0: entries.recurrent_attention(
                q, k, v, g, None, None, None, h0, return_state=True, cfg=cfg, **extra
            )

        compare("per-head gates bf16 (recurrent)", per_head(triton), per_head(None), [q, k, v, g[..., 0], h0])

    @guarded("check packed")
    def _():
        total = s
        cu = jnp.array([0, total // 8, total // 8, total // 2 + 3, total], jnp.int32)
        inputs = make_inputs(1, total, h, d, jnp.bfloat16, kv_heads=max(1, h // 2), states=4, seed=2)
        compare(
            "packed+reverse+GQA bf16",
            gla_fn(triton, chunk, cu_seqlens=cu, reverse=True),
            gla_fn(None, chunk, cu_seqlens=cu, reverse=True),
            inputs,
        )


def training_step(fn, args):
    loss = lambda *a: jnp.sum(fn(*a).astype(jnp.float32))
    step = jax.jit(jax.grad(loss, argnums=tuple(range(len(args)))))
    return functools.partial(step, *args)


def forward_step(fn, args):
    return functools.partial(jax.jit(fn), *args)


def timed(builders: dict, repeats: int, where: str) -> dict:
    """Build, compile and run each variant once (failures printed), then time the ready ones together."""
    ready = {}
    for name, build in builders.items():
        if elapsed() > ARGS.budget:
            log(f"{name}: skipped (time budget {ARGS.budget}s spent)")
            continue
        try:
            call = build()
            jax.block_until_ready(call())
            ready[name] = call
        except Exception as err:
            log(f"{name} {where}: {type(err).__name__}: {str(err)[:300]}")
    if not ready:
        return {}
    return time_fns(ready, repeats=repeats, warmup=2)


def lightning_fn(engine, chunk):
    """Lightning attention (a fixed decay per head: the per-head gate path) on XLA (engine None) or Triton."""
    cfg = GLAttentionConfig(chunk_size=chunk)
    extra = {} if engine is None else {"engine": engine}
    return lambda q, k, v: entries.lightning_attention(q, k, v, layer_idx=1, num_layers=4, cfg=cfg, **extra)


def e2e(args):
    b, s, h, d = args.bench_shape
    q, k, v, g, _ = make_inputs(b, s, h, d, jnp.bfloat16)
    gla_args = (q, k, v, g)
    triton = engine_of(TritonGlaTiling(), args.interpret)
    builders = {}
    engines = (("triton", triton),) if args.gla_only else (("xla", None), ("triton", triton))
    for name, engine in engines:
        fn = gla_fn(engine, args.chunk, return_state=False)
        builders[f"gla {name} fwd"] = functools.partial(forward_step, fn, gla_args)
        builders[f"gla {name} fwd+bwd"] = functools.partial(training_step, fn, gla_args)
    if not args.interpret:
        flash = lambda q, k, v: flash_attention(q, k, v, causal=True)
        builders["flash_causal fwd+bwd"] = functools.partial(training_step, flash, gla_args[:3])
    for name, engine in () if args.gla_only else engines:
        fn = lightning_fn(engine, args.chunk)
        builders[f"lightning {name} fwd+bwd"] = functools.partial(training_step, fn, gla_args[:3])
    for name, tiling, chunk in E2E_VARIANTS:
        fn = gla_fn(engine_of(tiling, args.interpret), chunk, return_state=False)
        builders[f"gla {name} fwd+bwd"] = functools.partial(training_step, fn, gla_args)
    log(f"e2e: compiling {len(builders)} variants at B={b} S={s} H={h} D={d} bf16")
    times = timed(builders, args.repeats, "e2e")
    log("e2e (ms per call; vs XLA = XLA's time / this, same op and step):")
    for name, seconds in times.items():
        op, *_, step = name.split(" ")
        xla = times.get(f"{op} xla {step}")
        versus = f"{xla / seconds:6.2f}x" if xla and not name.startswith("flash") else ""
        print(f"  {name:<36} {1e3 * seconds:9.3f}  {versus}")
    sys.stdout.flush()


def kernels(args):
    b, s, h, d = args.bench_shape
    chunk = args.chunk
    q, k, v, gate, _ = make_inputs(b, s, h, d, jnp.bfloat16)
    cumulative = jax.jit(lambda x: jnp.cumsum(x.reshape(b, s // chunk, chunk, h, d), axis=2).reshape(x.shape))
    do = jax.random.normal(jax.random.PRNGKey(3), v.shape, jnp.float32).astype(v.dtype)
    fit = lambda t: dataclasses.replace(t, interpret=args.interpret, precise=False).fit(d, d)
    init = jnp.zeros((b, h, d, d), jnp.float32)
    stages = gla_stages(fit(TritonGlaTiling()), chunk, d**-0.5, q, k, v, gate, do, init)
    builders = {"xla gate cumsum (for comparison)": lambda: functools.partial(cumulative, gate)}
    for stage, label, t in KERNEL_VARIANTS:
        builders[f"{stage} {label}"] = functools.partial(stages[stage], fit(t))
    log(f"kernels: compiling {len(builders)} kernel variants (chunk {chunk})")
    times = timed(builders, args.repeats, "kernels")
    log("kernels (ms each):")
    for name, seconds in times.items():
        print(f"  {name:<40} {1e3 * seconds:8.3f}")
    sys.stdout.flush()


# End-to-end forward+backward variants of GLA beside the default (name, tiling, chunk).
E2E_VARIANTS = [
    ("triton C32 k32 w4", TritonGlaTiling(block_k=32), 32),
    ("triton C32 k32 w2", TritonGlaTiling(block_k=32, grads_warps=2), 32),
    ("triton C32 stages3", TritonGlaTiling(num_stages=3), 32),
    ("triton C32 states 32x64", TritonGlaTiling(state_k=32), 32),
    ("triton C64", TritonGlaTiling(), 64),
    ("triton C16", TritonGlaTiling(), 16),
]

# (kernel, label, tiling): the default first.
KERNEL_VARIANTS = [
    ("cumulative", "default", TritonGlaTiling()),
    ("states", "default 64x64 w4", TritonGlaTiling()),
    ("states", "32x64 w4", TritonGlaTiling(state_k=32)),
    ("states", "32x32 w4", TritonGlaTiling(state_k=32, state_v=32)),
    ("states", "32x64 w2", TritonGlaTiling(state_k=32, state_warps=2)),
    ("state_grads", "default 64x64 w4", TritonGlaTiling()),
    ("state_grads", "32x64 w4", TritonGlaTiling(state_k=32)),
    ("state_grads", "32x32 w4", TritonGlaTiling(state_k=32, state_v=32)),
    ("scores", "default w2", TritonGlaTiling()),
    ("scores", "w1", TritonGlaTiling(scores_warps=1)),
    ("outputs", "default v128 w4", TritonGlaTiling()),
    ("outputs", "v64 w4", TritonGlaTiling(block_v=64)),
    ("outputs", "v128 w8", TritonGlaTiling(output_warps=8)),
    ("grads", "default k64 w4", TritonGlaTiling()),
    ("grads", "k32 w4", TritonGlaTiling(block_k=32)),
    ("grads", "k32 w2", TritonGlaTiling(block_k=32, grads_warps=2)),
    ("grads", "k64 w8", TritonGlaTiling(grads_warps=8)),
    ("grads", "k64 w4 stages3", TritonGlaTiling(num_stages=3)),
]


def main():
    global ARGS
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu-smoke", action="store_true", help="tiny shapes in Pallas interpret mode (on a CPU)")
    p.add_argument("--sections", default="check,e2e,kernels")
    p.add_argument("--budget", type=float, default=210.0, help="seconds after which no new variant is compiled")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--chunk", type=int, default=64)
    p.add_argument("--check-variants", action="store_true", help="check: every end-to-end variant too")
    p.add_argument("--gla-only", action="store_true", help="e2e: GLA on Triton and flash only (no XLA, no lightning)")
    p.add_argument("--cache-dir", default="/tmp/ejkernel_gla_jax_cache", help="JAX compilation cache ('' for none)")
    args = ARGS = p.parse_args()
    args.interpret = args.cpu_smoke
    if args.cpu_smoke:
        args.check_shape, args.strong_shape, args.bench_shape = (1, 100, 2, 16), (1, 256, 1, 16), (1, 128, 2, 32)
        args.chunk = min(args.chunk, 32)
        args.repeats = 2
        E2E_VARIANTS[:] = E2E_VARIANTS[:1]
        E2E_VARIANTS[0] = ("triton C16", TritonGlaTiling(), 16)
        KERNEL_VARIANTS[:] = [v for v in KERNEL_VARIANTS if v[1].startswith("default")]
    else:
        args.check_shape, args.strong_shape = (1, 2048, 4, 128), (1, 4096, 2, 128)
        args.bench_shape = (2, 16384, 16, 128)
    if args.cache_dir:  # a second run on the same machine skips most compilation
        jax.config.update("jax_compilation_cache_dir", args.cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    log(f"jax {jax.__version__}, devices {jax.devices()}, sections {args.sections}")
    sections = {"check": check, "e2e": e2e, "kernels": kernels}
    for name in args.sections.split(","):
        guarded(name)(functools.partial(sections[name], args))
    log("done")


ARGS = None

if __name__ == "__main__":
    main()
