"""`ejkernel demo`: every op on the default device, each platform that runs here, against its reference."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ejkernel.benchmarks._harness import print_table, time_fn


@dataclasses.dataclass(frozen=True)
class DemoCase:
    op: str
    make_inputs: Callable[[jax.Array], tuple[tuple, dict]]  # key -> (positional tensors, options)
    reference: Callable[..., Any]
    output: Callable[[Any], jax.Array] = lambda result: result  # the array compared with the reference
    takes_platform: bool = True  # `attention` has no platform argument (API.md)


def _attention_inputs(key, **options):
    kq, kk, kv = jax.random.split(key, 3)
    shape = (2, 1024, 8, 64)  # divisible by 2 x 8 devices: the causal ring splits it into 16 chunks
    q = jax.random.normal(kq, shape, jnp.bfloat16)
    k, v = (jax.random.normal(x, (*shape[:2], 2, 64), jnp.bfloat16) for x in (kk, kv))
    return (q, k, v), options


def _cases() -> list[DemoCase]:
    from ejkernel.reference.flash_attention import flash_attention_reference
    from ejkernel.reference.mean_pooling import mean_pooling_reference

    attention_reference = functools.partial(flash_attention_reference, softmax_scale=64**-0.5, causal=True)
    mesh = jax.make_mesh((len(jax.devices()),), ("sp",))
    seq_sharded = jax.sharding.PartitionSpec(None, "sp")
    ring_options = dict(causal=True, axis_name="sp", mesh=mesh, in_specs=(seq_sharded,) * 3, out_specs=seq_sharded)
    return [
        DemoCase("flash_attention", functools.partial(_attention_inputs, causal=True), attention_reference),
        DemoCase(
            "scaled_dot_product_attention", functools.partial(_attention_inputs, causal=True), attention_reference
        ),
        DemoCase(
            "attention",
            functools.partial(_attention_inputs, causal=True),
            attention_reference,
            output=lambda result: result[0],
            takes_platform=False,
        ),
        DemoCase("ring_attention", functools.partial(_attention_inputs, **ring_options), attention_reference),
        DemoCase(
            "mean_pooling",
            lambda key: ((jax.random.normal(key, (8, 1000, 256), jnp.bfloat16),), {}),
            mean_pooling_reference,
        ),
    ]


def run_demo() -> int:
    import ejkernel.modules as modules
    from ejkernel import kernel_registry

    print(f"device: {jax.devices()[0].device_kind} ({jax.default_backend()})")
    rows, failures = [], 0
    for index, case in enumerate(_cases()):
        args, options = case.make_inputs(jax.random.PRNGKey(index))
        expected = np.asarray(case.reference(*args), np.float64)
        platforms = ["auto"] + [i.platform.value for i in kernel_registry.candidates(case.op)]
        op = getattr(modules, case.op)
        for platform in platforms if case.takes_platform else ["auto"]:
            if case.takes_platform:
                options = {**options, "platform": platform}
            fn = jax.jit(lambda *a, op=op, o=options, pick=case.output: pick(op(*a, **o)))
            out = np.asarray(jnp.asarray(fn(*args), jnp.float32), np.float64)
            error = float(np.linalg.norm(out - expected) / max(np.linalg.norm(expected), 1e-30))
            ok = bool(np.isfinite(out).all()) and error < 2e-2
            failures += not ok
            seconds = time_fn(lambda f=fn, a=args: f(*a), repeats=5)
            rows.append(
                dict(op=case.op, platform=platform, rel_error=error, ms=1e3 * seconds, ok="yes" if ok else "NO")
            )
    print_table(rows, ["op", "platform", "rel_error", "ms", "ok"])
    return 1 if failures else 0
