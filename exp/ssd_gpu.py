"""Mamba-2 (state_space_v2) on a GPU: the Triton path (the GLA kernels) against XLA, for correctness and speed.

    PYTHONPATH=src python exp/ssd_gpu.py                 # on a GPU, under 4 minutes with compilation
    PYTHONPATH=src python exp/ssd_gpu.py --cpu-smoke     # tiny shapes, Pallas interpret mode, on a CPU

The Triton path is the public op, `state_space_v2(..., platform="triton")` (with --cpu-smoke, which the
op cannot run in interpret mode, its Triton entry with `interpret=True`). Its chunks: 64 tokens where no
derivative is taken, 32 where one is, each capped by `cfg.chunk_size` (the variants `C32`, `C16`).
Sections (each guarded: a failure is printed and the rest runs; no variant is compiled after --budget s):
1. check: at B=1 S=4096 H=8 P=64 N=128, groups 1 and 2, bf16 and float32 inputs (A, D and the initial state
   float32), a differentiated call on the Triton path: output y, final state and the gradients of x, A, B,
   C, D, dt and the initial state under one random cotangent, against XLA's path in float32 at full matmul
   precision on the same (rounded) inputs. `rel` = ‖x − ref‖ / ‖ref‖, `max` = max |x − ref| / max |ref|,
   NONFINITE where any value is not finite. Also: XLA's own path fed bf16 (the floor bf16 outputs and
   cotangents set), the plain bf16 forward, dA per head.
2. time: at B=2 S=16384 H=32 P=64 N=128 G=1 bf16 (the bench's shape), forward and forward+backward
   (gradients of x, A, B, C, D, dt) of XLA (chunk 64, and the bench's 256), the Triton path by default
   and capped at the chunks `--chunks` names, the plain forward unfused (`GLA_TILING.fuse_head_scores=False`:
   scores written to memory and read back, dt ⊙ x and the D skip passes of their own), and differentiated
   with the gradient kernel's heads per program (`GLA_TILING.head_span`, default 8: it sums dB and dC
   over 8 heads, XLA over the spans) at 1 (dB, dC per head in float32, summed by XLA) and 32; `time_fns`
   medians, all variants interleaved.
   Table at the end, with the targets.
3. kernels: each GLA kernel alone at the bench shape (chunk 64 and 32, default tiles: grads in spans of 8
   heads), at the first chunk also other tiles (`TILE_VARIANTS`: spans of 1 and 32, warps, key and state
   tiles), and XLA's sum of a per-head dB over the heads (what span 1 adds).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np
from _kit import elapsed, errors, gla_stages, log

from ejkernel.kernels._common.state_space import ssd_inputs
from ejkernel.kernels._triton.linear_attention import _gla
from ejkernel.kernels._triton.linear_attention._gla import TritonGlaTiling
from ejkernel.kernels._triton.state_space_v2 import _interface as ssd
from ejkernel.kernels._xla.state_space_v2._interface import state_space_v2_xla
from ejkernel.modules import StateSpaceV2Config, state_space_v2
from ejkernel.ops.autotune import time_fns

ARGS = None
NAMES = ["y", "state", "dx", "dA", "dB", "dC", "dD", "ddt", "dh0"]
TARGETS = "anchors (mamba_chunk_scan_combined, H200): fwd+bwd 4.46 ms, fwd 0.88 ms"


def guarded(name, fn):
    try:
        fn()
    except Exception:
        log(f"{name} FAILED:")
        traceback.print_exc(limit=8)
        sys.stdout.flush()


@contextlib.contextmanager
def tiles(tiling=None):
    """The GLA kernels' tiles (`GLA_TILING`, read when a call is traced) while a call is traced."""
    saved = ssd.GLA_TILING
    ssd.GLA_TILING = tiling or saved
    try:
        yield
    finally:
        ssd.GLA_TILING = saved


# ---- inputs and calls ----


def make_inputs(batch, seq, heads, head_dim, state, groups, dtype, seed=0):
    """`[x, A, B, C, D, dt, h0]`: x, B, C, dt in `dtype`; A, D, h0 float32 (as models keep them)."""
    keys = iter(jax.random.split(jax.random.PRNGKey(seed), 8))
    normal = lambda *shape: jax.random.normal(next(keys), shape, jnp.float32)
    return [
        normal(batch, seq, heads, head_dim).astype(dtype),
        -jnp.exp(0.5 * normal(heads)),
        normal(batch, seq, groups, state).astype(dtype),
        normal(batch, seq, groups, state).astype(dtype),
        normal(heads),
        jax.nn.softplus(normal(batch, seq, heads) - 2.0).astype(dtype),
        0.1 * normal(batch, heads, head_dim, state),
    ]


def scan_fn(impl, groups, chunk=None):
    """`(x, A, B, C, D, dt, h0) -> (y, state)` (no gate) of XLA's path (`impl` "xla") or the Triton one
    ("triton"), with `chunk_size` `chunk` (None: the default config)."""
    cfg = None if chunk is None else StateSpaceV2Config(platform=impl, chunk_size=chunk)
    if impl == "xla":
        call = functools.partial(state_space_v2_xla, cfg=cfg)
    elif ARGS.interpret:  # the public op has no interpret switch: its Triton entry
        call = functools.partial(ssd.state_space_v2_triton, cfg=cfg, interpret=True)
    else:
        call = functools.partial(state_space_v2, platform="triton", cfg=cfg)

    def fn(x, A, B, C, D, dt, h0=None):
        y, state, _ = call(x, A, B, C, D, dt, None, h0, n_groups=groups)
        return y, state

    return fn


def row(name, values, refs, names=NAMES):
    cells = []
    for n, x, r in zip(names, values, refs, strict=False):
        rel, mx, finite = errors(x, r)
        cells.append(f"{n} {rel:.1e}/{mx:.1e}{'' if finite else ' NONFINITE'}")
    log(f"{name:<30} " + "  ".join(cells))


def vjp_all(fn, args, cotangent_seed=7):
    """Forward and the VJP of every argument under one random cotangent (float32, cast to each output's dtype)."""
    (y, state), pullback = jax.vjp(jax.jit(fn), *args)
    k = jax.random.split(jax.random.PRNGKey(cotangent_seed))
    cts = (jax.random.normal(k[0], y.shape, jnp.float32), jax.random.normal(k[1], state.shape, jnp.float32))
    grads = pullback((cts[0].astype(y.dtype), cts[1].astype(state.dtype)))
    return [y, state, *grads]


# ---- sections ----


def check():
    b, s, h, p, n = ARGS.check_shape
    log(f"check: vs XLA float32 at highest precision; rel/max errors; B={b} S={s} H={h} P={p} N={n}, default chunks")
    for groups in (1, 2):
        base = make_inputs(b, s, h, p, n, groups, jnp.bfloat16, seed=groups)
        for dtype in (jnp.bfloat16, jnp.float32):
            if elapsed() > ARGS.budget:
                log(f"check g{groups} {jnp.dtype(dtype).name}: skipped (time budget {ARGS.budget}s spent)")
                continue

            def one(groups=groups, dtype=dtype, base=base):
                args = [a.astype(dtype) if i in (0, 2, 3, 5) else a for i, a in enumerate(base)]
                f32 = [a.astype(jnp.float32) for a in args]
                name = f"g{groups} {jnp.dtype(dtype).name}"
                with jax.default_matmul_precision("highest"):
                    ref = vjp_all(scan_fn("xla", groups), f32)
                ours = vjp_all(scan_fn("triton", groups), args)
                row(f"triton {name}", ours, ref)
                if dtype == jnp.bfloat16 and groups == 1:
                    row(f"xla {name} (the floor)", vjp_all(scan_fn("xla", groups), args), ref)
                heads = min(h, 4)
                ours_da, ref_da = np.asarray(ours[3])[:heads], np.asarray(ref[3])[:heads]
                log(f"  dA per head (first {heads}): triton {ours_da}  ref {ref_da}")
                if dtype == jnp.bfloat16:
                    row(f"triton {name} plain fwd", jax.jit(scan_fn("triton", groups))(*args), ref[:2])

            guarded(f"check g{groups} {jnp.dtype(dtype).name}", one)


def training_step(fn, args):
    loss = lambda *a: sum(jnp.sum(o.astype(jnp.float32)) for o in fn(*a))
    step = jax.jit(jax.grad(loss, argnums=tuple(range(len(args)))))
    return functools.partial(step, *args)


def forward_step(fn, args):
    return functools.partial(jax.jit(fn), *args)


def timed(builders: dict, repeats: int) -> dict:
    """Build, compile and run each variant `name: (builder, GLA tiles or None)` once (failures printed, none
    started past the budget), then time the ready ones together."""
    ready = {}
    for name, (build, tiling) in builders.items():
        if elapsed() > ARGS.budget:
            log(f"{name}: skipped (time budget {ARGS.budget}s spent)")
            continue
        try:
            t0 = time.perf_counter()
            with tiles(tiling):
                call = build()
                jax.block_until_ready(call())  # traced (and compiled) with these tiles
            ready[name] = call
            log(f"  built {name} ({time.perf_counter() - t0:.1f}s)")
        except Exception as err:
            log(f"{name}: {type(err).__name__}: {str(err)[:400]}")
    if not ready:
        return {}
    log(f"timing {len(ready)} variants, {repeats} rounds")
    return time_fns(ready, repeats=repeats, warmup=2)


def bench():
    b, s, h, p, n = ARGS.bench_shape
    args = make_inputs(b, s, h, p, n, 1, jnp.bfloat16)[:6]
    scan = lambda impl, chunk=None: scan_fn(impl, 1, chunk)  # a new function each: its own jit cache
    fwd = lambda impl, chunk=None: functools.partial(forward_step, scan(impl, chunk), args)
    train = lambda impl, chunk=None: functools.partial(training_step, scan(impl, chunk), args)
    span = lambda heads: dataclasses.replace(ssd.GLA_TILING, head_span=heads)
    unfused = dataclasses.replace(ssd.GLA_TILING, fuse_head_scores=False)
    # name: (builder, GLA tiles or None), in order of interest (a spent budget skips the last ones)
    builders = {
        "xla fwd+bwd": (train("xla"), None),
        f"triton fwd+bwd (C{ssd.TRAINING_CHUNK})": (train("triton"), None),
        "xla fwd": (fwd("xla"), None),
        f"triton fwd (C{ssd.PLAIN_CHUNK})": (fwd("triton"), None),
        "triton fwd unfused": (fwd("triton"), unfused),
    }
    defaults = ssd.chunks(None)
    for cap in ARGS.chunks:  # the caps that change a chunk
        plain, trained = ssd.chunks(StateSpaceV2Config(chunk_size=cap))
        if plain != defaults[0]:
            builders[f"triton C{plain} fwd"] = (fwd("triton", cap), None)
        if trained != defaults[1]:
            builders[f"triton C{trained} fwd+bwd"] = (train("triton", cap), None)
    for heads in (1, 32):
        builders[f"triton span{heads} fwd+bwd"] = (train("triton"), span(heads))
    builders["xla C256 fwd+bwd (bench cfg)"] = (train("xla", 256), None)
    builders["xla C256 fwd (bench cfg)"] = (fwd("xla", 256), None)
    log(f"time: building {len(builders)} variants at B={b} S={s} H={h} P={p} N={n} G=1 bf16")
    times = timed(builders, ARGS.repeats)
    RESULTS.update(times)


def kernels():
    b, s, h, p, n = ARGS.bench_shape
    x, A, B, C, _, dt, _ = make_inputs(b, s, h, p, n, 1, jnp.bfloat16)
    q, k, v, a = jax.jit(ssd_inputs, static_argnums=5)(x, A, B, C, dt, jnp.bfloat16)
    do = jax.random.normal(jax.random.PRNGKey(3), v.shape, jnp.float32).astype(v.dtype)
    init = jnp.zeros((b, h, n, p), jnp.float32)
    builders = {}
    for chunk in ARGS.kernel_chunks:
        t = TritonGlaTiling(interpret=ARGS.interpret, precise=False).fit(n, p)
        stages = gla_stages(t, chunk, 1.0, q, k, v, a[..., None], do, init)
        for stage, make in stages.items():
            builders[f"C{chunk} {stage}"] = (functools.partial(make, t), None)
        if chunk != ARGS.kernel_chunks[0]:
            continue
        for label, variant in TILE_VARIANTS:  # the tiles of a kernel beside its default (`stage label`)
            make = stages[label.split(" ")[0]]
            builders[f"C{chunk} {label}"] = (functools.partial(make, dataclasses.replace(t, **variant).fit(n, p)), None)
    wide = jax.random.normal(jax.random.PRNGKey(4), (b, s, h, n), jnp.float32)
    group_sum = jax.jit(lambda w: _gla.group_sum(w, 1, jnp.bfloat16))
    builders["xla sum of dB or dC per head (span1)"] = (lambda: functools.partial(group_sum, wide), None)
    log(f"kernels: building {len(builders)} (each alone, bf16, B={b} S={s} H={h} P={p} N={n})")
    times = timed(builders, ARGS.repeats)
    log("kernels (ms each):")
    for name, seconds in times.items():
        print(f"  {name:<36} {1e3 * seconds:8.3f}")
    sys.stdout.flush()


RESULTS: dict = {}

# Kernel tiles tried at the first kernel chunk, beside the defaults (TritonGlaTiling: state tiles 64x64, 4 warps;
# scores 4 warps; grads key tile 128, 8 warps, spans of 8 heads).
TILE_VARIANTS = [
    ("grads span1", dict(head_span=1)),
    ("grads span32", dict(head_span=32)),
    ("grads w4", dict(grads_warps=4)),
    ("grads k64", dict(block_k=64)),
    ("states 32x64", dict(state_k=32)),
    ("state_grads 32x64", dict(state_k=32)),
    ("scores w8", dict(scores_warps=8)),
]


def table():
    if not RESULTS:
        log("no timings")
        return
    xla = {mode: RESULTS.get(f"xla {mode}") for mode in ("fwd", "fwd+bwd")}
    print(f"\nstate_space_v2 at B,S,H,P,N = {ARGS.bench_shape}, G=1, bf16; {jax.devices()[0].device_kind}")
    print(f"  {'variant':<32} {'ms':>9} {'vs xla':>8}")
    mode_of = lambda name: "fwd+bwd" if name.split(" (")[0].endswith("fwd+bwd") else "fwd"
    for mode in ("fwd", "fwd+bwd"):
        for name, seconds in RESULTS.items():
            if mode_of(name) == mode:
                ratio = f"{xla[mode] / seconds:7.2f}x" if xla[mode] else ""
                print(f"  {name:<32} {1e3 * seconds:9.3f} {ratio:>8}")
    print(f"  (vs xla = XLA chunk 64 / this)\n  {TARGETS}")
    sys.stdout.flush()


def main():
    global ARGS
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu-smoke", action="store_true", help="tiny shapes in Pallas interpret mode (on a CPU)")
    p.add_argument("--sections", default="check,time,kernels")
    p.add_argument("--budget", type=float, default=170.0, help="seconds after which no new variant is compiled")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--chunks", default="32,16", help="chunk_size caps timed beside the default chunks")
    p.add_argument("--cache-dir", default="/tmp/ejkernel_ssd_jax_cache", help="JAX compilation cache ('' for none)")
    args = ARGS = p.parse_args()
    args.interpret = args.cpu_smoke
    args.chunks = tuple(int(c) for c in args.chunks.split(",") if c)
    if args.cpu_smoke:
        args.check_shape, args.bench_shape = (1, 128, 4, 16, 32), (1, 128, 2, 16, 32)
        args.kernel_chunks = (32,)
        args.repeats = 2
    else:
        args.check_shape, args.bench_shape = (1, 4096, 8, 64, 128), (2, 16384, 32, 64, 128)
        args.kernel_chunks = (64, 32)
    if args.cache_dir:  # a second run on the same machine skips most compilation
        jax.config.update("jax_compilation_cache_dir", args.cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    log(f"jax {jax.__version__}, devices {jax.devices()}, sections {args.sections}")
    log(f"defaults: PLAIN_CHUNK={ssd.PLAIN_CHUNK} TRAINING_CHUNK={ssd.TRAINING_CHUNK} GLA_TILING={ssd.GLA_TILING}")
    sections = {"check": check, "time": bench, "kernels": kernels}
    for name in args.sections.split(","):
        guarded(name, sections[name])
        if name == "time":
            table()
    log("done")


if __name__ == "__main__":
    main()
