"""What the GPU experiment scripts share: a timestamped log a watchdog reads, exception summaries, errors,
Mosaic GPU interpret mode for their `--quick` runs on a CPU, the GLA kernels one by one (`gla_stages`), and
Pallas-Triton loads and stores with an eviction policy patched into a kernel module (`evicting`, `patched`)."""

from __future__ import annotations

import contextlib
import functools
import gzip
import json
import os
import pathlib
import sys
import tempfile
import threading
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

T0 = time.perf_counter()
LAST = [T0, "start"]  # time and text of the last log line: the watchdog's view of progress


def elapsed() -> float:
    return time.perf_counter() - T0


def log(*args):
    LAST[:] = [time.perf_counter(), " ".join(str(a) for a in args)[:200]]
    print(f"[{LAST[0] - T0:6.1f}s]", *args, flush=True)


def interpret_context(quick: bool, detect_races: bool = True):
    """With `quick`, the tests' Mosaic GPU interpret mode (their additions to it, from tests/), else nothing."""
    if not quick:
        return contextlib.nullcontext()
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
    from mosaic_gpu_interpret import interpret_mode

    return interpret_mode(detect_races=detect_races)


def compile_and_time(where: str, variants: dict, *, skip: str | None, quick: bool, repeats: int):
    """Each of `variants` (name -> zero-argument call) compiled and run once, one that cannot run (declined, out of
    shared memory) reported and left out, then all timed together (`quick`: once): `(seconds, outputs)` by name."""
    from ejkernel.ops.autotune import time_fns

    calls, outputs = {}, {}
    for name, call in variants.items():
        if skip and name in skip.split(","):
            continue
        log(f"{where}: compiling and running {name}")
        try:
            outputs[name] = jax.block_until_ready(call())
            calls[name] = call
        except Exception as err:
            log(f"{where}: {name} failed: {first_lines(err)}")
    log(f"{where}: timing {len(calls)} calls")
    return time_fns(calls, repeats=1 if quick else repeats, warmup=1 if quick else 2), outputs


def start_watchdog(stall_s: float) -> None:
    """A kernel that deadlocks (a barrier never completed) hangs the process: after `stall_s` seconds
    without a log line, say where, and exit."""

    def watch():
        while True:
            time.sleep(5)
            if time.perf_counter() - LAST[0] > stall_s:
                print(f"\nWATCHDOG: no progress for {stall_s:.0f}s after: {LAST[1]!r} (a hung kernel?); exiting")
                os._exit(3)

    threading.Thread(target=watch, daemon=True).start()


def first_lines(err: BaseException, n: int = 6) -> str:
    text = "".join(traceback.format_exception_only(type(err), err)).strip().splitlines()
    text = [line for line in text if line.strip("-") and not line.startswith("For simplicity, JAX has removed")]
    return "\n    ".join(text[:n])


def rel(a, b) -> float:
    """‖a − b‖ / ‖b‖ in float64 (nan where a is not finite)."""
    a = np.asarray(jnp.asarray(a, jnp.float32), np.float64)
    b = np.asarray(jnp.asarray(b, jnp.float32), np.float64)
    if not np.isfinite(a).all():
        return float("nan")
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def errors(x, ref):
    """`(‖x − ref‖ / ‖ref‖, max |x − ref| / max |ref|, x finite)` in float64."""
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    relative = np.linalg.norm(x - ref) / max(np.linalg.norm(ref), 1e-30)
    worst = np.max(np.abs(x - ref)) / max(np.max(np.abs(ref)), 1e-30)
    return relative, worst, bool(np.all(np.isfinite(x)))


def gla_stages(base, chunk: int, scale: float, q, k, v, gate, do, init) -> dict:
    """`stage -> (tiling -> zero-argument jitted call)`: each GLA kernel alone, one sequence per batch row.
    `gate` is the raw log gate (`[B, S, H, Dk or 1]` float32); the later stages' inputs (cumulative gates,
    states, scores, state gradients) are made once here by the earlier kernels at tiling `base`. Arrays go
    in as arguments: closed over, they would be constants that XLA folds for minutes."""
    from ejkernel.kernels._common.linear_attention.layout import ChunkLayout
    from ejkernel.kernels._triton.linear_attention import _gla_backward as bwd
    from ejkernel.kernels._triton.linear_attention import _gla_forward as fwd

    layout = ChunkLayout.dense(q.shape[0], q.shape[1], chunk)
    seqs = (layout.starts, layout.ends(), layout.owners())
    bound = lambda fn, *xs: functools.partial(jax.jit(fn), *xs)
    g = bound(lambda x: fwd.cumulative_gates(base, chunk, x), gate)()
    e, final = bound(lambda *xs: fwd.chunk_states(base, False, *xs), k, v, g, init, *seqs)()
    a = bound(lambda *xs: fwd.chunk_scores(base, chunk, *xs), q, k, g)()
    dh, _, rs = bound(lambda *xs: bwd.state_grads(base, False, scale, *xs), q, g, do, e, final, *seqs)()
    return {
        "cumulative": lambda t: bound(lambda x: fwd.cumulative_gates(t, chunk, x), gate),
        "states": lambda t: bound(lambda *xs: fwd.chunk_states(t, False, *xs), k, v, g, init, *seqs),
        "scores": lambda t: bound(lambda *xs: fwd.chunk_scores(t, chunk, *xs), q, k, g),
        "outputs": lambda t: bound(
            lambda q, v, g, e, a: fwd.chunk_outputs(t, chunk, scale, q, v, g, e, a=a), q, v, g, e, a
        ),
        "state_grads": lambda t: bound(lambda *xs: bwd.state_grads(t, False, scale, *xs), q, g, do, e, final, *seqs),
        "grads": lambda t: bound(lambda *xs: bwd.chunk_grads(t, chunk, scale, *xs), q, k, v, g, do, a, e, dh, rs),
    }


def evicting(where: str):
    """A stand-in for a kernel module's `plgpu` whose loads (`L` in `where`) and stores (`S`) take `evict_first`."""
    import types

    from jax.experimental.pallas import triton as plgpu

    policy = lambda flag: "evict_first" if flag in where else None
    return types.SimpleNamespace(
        load=lambda ref, **kw: plgpu.load(ref, eviction_policy=policy("L"), **kw),
        store=lambda ref, value, **kw: plgpu.store(ref, value, eviction_policy=policy("S"), **kw),
        approx_tanh=plgpu.approx_tanh,
        CompilerParams=plgpu.CompilerParams,
    )


@contextlib.contextmanager
def patched(module, **attributes):
    """`module`'s attributes replaced while the block runs (a kernel traced inside it keeps them). JAX's caches are
    cleared on entry: inner jits would otherwise reuse what was traced under the old attributes (session 52's first
    lazy-rescale A/B timed one program twice)."""
    jax.clear_caches()
    saved = {name: getattr(module, name) for name in attributes}
    for name, value in attributes.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


def check_or_bench(doc: str, check, bench) -> None:
    """The main of a script with a CPU `check()` (`--check`) and a GPU `bench(repeats)` (`--repeats`, default 20)."""
    import argparse

    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="interpret mode on a CPU")
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args()
    check() if args.check else bench(args.repeats)


def print_gpu_timeline(call, steps: int = 3, last: int = 14) -> None:
    """Every GPU line of a JAX profile of `steps` calls of the zero-argument `call` (after as many warm-up calls):
    its last `last` events in order, each with its duration and the gap before it (the device has no nsys)."""
    for _ in range(steps):
        jax.block_until_ready(call())
    with tempfile.TemporaryDirectory() as log_dir:
        with jax.profiler.trace(log_dir, create_perfetto_trace=True):
            for _ in range(steps):
                jax.block_until_ready(call())
        with gzip.open(next(pathlib.Path(log_dir).rglob("*perfetto_trace.json.gz"))) as f:
            trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    names = {
        (e.get("pid"), e.get("tid")): e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") in ("process_name", "thread_name")
    }
    by_line = {}
    for e in events:
        if e.get("ph") == "X" and "dur" in e:
            by_line.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    for key, line in by_line.items():
        if "GPU" not in str(names.get((key[0], None), "")):
            continue
        line.sort(key=lambda e: e["ts"])
        label = f"{names.get((key[0], None), key[0])} / {names.get(key, key[1])}"
        print(f"== {label}: {len(line)} events")
        previous_end = None
        for e in line[-last:]:
            gap = "" if previous_end is None else f"gap {e['ts'] - previous_end:8.1f} us"
            print(f"{e['ts']:16.1f} {e['dur']:9.1f} us {gap:>16}  {e['name'][:80]}")
            previous_end = e["ts"] + e["dur"]


def print_torch_kernels(step, title: str, steps: int = 10) -> None:
    """The CUDA kernels of `steps` calls of the zero-argument PyTorch `step` (after five warm-up calls), per kernel,
    from torch's profiler: how an alternative's time splits (the JAX profile's counterpart is `print_gpu_timeline`)."""
    import torch

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    print(f"#### {title}, per kernel over {steps} calls")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=20, max_name_column_width=70))
