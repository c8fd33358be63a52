"""Shared benchmark machinery: timing on the device, environment record, JSON and plot output."""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import pathlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from ejkernel.ops.autotune import time_fn, time_fns
from ejkernel.ops.fingerprint import describe_device

__all__ = [
    "COPY_BYTES",
    "copy_bandwidth",
    "copy_builder",
    "parser",
    "print_table",
    "time_fn",
    "time_variants",
    "write_results",
]

COPY_BYTES = 2 * 2**30
"""Bytes the device copy reads (and writes) where it is timed on its own (`copy_bandwidth`)."""


def copy_builder(nbytes: int) -> Callable[[], Callable[[], Any]]:
    """A `time_variants` builder of the device copy that bandwidth ratios are taken against: `x ^ 1` over `nbytes`
    of uint32 words under `jit`, reading and writing `nbytes` each (bandwidth = 2 nbytes / time). Four-byte words:
    XLA's bfloat16 `x + 1`, the reference until session 35, ran 22% below the device's copy bandwidth on an H200
    (3.28 against 4.18 TB/s, PyTorch's copy 4.29; BENCHMARKS.md)."""
    return lambda: functools.partial(jax.jit(lambda a: a ^ 1), jnp.zeros((nbytes // 4,), jnp.uint32))


def copy_bandwidth(*, quick: bool, repeats: int) -> float:
    """Bytes per second (read + written) of the device copy over `COPY_BYTES` (1 MiB when `quick`), timed on its
    own and printed."""
    nbytes = 2**20 if quick else COPY_BYTES
    seconds = time_variants({"copy": copy_builder(nbytes)}, repeats=repeats, where="copy")["copy"]
    print(f"device copy: {2 * nbytes / seconds / 1e12:.3g} TB/s (bytes read + written)")
    return 2 * nbytes / seconds


def time_variants(
    builders: dict[str, Callable[[], Callable[[], Any]]], *, repeats: int, where: str
) -> dict[str, float]:
    """Seconds per call of each variant, all timed together (`time_fns`: interleaved samples).

    Each builder returns a variant's zero-argument call; it is built and run once first (compiling it),
    and a variant whose build or first run raises (out of memory, unsupported) is reported and left out.
    """
    ready = {}
    for name, build in builders.items():
        try:
            call = build()
            jax.block_until_ready(call())
            ready[name] = call
        except Exception as err:  # an alternative that cannot run here: report it and time the others
            print(f"{name} {where}: {type(err).__name__}: {str(err)[:200]}")
    return time_fns(ready, repeats=repeats, warmup=2)


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", default="bench_out", help="folder for the JSON and PNG results")
    p.add_argument("--quick", action="store_true", help="small shapes (for CPU smoke runs)")
    p.add_argument("--repeats", type=int, default=20)
    return p


def grouped_bars(ax, groups: list[str], series: dict[str, list], ylabel: str, reference: float | None = None) -> None:
    """One group of bars per shape (`groups`), one bar per series in each (missing values: no bar); a
    dashed line at `reference` (1.0 for ratios to a copy or to an alternative)."""
    width = 0.8 / max(len(series), 1)
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, [v if v is not None else 0 for v in values], width, label=name)
    if reference is not None:
        ax.axhline(reference, color="gray", lw=0.8, ls="--")
    rotation, align = (30, "right") if len(groups) > 4 else (0, "center")
    ax.set_xticks(range(len(groups)), groups, rotation=rotation, ha=align, fontsize=7)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7, ncols=min(len(series), 4))


def write_results(out_dir: str, name: str, rows: list[dict], meta: dict, plot: Callable[[Any, list[dict]], None]):
    """Write `<name>.json` (environment + rows) and `<name>.png` (if matplotlib is installed)."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": name,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": describe_device(),
        **meta,
        "rows": rows,
    }
    (out / f"{name}.json").write_text(json.dumps(record, indent=1))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing (pip install 'ejkernel[bench]'): no plot written")
        return out / f"{name}.json"
    fig, ax = plt.subplots(figsize=(11, 5))
    plot(ax, rows)
    ax.set_title(f"{name} on {record['device']['device_kind']}")
    fig.tight_layout()
    fig.savefig(out / f"{name}.png", dpi=120)
    plt.close(fig)
    return out / f"{name}.json"


def print_table(rows: list[dict], columns: list[str]) -> None:
    widths = [max(len(c), *(len(format_value(r.get(c))) for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for r in rows:
        print("  ".join(format_value(r.get(c)).ljust(w) for c, w in zip(columns, widths, strict=True)))


def format_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return "-" if v is None else str(v)
