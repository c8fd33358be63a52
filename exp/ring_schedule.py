"""Where XLA schedules ring attention's transfers among its kernels (issue 46's profile question).

Compiles the bench's ring call (causal, S=65536, H=16, D=128, bf16, sequence split over every GPU), forward
and forward+backward, and prints the entry computation's schedule: each attention kernel, conditional and
collective (start/done) in program order, with how many other instructions lie between. A
`collective-permute-start` whose `-done` follows with kernels in between overlaps them; a synchronous
`collective-permute` or a start/done pair with nothing between is an exposed transfer.

    XLA_FLAGS=... python exp/ring_schedule.py [--kv-heads 4] > schedule.txt
"""

import argparse
import re

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ejkernel.modules import ring_attention

MARKS = ("collective-permute", "custom-call", "conditional", "all-reduce", "send", "recv", "while")


def schedule(text: str) -> list[str]:
    """The entry computation's notable instructions in order, with counts of the others between."""
    entry = text[text.index("\nENTRY ") :]
    entry = entry[: entry.index("\n}\n")]
    lines, others = [], 0
    for line in entry.splitlines()[1:]:
        # The opcode: the first lower-case word right before "(" after the "=" (shapes, tuples too, have none).
        match = re.search(r"\s([a-z][\w-]*)\(", line.partition("=")[2])
        if not match:
            continue
        op = match.group(1)
        if any(op.startswith(m) for m in MARKS):
            target = re.search(r'custom_call_target="([^"]+)"', line)
            if others:
                lines.append(f"    ... {others} other")
                others = 0
            lines.append(f"{op}{' ' + target.group(1) if target else ''}  {line.split('=')[0].strip()}")
        else:
            others += 1
    return lines


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--kv-heads", type=int, default=16)
    p.add_argument("--seq", type=int, default=65536)
    args = p.parse_args()
    devices = jax.devices()
    mesh = jax.make_mesh((len(devices),), ("sp",), axis_types=(jax.sharding.AxisType.Auto,), devices=devices)
    spec = P(None, "sp")
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    shapes = [(1, args.seq, 16, 128)] + [(1, args.seq, args.kv_heads, 128)] * 2
    qkv = [
        jax.device_put(jax.random.normal(k, s, jnp.bfloat16), NamedSharding(mesh, spec))
        for k, s in zip(keys, shapes, strict=True)
    ]
    ring = lambda q, k, v: ring_attention(q, k, v, causal=True, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec)
    grad = jax.grad(lambda *a: jnp.sum(ring(*a).astype(jnp.float32)), argnums=(0, 1, 2))
    for name, fn in (("forward", ring), ("forward+backward", grad)):
        text = jax.jit(fn).lower(*qkv).compile().as_text()
        print(f"==== {name}, kv heads {args.kv_heads}, {len(devices)} devices")
        print("\n".join(schedule(text)))


if __name__ == "__main__":
    main()
