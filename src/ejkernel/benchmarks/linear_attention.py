"""Linear attention: forward+backward time of GLA and the gated delta rule, beside the alternatives, in one run;
then the serving op `ragged_gated_delta_rule` (`--part serving` runs that alone).

Training: at B=2, S=16384, H=16, Dk=Dv=128 (bf16) each op runs on every platform that serves it here, beside
its XLA recurrent form (token by token, the baseline a JAX user writes first) and our causal flash attention
at the same shape. Rows give milliseconds per forward+backward step and the ratios the issue's targets
are stated in: to flash attention, to the recurrent form, and (gated delta rule) to our GLA on the same
platform.

Serving (`ragged_gated_delta_rule`, forward, each platform and auto, the float32 state pool donated and fed
back as a serving loop does): a decode step of 256 requests, H=32, Dk=Dv=128, bf16 tokens, in achieved
bandwidth (state read + written, q, k, v, beta, decay read, out written) beside the device copy of 2 GiB
timed in the same run (`ratio_to_copy`), called with request bounds and as a decode batch (no
`query_start_loc`: "decode batch" rows; once more on a bf16 pool, as serving engines often keep it); and a
prefill of 8 requests of 2048 tokens beside `gated_delta_rule` on the same tokens as a batch of 8 (initial and
final states, Triton and XLA), `vs_gated_delta_rule` the ratio of times to it on the same platform; and a mixed
batch as a serving engine's step with chunked prefill holds one: 60 decode tokens and 4 prefill chunks of 512.
"""

import functools

import jax
import jax.numpy as jnp

from ejkernel.benchmarks._harness import copy_bandwidth, parser, print_table, time_variants, write_results
from ejkernel.kernels._common.linear_attention.driver import linear_attention
from ejkernel.modules import (
    GatedDeltaRuleConfig,
    flash_attention,
    gated_delta_rule,
    gla_attention,
    ragged_gated_delta_rule,
)
from ejkernel.registry import kernel_registry

OPS = ("gla_attention", "gated_delta_rule", "ragged_gated_delta_rule")
"""The ops this benchmark times (`ejkernel bench <op>` runs it)."""

SHAPE = (2, 16384, 16, 128)  # B, S, H, D (Dk = Dv = D)
QUICK_SHAPE = (1, 128, 2, 32)
DECODE = (256, 32, 128)  # requests, H, D
PREFILL = (8, 2048, 32, 128)  # requests, tokens each, H, D
MIXED = (60, 4, 512)  # requests of one token, requests of a chunk, the chunk's tokens (H and D as DECODE's)
QUICK_DECODE, QUICK_PREFILL, QUICK_MIXED = (4, 2, 32), (2, 64, 2, 32), (3, 1, 16)


def _inputs(batch, seq, heads, dim):
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 8))
    x = lambda *shape: jax.random.normal(next(keys), shape, jnp.float32)
    q, k, v = (x(batch, seq, heads, dim).astype(jnp.bfloat16) for _ in range(3))
    return dict(
        q=q,
        k=k,
        v=v,
        g=-0.05 * jax.nn.softplus(x(batch, seq, heads, dim)),
        beta=jax.nn.sigmoid(x(batch, seq, heads)),
        decay=-0.05 * jax.nn.softplus(x(batch, seq, heads)),
    )


def _gla(platform):
    return lambda q, k, v, g: gla_attention(q, k, v, g, platform=platform)


def _gdr(platform, **options):
    return lambda q, k, v, beta, decay: gated_delta_rule(q, k, v, beta, decay, platform=platform, **options)


def _gla_recurrent(q, k, v, g):
    return linear_attention(q, k, v, scale=q.shape[-1] ** -0.5, gk=g, recurrent=True)[0]


def _training_step(fn, args):
    """A zero-argument jitted forward+backward of `fn` (gradients of every float input)."""
    loss = lambda *a: jnp.sum(fn(*a).astype(jnp.float32))
    step = jax.jit(jax.grad(loss, argnums=tuple(range(len(args)))))
    return functools.partial(step, *args)


def _serving_loop(fn, tokens, pool):
    """A zero-argument call of `fn(q, k, v, beta, decay, pool, qsl, slots)` under `jit` with the pool donated and
    fed back (as a serving loop runs the op); returns the outputs."""
    step = jax.jit(lambda pool, *rest: fn(*rest[:5], pool, *rest[5:]), donate_argnums=0)
    state = {"pool": jnp.copy(pool)}

    def call():
        out, state["pool"] = step(state["pool"], *tokens)
        return out

    return call


def _ragged(platform):
    return functools.partial(ragged_gated_delta_rule, platform=platform)


def _dense_call(platform, dense, initial_state, chunk_size=None):
    """`gated_delta_rule` of the same tokens as a batch, from and to states: a zero-argument call."""
    cfg = None if chunk_size is None else GatedDeltaRuleConfig(platform=platform, chunk_size=chunk_size)
    run = jax.jit(functools.partial(gated_delta_rule, return_state=True, platform=platform, cfg=cfg))
    return functools.partial(run, *dense, None, initial_state)


def decode_case(quick: bool = False):
    """The decode step's inputs (`DECODE`): `(q, k, v, beta, decay)` of one token a request, each request's slot
    (distinct, spread over a pool of twice the requests) and that float32 pool."""
    requests, heads, dim = QUICK_DECODE if quick else DECODE
    d = _inputs(1, requests, heads, dim)
    inputs = tuple(d[n][0] for n in ("q", "k", "v", "beta", "decay"))
    slots = jax.random.permutation(jax.random.PRNGKey(1), 2 * requests)[:requests].astype(jnp.int32)
    pool = jax.random.normal(jax.random.PRNGKey(2), (2 * requests, heads, dim, dim), jnp.float32)
    return inputs, slots, pool


def decode_bytes(pool_dtype, quick: bool = False) -> int:
    """The bytes a decode step moves: state read + written, q, k, v read and out written (bf16), beta and decay."""
    requests, heads, dim = QUICK_DECODE if quick else DECODE
    state = 2 * requests * heads * dim * dim * jnp.dtype(pool_dtype).itemsize
    return state + 4 * requests * heads * dim * 2 + 2 * requests * heads * 4


def _serving_rows(quick: bool, repeats: int) -> list[dict]:
    """The decode step's bandwidth beside a device copy, and the ragged prefill beside the dense gated delta rule."""
    copy_bw = copy_bandwidth(quick=quick, repeats=repeats)
    platforms = ["auto", *(i.platform.value for i in kernel_registry.candidates("ragged_gated_delta_rule"))]
    rows = []

    requests, heads, dim = QUICK_DECODE if quick else DECODE
    inputs, slots, pool = decode_case(quick)
    calls = {  # tokens and pool of each case
        "decode": ((*inputs, jnp.arange(requests + 1, dtype=jnp.int32), slots), pool),
        "decode batch": ((*inputs, None, slots), pool),
        "decode batch, bf16 pool": ((*inputs, None, slots), pool.astype(jnp.bfloat16)),
    }
    builders = {
        (kind, p): functools.partial(_serving_loop, _ragged(p), tokens, pool)
        for kind, (tokens, pool) in calls.items()
        for p in platforms
    }
    timings = time_variants(builders, repeats=repeats, where=f"decode N={requests} H={heads} D={dim}")
    for (kind, platform), seconds in timings.items():
        nbytes = decode_bytes(calls[kind][1].dtype, quick)
        row = dict(op="ragged_gated_delta_rule", case=f"{kind} {requests}x1 H={heads} D={dim}", platform=platform)
        row |= dict(ms=1e3 * seconds, TBps=nbytes / seconds / 1e12, ratio_to_copy=nbytes / seconds / copy_bw)
        rows.append(row)

    requests, length, heads, dim = QUICK_PREFILL if quick else PREFILL
    d = _inputs(requests, length, heads, dim)
    dense = tuple(d[n] for n in ("q", "k", "v", "beta", "decay"))
    flat = tuple(x.reshape(requests * length, *x.shape[2:]) for x in dense)
    bounds = jnp.arange(0, requests * length + 1, length, dtype=jnp.int32)
    pool = jax.random.normal(jax.random.PRNGKey(3), (requests, heads, dim, dim), jnp.float32)
    requests_of = (*flat, bounds, bounds[:-1] // length)  # request r on slot r
    builders = {f"ragged {p}": functools.partial(_serving_loop, _ragged(p), requests_of, pool) for p in platforms}
    if "triton" in platforms:  # upstream's (and EasyDeL's) default chunk beside Triton's own (32)
        ragged = functools.partial(ragged_gated_delta_rule, platform="triton", chunk_size=64)
        builders["ragged triton-chunk64"] = functools.partial(_serving_loop, ragged, requests_of, pool)
        builders["dense triton-chunk64"] = functools.partial(_dense_call, "triton", dense, pool, 64)
    for platform in ("triton", "xla"):
        builders[f"dense {platform}"] = functools.partial(_dense_call, platform, dense, pool)
    timings = time_variants(builders, repeats=repeats, where=f"prefill {requests}x{length} H={heads} D={dim}")
    for name, seconds in timings.items():
        kind, platform = name.split()
        op = "ragged_gated_delta_rule" if kind == "ragged" else "gated_delta_rule"
        row = dict(op=op, case=f"prefill {requests}x{length} H={heads} D={dim}", platform=platform, ms=1e3 * seconds)
        base = timings.get(f"dense {'triton' if platform == 'auto' else platform.split('-')[0]}")
        row["vs_gated_delta_rule"] = seconds / base if base else None
        rows.append(row)
    rows += _mixed_rows(quick, repeats, platforms)
    return rows


def _mixed_rows(quick: bool, repeats: int, platforms) -> list[dict]:
    """A mixed batch (`MIXED`): one-token requests, then prefill chunks, each request on a slot of its own."""
    singles, chunks, length = QUICK_MIXED if quick else MIXED
    _, heads, dim = QUICK_DECODE if quick else DECODE
    lengths = [1] * singles + [length] * chunks
    d = _inputs(1, sum(lengths), heads, dim)
    tokens = tuple(d[n][0] for n in ("q", "k", "v", "beta", "decay"))
    bounds = jnp.cumsum(jnp.asarray([0, *lengths], jnp.int32))
    slots = jnp.arange(len(lengths), dtype=jnp.int32)
    pool = jax.random.normal(jax.random.PRNGKey(4), (len(lengths), heads, dim, dim), jnp.float32)
    builders = {p: functools.partial(_serving_loop, _ragged(p), (*tokens, bounds, slots), pool) for p in platforms}
    case = f"mixed {singles}x1 + {chunks}x{length} H={heads} D={dim}"
    timings = time_variants(builders, repeats=repeats, where=case)
    return [dict(op="ragged_gated_delta_rule", case=case, platform=p, ms=1e3 * t) for p, t in timings.items()]


def main(argv=None) -> None:
    p = parser(__doc__)
    p.add_argument("--part", choices=("all", "training", "serving"), default="all", help="which rows to time")
    args = p.parse_args(argv)
    serving = _serving_rows(args.quick, args.repeats) if args.part != "training" else []
    if args.part == "serving":
        columns = ["op", "case", "platform", "ms", "TBps", "ratio_to_copy", "vs_gated_delta_rule"]
        print_table(serving, columns)
        meta = {"dtype": "bfloat16 tokens, float32 state pool", "step": "forward (serving)"}
        print(f"wrote {write_results(args.out, 'linear_attention_serving', serving, meta, _plot_serving)}")
        return
    batch, seq, heads, dim = QUICK_SHAPE if args.quick else SHAPE
    x = _inputs(batch, seq, heads, dim)
    gla_args, gdr_args = (x["q"], x["k"], x["v"], x["g"]), (x["q"], x["k"], x["v"], x["beta"], x["decay"])
    platforms = {op: [i.platform.value for i in kernel_registry.candidates(op)] for op in ("gla", "gated_delta_rule")}
    variants = {
        "flash_attention_causal auto": (lambda q, k, v: flash_attention(q, k, v, causal=True), gla_args[:3]),
        "gla xla-recurrent": (_gla_recurrent, gla_args),
        "gated_delta_rule xla-recurrent": (_gdr("xla", use_chunked=False), gdr_args),
    }
    for platform in ["auto", *platforms["gla"]]:
        variants[f"gla {platform}"] = (_gla(platform), gla_args)
    for platform in ["auto", *platforms["gated_delta_rule"]]:
        variants[f"gated_delta_rule {platform}"] = (_gdr(platform), gdr_args)
    builders = {name: functools.partial(_training_step, fn, a) for name, (fn, a) in variants.items()}
    timings = time_variants(builders, repeats=args.repeats, where=f"B={batch} S={seq} H={heads} D={dim}")

    rows = []
    for name, seconds in timings.items():
        op, platform = name.rsplit(" ", 1)
        row = dict(op=op, platform=platform, ms=1e3 * seconds)
        row["vs_flash"] = seconds / timings.get("flash_attention_causal auto", float("nan"))
        if op != "flash_attention_causal":
            row["recurrent_over_this"] = timings.get(f"{op} xla-recurrent", float("nan")) / seconds
        if op == "gated_delta_rule" and f"gla {platform}" in timings:
            row["vs_gla"] = seconds / timings[f"gla {platform}"]
        rows.append(row)
    print_table(rows, ["op", "platform", "ms", "vs_flash", "recurrent_over_this", "vs_gla"])
    if serving:
        print_table(serving, ["op", "case", "platform", "ms", "TBps", "ratio_to_copy", "vs_gated_delta_rule"])

    def plot(ax, rows):
        rows = [r for r in rows if "case" not in r]  # the training rows (serving ones in their own plot)
        labels = [f"{r['op']}\n{r['platform']}" for r in rows]
        ax.bar(labels, [r["ms"] for r in rows])
        ax.set_ylabel("ms per forward+backward")
        ax.tick_params(axis="x", labelsize=7)

    meta = {"dtype": "bfloat16", "shape": dict(B=batch, S=seq, H=heads, Dk=dim, Dv=dim), "step": "forward+backward"}
    path = write_results(args.out, "linear_attention", rows + serving, meta, plot)
    print(f"wrote {path}")


def _plot_serving(ax, rows):
    labels = [f"{r['op'].replace('_', ' ')}\n{r['case'].split()[0]} {r['platform']}" for r in rows]
    ax.bar(labels, [r["ms"] for r in rows])
    ax.set_ylabel("ms per call")
    ax.tick_params(axis="x", labelsize=6)


if __name__ == "__main__":
    main()
