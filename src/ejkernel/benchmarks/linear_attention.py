"""Linear attention: forward+backward time of GLA and the gated delta rule, beside the alternatives, in one run.

At B=2, S=16384, H=16, Dk=Dv=128 (bf16) each op runs on every platform that serves it here, beside its
XLA recurrent form (token by token, the baseline a JAX user writes first) and our causal flash attention
at the same shape. Rows give milliseconds per forward+backward step and the ratios the issue's targets
are stated in: to flash attention, to the recurrent form, and (gated delta rule) to our GLA on the same
platform.
"""

import functools

import jax
import jax.numpy as jnp

from ejkernel.benchmarks._harness import parser, print_table, time_variants, write_results
from ejkernel.kernels._common.linear_attention.driver import linear_attention
from ejkernel.modules import flash_attention, gated_delta_rule, gla_attention
from ejkernel.registry import kernel_registry

OPS = ("gla_attention", "gated_delta_rule")
"""The ops this benchmark times (`ejkernel bench <op>` runs it)."""

SHAPE = (2, 16384, 16, 128)  # B, S, H, D (Dk = Dv = D)
QUICK_SHAPE = (1, 128, 2, 32)


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


def main(argv=None) -> None:
    args = parser(__doc__).parse_args(argv)
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

    def plot(ax, rows):
        labels = [f"{r['op']}\n{r['platform']}" for r in rows]
        ax.bar(labels, [r["ms"] for r in rows])
        ax.set_ylabel("ms per forward+backward")
        ax.tick_params(axis="x", labelsize=7)

    meta = {"dtype": "bfloat16", "shape": dict(B=batch, S=seq, H=heads, Dk=dim, Dv=dim), "step": "forward+backward"}
    path = write_results(args.out, "linear_attention", rows, meta, plot)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
