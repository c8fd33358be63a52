"""State-space scans: Mamba-2 SSD and the Mamba-1 selective scan per platform, beside plain-JAX scans.

- v2 (SSD): B=2, S=16384, H=32, P=64, N=128, one group, chunk 256, bf16 activations (float32 A, D;
  no gate), forward and forward+backward of every platform. FLOPs as in anchors.md: forward
  2·B·S·(L·G·N + L·H·P + 2·H·P·N) with L the chunk, forward+backward 3× that. `ratio_to_xla` compares
  with our XLA chunked form (a plain jax.numpy SSD) in the same run; `anchor_ms` is the Mamba-2 reference
  Triton kernels' time on an H200 (anchors.md: 0.878 ms forward, 4.456 ms forward+backward).
- v1: B=2, S=16384, I=4096, N=16, bf16, beside an XLA sequential scan (`lax.scan` over tokens) and an
  XLA associative scan over the whole sequence (which holds `[B, S, I, N]` float32: it may not fit);
  `ratio_to_sequential` / `ratio_to_associative` are speed-ups measured in the same run.
- decode: one token at batch 64 with a float32 state (v2: H=32, P=64, N=128; v1: I=4096, N=16), as
  bandwidth over the state bytes read and written, beside a device copy of the state (`h + 1`). Each
  timed call runs `DECODE_STEPS` steps in a loop, every step's state the next one's input (as a model's
  layers follow one another in one program): a single step of 16 MiB is timed as its dispatch, which
  took 0.06 ms on an H100 for a step whose kernels took 0.014.
`--quick` runs small shapes without XLA's optimisations (a CPU smoke test of seconds).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from ejkernel.benchmarks._harness import parser, print_table, time_variants, write_results
from ejkernel.modules import StateSpaceV2Config, state_space_v1, state_space_v2
from ejkernel.registry import kernel_registry

OPS = ("state_space_v1", "state_space_v2")
"""The ops this benchmark times (`ejkernel bench <op>` runs it)."""

V2_SHAPE = dict(batch=2, seq=16384, heads=32, head_dim=64, state=128, groups=1, chunk=256)
V1_SHAPE = dict(batch=2, seq=16384, channels=4096, state=16)
DECODE_BATCH = 64
QUICK_V2 = dict(batch=1, seq=128, heads=2, head_dim=16, state=32, groups=1, chunk=32)
QUICK_V1 = dict(batch=1, seq=64, channels=32, state=16)
QUICK_DECODE_BATCH = 4
DECODE_STEPS = 16
ANCHOR_MS = {"forward": 0.878, "forward+backward": 4.456}  # mamba_chunk_scan_combined, H200


def _normal(key, shape, dtype=jnp.bfloat16, scale=1.0):
    return (scale * jax.random.normal(jax.random.PRNGKey(key), shape, jnp.float32)).astype(dtype)


def v2_inputs(batch, seq, heads, head_dim, state, groups, **_):
    return (
        _normal(0, (batch, seq, heads, head_dim)),
        -jnp.exp(_normal(1, (heads,), jnp.float32, 0.5)),
        _normal(2, (batch, seq, groups, state)),
        _normal(3, (batch, seq, groups, state)),
        _normal(4, (heads,), jnp.float32),
        jax.nn.softplus(_normal(5, (batch, seq, heads), jnp.float32) - 2.0).astype(jnp.bfloat16),
    )


def v1_inputs(batch, seq, channels, state):
    return (
        _normal(10, (batch, seq, channels)),
        -jnp.exp(_normal(11, (channels, state), jnp.float32, 0.5)),
        _normal(12, (batch, seq, state)),
        _normal(13, (batch, seq, state)),
        _normal(14, (channels,), jnp.float32),
        jax.nn.softplus(_normal(15, (batch, seq, channels), jnp.float32) - 2.0).astype(jnp.bfloat16),
    )


def v1_sequential(x, A, B, C, D, dt):
    """The XLA baseline a JAX user writes first: `lax.scan` over the tokens, float32 state."""
    f32 = lambda a: jnp.swapaxes(a.astype(jnp.float32), 0, 1)

    def step(h, token):
        x_t, B_t, C_t, dt_t = token
        h = jnp.exp(A * dt_t[..., None]) * h + (dt_t * x_t)[..., None] * B_t[:, None, :]
        return h, jnp.einsum("bin,bn->bi", h, C_t)

    h0 = jnp.zeros((x.shape[0], *A.shape), jnp.float32)
    h, y = lax.scan(step, h0, (f32(x), f32(B), f32(C), f32(dt)))
    return (jnp.swapaxes(y, 0, 1) + D * x).astype(x.dtype), h


def v1_associative(x, A, B, C, D, dt):
    """The parallel XLA baseline: one associative scan over the whole sequence of `[B, S, I, N]` pairs."""
    dt32, x32 = dt.astype(jnp.float32), x.astype(jnp.float32)
    decay = jnp.exp(A * dt32[..., None])
    inject = (dt32 * x32)[..., None] * B.astype(jnp.float32)[:, :, None, :]
    compose = lambda a, b: (a[0] * b[0], b[0] * a[1] + b[1])
    _, h = lax.associative_scan(compose, (decay, inject), axis=1)
    y = jnp.einsum("bsin,bsn->bsi", h, C.astype(jnp.float32))
    return (y + D * x32).astype(x.dtype), h[:, -1]


def _jitted(fn, args, backward: bool):
    """A zero-argument call of `fn(*args) -> (y, state)` jitted: its forward, or the gradient of every input."""
    if backward:
        loss = lambda *a: sum(jnp.sum(out.astype(jnp.float32)) for out in fn(*a)[:2])  # one call of fn
        grad = jax.jit(jax.grad(loss, argnums=tuple(range(len(args)))))
        return lambda: grad(*args)
    forward = jax.jit(lambda *a: fn(*a)[:2])
    return lambda: forward(*args)


def _platforms(op: str) -> list[str]:
    """The platforms that can run `op` here, and "auto" when it has a choice to make."""
    platforms = [i.platform.value for i in kernel_registry.candidates(op)]
    return (["auto"] if len(platforms) > 1 else []) + platforms


def bench_v2(shape, repeats: int) -> list[dict]:
    args = v2_inputs(**shape)
    cfg = lambda p: StateSpaceV2Config(platform=p, chunk_size=shape["chunk"])
    b, s, h, p, n, g, chunk = (shape[k] for k in ("batch", "seq", "heads", "head_dim", "state", "groups", "chunk"))
    flops = 2 * b * s * (chunk * g * n + chunk * h * p + 2 * h * p * n)
    rows = []
    for mode, factor in (("forward", 1), ("forward+backward", 3)):
        fns = {pl: functools.partial(state_space_v2, n_groups=g, cfg=cfg(pl)) for pl in _platforms("state_space_v2")}
        builders = {name: functools.partial(_jitted, fn, args, mode != "forward") for name, fn in fns.items()}
        timings = time_variants(builders, repeats=repeats, where=f"v2 {mode}")
        for name, seconds in timings.items():
            rows.append(
                dict(
                    op="v2",
                    mode=mode,
                    variant=name,
                    ms=1e3 * seconds,
                    TFLOPs=factor * flops / seconds / 1e12,
                    ratio_to_xla=timings.get("xla", float("nan")) / seconds,
                    anchor_ms=ANCHOR_MS[mode] if shape == V2_SHAPE else None,
                )
            )
    return rows


def bench_v1(shape, repeats: int) -> list[dict]:
    args = v1_inputs(**shape)
    fns = {pl: functools.partial(state_space_v1, platform=pl) for pl in _platforms("state_space_v1")}
    fns.update({"xla-sequential": v1_sequential, "xla-associative": v1_associative})
    rows = []
    for mode in ("forward", "forward+backward"):
        builders = {name: functools.partial(_jitted, fn, args, mode != "forward") for name, fn in fns.items()}
        timings = time_variants(builders, repeats=repeats, where=f"v1 {mode}")
        for name, seconds in timings.items():
            rows.append(
                dict(
                    op="v1",
                    mode=mode,
                    variant=name,
                    ms=1e3 * seconds,
                    ratio_to_sequential=timings.get("xla-sequential", float("nan")) / seconds,
                    ratio_to_associative=timings.get("xla-associative", float("nan")) / seconds,
                )
            )
    return rows


def _decode_step(fn, args, options, platform, h):
    """One token through `fn` on `platform` from state `h`: `(y, next h)`."""
    return fn(*args, None, h, platform=platform, **options)[:2]


def _stepped(step, h):
    """A zero-argument call running `DECODE_STEPS` of `step(h) -> (..., next h)`, each on the state the
    last one returned."""
    steps = lambda h: lax.fori_loop(1, DECODE_STEPS, lambda _, out: step(lax.optimization_barrier(out[-1])), step(h))
    return functools.partial(jax.jit(steps), h)


def bench_decode(batch: int, v1_shape, v2_shape, repeats: int) -> list[dict]:
    """One token continuing a float32 state: bandwidth over the state bytes read and written."""
    rows = []
    cases = {
        "state_space_v1": (state_space_v1, v1_inputs(batch, 1, v1_shape["channels"], v1_shape["state"]), {}),
        "state_space_v2": (
            state_space_v2,
            v2_inputs(batch, 1, *(v2_shape[k] for k in ("heads", "head_dim", "state", "groups"))),
            {"n_groups": v2_shape["groups"]},
        ),
    }
    for op, (fn, args, options) in cases.items():
        state_shape = (
            (batch, *args[1].shape) if op == "state_space_v1" else (batch, *args[0].shape[2:], args[2].shape[-1])
        )
        h = _normal(20, state_shape, jnp.float32)
        state_bytes = 2 * h.size * h.dtype.itemsize
        builders = {"copy": lambda h=h: _stepped(lambda a: (a + 1,), h)}
        for platform in _platforms(op):
            step = functools.partial(_decode_step, fn, args, options, platform)
            builders[platform] = lambda step=step, h=h: _stepped(step, h)
        timed = time_variants(builders, repeats=repeats, where=f"{op} decode")
        timings = {name: seconds / DECODE_STEPS for name, seconds in timed.items()}
        copy_bandwidth = state_bytes / timings["copy"]
        for name, seconds in timings.items():
            bandwidth = state_bytes / seconds
            rows.append(
                dict(
                    op=f"{op[-2:]} decode",
                    mode=f"batch {batch}",
                    variant=name,
                    ms=1e3 * seconds,
                    TBps=bandwidth / 1e12,
                    ratio_to_copy=bandwidth / copy_bandwidth,
                )
            )
    return rows


def main(argv=None) -> None:
    args = parser(__doc__).parse_args(argv)
    v2_shape, v1_shape = (QUICK_V2, QUICK_V1) if args.quick else (V2_SHAPE, V1_SHAPE)
    unoptimized = jax.config.values["jax_disable_most_optimizations"]
    # A quick run is a smoke test whose time is all compiles: skip XLA's optimisations for it.
    jax.config.update("jax_disable_most_optimizations", args.quick or unoptimized)
    try:
        rows = bench_v2(v2_shape, args.repeats) + bench_v1(v1_shape, args.repeats)
        rows += bench_decode(QUICK_DECODE_BATCH if args.quick else DECODE_BATCH, v1_shape, v2_shape, args.repeats)
    finally:
        jax.config.update("jax_disable_most_optimizations", unoptimized)
    print_table(
        rows,
        [
            "op",
            "mode",
            "variant",
            "ms",
            "TFLOPs",
            "ratio_to_xla",
            "anchor_ms",
            "ratio_to_sequential",
            "ratio_to_associative",
            "TBps",
            "ratio_to_copy",
        ],
    )

    def plot(ax, rows):
        labels = [f"{r['op']} {r['mode']}\n{r['variant']}" for r in rows]
        ax.barh(range(len(rows)), [r["ms"] for r in rows])
        ax.set_yticks(range(len(rows)), labels, fontsize=6)
        ax.set_xscale("log")
        ax.set_xlabel("ms (log)")

    meta = {"dtype": "bfloat16", "v2_shape": v2_shape, "v1_shape": v1_shape}
    path = write_results(args.out, "state_space", rows, meta, plot)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
