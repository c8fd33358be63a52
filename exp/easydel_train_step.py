"""GPU experiment: one EasyDeL 0.3.0 Llama training step (forward, backward, AdamW update) on this package,
with `attn_mechanism="flash_attn2"` (our flash attention) beside EasyDeL's vanilla mechanism (our `attention`,
dense softmax), timed in one run; the ejkernel implementations each step reached are listed (from the
`ejkernel.dispatch` log).

Run on an H100/H200 from the repository root, with EasyDeL's wheels carried in `.whl-easydel` (see BENCHMARKS.md):

    PYTHONPATH=$PWD/src python3 exp/easydel_train_step.py [--layers 8] [--seq 4096] [--batch 4] [--steps 10]

`ray` and `wandb` are imported by EasyDeL at import time only; their wheels (about 90 MB) cannot travel
to the device machine, so they are placeholder modules here (no step uses them). The two workarounds of
the integration suite (`tests/integration/easydel_shims.py`) apply too.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import logging
import os
import statistics
import sys
import time
import types

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "integration"))


class _Placeholder(types.ModuleType):
    """A module whose every attribute is another placeholder (decorators pass their function through)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _Placeholder(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value

    def __call__(self, *args, **kwargs):
        return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else _Placeholder(f"{self.__name__}()")

    def __mro_entries__(self, bases):
        return (object,)

    def __or__(self, other):
        return self

    __ror__ = __or__

    def __getitem__(self, key):
        return self


class _PlaceholderFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    NAMES = ("ray", "wandb")

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.NAMES:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Placeholder(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _PlaceholderFinder())
os.environ.setdefault("ENABLE_DISTRIBUTED_INIT", "0")  # EasyDeL's switch: the lent machine looks like a cluster

import easydel_shims  # noqa: E402

easydel_shims.apply()

import easydel as ed  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402


def build(args, mechanism: str):
    config = ed.LlamaConfig(
        vocab_size=32000, hidden_size=args.hidden, intermediate_size=args.hidden * 11 // 4,
        num_hidden_layers=args.layers, num_attention_heads=args.hidden // 128, num_key_value_heads=args.hidden // 256,
        max_position_embeddings=args.seq,
    )  # fmt: skip
    config.add_basic_configurations(attn_mechanism=mechanism, attn_dtype=jnp.bfloat16)
    return ed.LlamaForCausalLM(config=config, dtype=jnp.bfloat16, param_dtype=jnp.float32, rngs=nnx.Rngs(0))


def train_step_fn(model):
    """`step(params, opt_state, ids) -> (params, opt_state, loss)`: next-token cross entropy, AdamW."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    optimizer = optax.adamw(1e-4)

    def loss_fn(params, ids):
        logits = nnx.merge(graphdef, params, rest)(input_ids=ids[:, :-1]).logits.astype(jnp.float32)
        return optax.softmax_cross_entropy_with_integer_labels(logits, ids[:, 1:]).mean()

    @jax.jit
    def step(params, opt_state, ids):
        loss, grads = jax.value_and_grad(loss_fn)(params, ids)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, grads

    return step, params, optimizer.init(params)


class _Reached(logging.Handler):
    """The `ejkernel.dispatch` lines (one per implementation run, at trace time) while attached."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if " serves the call" in message:
            self.lines.append(message.split(" (")[0])


def run(args, mechanism: str, ids):
    model = build(args, mechanism)
    step, params, opt_state = train_step_fn(model)
    reached, dispatch = _Reached(), logging.getLogger("ejkernel.dispatch")
    dispatch.addHandler(reached)
    dispatch.setLevel(logging.DEBUG)
    with model.mesh:
        start = time.perf_counter()
        compiled = step.lower(params, opt_state, ids).compile()
        compile_s = time.perf_counter() - start
        dispatch.removeHandler(reached)
        first = compiled(params, opt_state, ids)
        jax.block_until_ready(first)
        times = []
        state = (params, opt_state)
        for _ in range(args.steps):
            start = time.perf_counter()
            new_params, new_opt, loss, _ = compiled(*state, ids)
            jax.block_until_ready(loss)
            times.append(time.perf_counter() - start)
            state = (new_params, new_opt)
    grads = np.concatenate([np.asarray(g, np.float32).ravel() for g in jax.tree_util.tree_leaves(first[3])])
    return dict(
        loss=float(first[2]), grads=grads, median_ms=1e3 * statistics.median(times), compile_s=compile_s,
        implementations=sorted(set(reached.lines)),
    )  # fmt: skip


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    print("device:", jax.devices()[0].device_kind, "jax", jax.__version__, "easydel", ed.__version__, flush=True)
    ids = jax.random.randint(jax.random.PRNGKey(0), (args.batch, args.seq + 1), 0, 32000)
    results = {}
    for mechanism in ("flash_attn2", "vanilla"):
        results[mechanism] = run(args, mechanism, ids)
        r = results[mechanism]
        print(f"{mechanism}: loss {r['loss']:.5f}  step {r['median_ms']:.1f} ms (median of {args.steps})"
              f"  compile {r['compile_s']:.1f} s  implementations {r['implementations']}", flush=True)  # fmt: skip
    flash, vanilla = results["flash_attn2"], results["vanilla"]
    grad_rel = np.linalg.norm(flash["grads"] - vanilla["grads"]) / np.linalg.norm(vanilla["grads"])
    print(f"\nLlama {args.layers} layers, hidden {args.hidden}, batch {args.batch} x seq {args.seq}, bf16:")
    print(f"  flash_attn2 {flash['median_ms']:.1f} ms/step, vanilla {vanilla['median_ms']:.1f} ms/step: "
          f"{vanilla['median_ms'] / flash['median_ms']:.2f}x; loss {flash['loss']:.5f} vs {vanilla['loss']:.5f}, "
          f"gradient relative difference {grad_rel:.2e}")  # fmt: skip


if __name__ == "__main__":
    main()
