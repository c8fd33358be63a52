"""Sharded ops on every visible device against the same op on one device: the speed-up of the split.

Each case splits the axis a model splits (bf16): paged decode with its heads split (tensor parallel),
grouped matmul with its experts split (expert parallel, the tokens already dispatched to their experts'
device, and the variant that keeps every token on every device and sums the halves), GLA and flash
attention with their heads split. Inputs are placed as the specs say before timing, so a row times the
computation and the collectives the split needs, not the placement. Ring attention (the sequence split)
has its own benchmark, `ejkernel bench ring_attention`. `--quick` uses tiny shapes (a CPU smoke run).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ejkernel.benchmarks._harness import parser, print_table, time_variants, write_results
from ejkernel.benchmarks.grouped_matmul import random_group_sizes
from ejkernel.modules import flash_attention, gla_attention, grouped_matmul, page_attention

OPS = ()
"""No op of its own: `ejkernel bench multi_gpu` runs it."""

FULL = dict(decode=(64, 32768, 32, 8, 128, 16), moe=(32768, 4096, 1536, 64), gla=(2, 16384, 16, 128), flash=(2, 8192))
QUICK = dict(decode=(4, 64, 4, 2, 32, 16), moe=(256, 64, 32, 8), gla=(1, 128, 2, 32), flash=(1, 128))


class Case:
    """One op called on one device and split over the mesh: `(one, split)` functions of `inputs`."""

    def __init__(self, name, one, split, inputs, specs, argnums=(), work=None):
        self.name, self.one, self.split, self.inputs, self.specs = name, one, split, inputs, specs
        self.argnums = argnums  # the differentiated inputs (none: forward only)
        self.work = work  # bytes or FLOPs of the forward, with its unit, for the rate column

    def step(self, fn, inputs, backward):
        if not backward:
            return functools.partial(jax.jit(fn), *inputs)
        loss = lambda *a: jnp.sum(fn(*a).astype(jnp.float32))
        return functools.partial(jax.jit(jax.grad(loss, argnums=self.argnums)), *inputs)


def _normal(key, shape):
    return jax.random.normal(key, shape, jnp.bfloat16)


def _cases(mesh, sizes) -> list[Case]:
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 16))
    n = mesh.size
    shard = lambda fn, in_specs, out_specs: jax.shard_map(
        fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False
    )
    cases = []

    batch, context, heads, kv_heads, dim, page = sizes["decode"]
    pages = batch * context // page
    tables = jnp.asarray(np.random.default_rng(0).permutation(pages).reshape(batch, -1), jnp.int32)
    cache = lambda: _normal(next(keys), (pages, kv_heads, page, dim))
    decode = [
        _normal(next(keys), (batch, heads, dim)),
        cache(),
        cache(),
        jnp.full((batch,), context, jnp.int32),
        tables,
    ]
    h = P(None, "x")
    cases.append(
        Case(
            f"page_attention decode B={batch} ctx={context} heads split",
            page_attention,
            shard(page_attention, (h, h, h, P(), P()), h),
            decode,
            (h, h, h, P(), P()),
            work=(2 * pages * page * kv_heads * dim * 2, "TB/s"),
        )
    )

    m, k, n_out, groups = sizes["moe"]
    per_shard = random_group_sizes(m // n, groups // n)  # every device gets m / n tokens of its experts
    group_sizes = jnp.concatenate([jnp.roll(per_shard, i) for i in range(n)])
    lhs, rhs = _normal(next(keys), (m, k)), _normal(next(keys), (groups, k, n_out))
    one = lambda lhs, rhs, sizes: grouped_matmul(lhs, rhs, sizes, preferred_element_type=jnp.bfloat16)
    flops = (2 * m * k * n_out, "TFLOP/s")
    x = P("x")
    cases.append(
        Case(f"grouped_matmul M={m} K={k} N={n_out} G={groups} experts split, tokens dispatched",
             one, shard(one, (x, x, x), x), [lhs, rhs, group_sizes], (x, x, x), (0, 1), flops)
    )  # fmt: skip
    offsets = jnp.arange(0, groups, groups // n, dtype=jnp.int32)
    replicated = lambda lhs, rhs, sizes, offsets: grouped_matmul(
        lhs, rhs, sizes, offsets[0], preferred_element_type=jnp.bfloat16
    )
    summed = shard(lambda *a: jax.lax.psum(replicated(*a), "x"), (P(), x, P(), x), P())
    cases.append(
        Case(f"grouped_matmul M={m} K={k} N={n_out} G={groups} experts split, tokens everywhere + psum",
             lambda lhs, rhs, sizes, offsets: one(lhs, rhs, sizes), summed, [lhs, rhs, group_sizes, offsets],
             (P(), x, P(), x), (0, 1), flops)
    )  # fmt: skip

    batch, seq, heads, dim = sizes["gla"]
    qkv = [_normal(next(keys), (batch, seq, heads, dim)) for _ in range(3)]
    g = -0.05 * jax.nn.softplus(jax.random.normal(next(keys), (batch, seq, heads, dim), jnp.float32))
    hs = P(None, None, "x")
    cases.append(
        Case(f"gla_attention B={batch} S={seq} H={heads} D={dim} heads split", gla_attention,
             shard(gla_attention, (hs,) * 4, hs), [*qkv, g], (hs,) * 4, (0, 1, 2, 3))
    )  # fmt: skip

    batch, seq = sizes["flash"]
    qkv = [_normal(next(keys), (batch, seq, heads, dim)) for _ in range(3)]
    causal = functools.partial(flash_attention, causal=True)
    cases.append(
        Case(f"flash_attention B={batch} S={seq} H={heads} D={dim} causal heads split", causal,
             functools.partial(causal, mesh=mesh, in_specs=(hs,) * 3, out_specs=hs), qkv, (hs,) * 3, (0, 1, 2),
             (2 * batch * heads * seq * seq * dim, "TFLOP/s"))
    )  # fmt: skip
    return cases


def main(argv=None) -> None:
    p = parser(__doc__)
    p.add_argument("--devices", type=int, help="how many of the visible devices to split over (default: all)")
    args = p.parse_args(argv)
    devices = jax.devices()[: args.devices]
    mesh = jax.make_mesh((len(devices),), ("x",), axis_types=(jax.sharding.AxisType.Auto,), devices=devices)
    n = mesh.size
    rows = []
    for case in _cases(mesh, QUICK if args.quick else FULL):
        single = [jax.device_put(a, devices[0]) for a in case.inputs]
        split = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(case.inputs, case.specs, strict=True)]
        for backward in (False, True) if case.argnums else (False,):
            mode = "fwd+bwd" if backward else "fwd"
            timings = time_variants(
                {
                    "x1": functools.partial(case.step, case.one, single, backward),
                    f"x{n}": functools.partial(case.step, case.split, split, backward),
                },
                repeats=args.repeats,
                where=f"{case.name} {mode}",
            )
            row = dict(case=case.name, mode=mode, devices=n)
            row.update({f"ms {name}": 1e3 * seconds for name, seconds in timings.items()})
            if len(timings) == 2:
                row["speed-up"] = timings["x1"] / timings[f"x{n}"]
            if case.work and not backward and f"x{n}" in timings:
                amount, unit = case.work
                row[f"x{n} {unit}"] = amount / timings[f"x{n}"] / 1e12
            rows.append(row)
    print(f"{n} x {devices[0].device_kind}; speed-up = time on one device / time split over {n}")
    columns = list(dict.fromkeys(key for row in rows for key in row))
    print_table(rows, columns)

    def plot(ax, rows):
        labels = [f"{row['case'].split()[0]} {row['mode']}" for row in rows]
        ax.bar(range(len(rows)), [row.get("speed-up") or 0 for row in rows])
        ax.axhline(n, color="gray", lw=0.8, ls="--")
        ax.set_xticks(range(len(rows)), labels, rotation=30, ha="right", fontsize=7)
        ax.set_ylabel(f"speed-up over one device ({n} devices)")

    path = write_results(args.out, "multi_gpu", rows, {"dtype": "bfloat16", "devices": n}, plot)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
