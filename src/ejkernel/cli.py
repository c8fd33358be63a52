"""The `ejkernel` command: info, demo, cache list|clear|export, bench, autotune."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from ejkernel.registry import Platform

PLATFORMS = [p.value for p in Platform]


def _info(_args) -> int:
    from ejkernel import kernel_registry
    from ejkernel.ops.fingerprint import describe_device, device_fingerprint
    from ejkernel.version import __version__

    print(f"ejkernel {__version__}")
    for key, value in describe_device().items():
        print(f"  {key:13s} {value}")
    print(f"  {'fingerprint':13s} {device_fingerprint()}")
    print("\nimplementations (yes: runs here; gpu/tpu: registered for that backend only)")
    width = max(map(len, kernel_registry.list_algorithms()), default=10)
    print(f"  {'op'.ljust(width)}  " + "  ".join(p.ljust(7) for p in PLATFORMS))
    for op in kernel_registry.list_algorithms():
        here = {i.platform.value for i in kernel_registry.candidates(op)}
        cells = []
        for platform in PLATFORMS:
            backends = [
                i.backend.value for i in kernel_registry.list_implementations(op) if i.platform.value == platform
            ]
            cells.append("yes" if platform in here else ("/".join(backends) or "-"))
        print(f"  {op.ljust(width)}  " + "  ".join(c.ljust(7) for c in cells))
    return 0


def _demo(_args) -> int:
    from ejkernel.demo import run_demo

    return run_demo()


def _cache(args) -> int:
    from ejkernel.ops.cache import PersistentCache

    cache = PersistentCache()
    if args.action == "export":
        return _export(cache, args.out)
    if args.action == "clear":
        print(f"removed {cache.clear()} entries from {cache.path}")
        return 0
    entries = cache.entries()
    print(f"{cache.path}: {len(entries)} entries")
    for key, entry in sorted(entries.items()):
        op, _, rest = key.partition("|")
        config = entry.get("config", "(no config)") if isinstance(entry, dict) else f"(malformed entry: {entry!r:.60})"
        print(f"  {op}  {rest[:100]}\n    -> {config}")
    return 0


def _export(cache, out: str | None) -> int:
    """Write this device's tuned entries in the shipped format (`ops/tuned/<device kind>.json`)."""
    import json
    import pathlib

    from ejkernel.ops.executor import shipped_config_name
    from ejkernel.ops.fingerprint import describe_device, device_fingerprint

    here = device_fingerprint()
    shipped = {}
    for key, entry in cache.entries().items():
        op, fingerprint, signature = [*key.split("|", 2), "", ""][:3]
        if fingerprint == here and isinstance(entry, dict) and isinstance(entry.get("config"), str):
            shipped[f"{op}|{signature}"] = entry["config"]
    text = json.dumps(shipped, indent=1, sort_keys=True) + "\n"
    if out is None:  # standard output: redirect it to ops/tuned/<device kind>.json to ship it
        sys.stdout.write(text)
        print(f"{len(shipped)} tuned configs; shipped as {shipped_config_name(describe_device()['device_kind'])}",
              file=sys.stderr)  # fmt: skip
        return 0
    pathlib.Path(out).write_text(text)
    print(f"wrote {len(shipped)} tuned configs to {out}")
    return 0


def _benchmarks() -> dict[str, tuple[str, ...]]:
    """Benchmark module -> the ops it times (its `OPS`)."""
    import ejkernel.benchmarks as benchmarks

    names = sorted(m.name for m in pkgutil.iter_modules(benchmarks.__path__) if not m.name.startswith("_"))
    return {name: importlib.import_module(f"ejkernel.benchmarks.{name}").OPS for name in names}


def _bench(args) -> int:
    available = _benchmarks()
    if args.op is None:
        print("benchmarks (ejkernel bench NAME, or the name of an op it times):")
        for name, ops in available.items():
            print(f"  {name:18s} {', '.join(ops)}")
        return 0
    name = args.op if args.op in available else next((b for b, ops in available.items() if args.op in ops), None)
    if name is None:
        listed = "; ".join(f"{b} ({', '.join(ops)})" for b, ops in available.items())
        print(f"no benchmark times {args.op!r}; benchmarks (and their ops): {listed}", file=sys.stderr)
        return 2
    if name != args.op:
        print(f"{args.op} is timed by the {name} benchmark")
    importlib.import_module(f"ejkernel.benchmarks.{name}").main(args.rest)
    return 0


def _autotune(args) -> int:
    """Run an op's benchmark with autotuning on: every call signature it makes is tuned and cached."""
    from ejkernel.ops import PersistentCache, policy_override

    with policy_override("autotune"):
        status = _bench(args)
    if status == 0 and args.export:
        return _export(PersistentCache(), args.export)
    return status


def main(argv: list[str] | None = None) -> int:
    from ejkernel.version import __version__

    p = argparse.ArgumentParser(prog="ejkernel", description=__doc__)
    p.add_argument("--version", action="version", version=f"ejkernel {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="device, fingerprint and the registered implementations").set_defaults(fn=_info)
    sub.add_parser("demo", help="run every op here against its reference").set_defaults(fn=_demo)
    cache = sub.add_parser("cache", help="the persistent config cache")
    cache.add_argument("action", choices=["list", "clear", "export"])
    cache.add_argument("--out", help="export: the file to write (default: standard output)")
    cache.set_defaults(fn=_cache)
    bench = sub.add_parser("bench", help="run a benchmark, by its name or an op it times (JSON + PNG); none: list")
    bench.add_argument("op", nargs="?", help="a benchmark (ejkernel.benchmarks.<name>) or an op it times")
    bench.add_argument("rest", nargs=argparse.REMAINDER, help="options for the benchmark (see its --help)")
    bench.set_defaults(fn=_bench)
    tune = sub.add_parser("autotune", help="run ejkernel.benchmarks.<op> with autotuning on, caching every winner")
    tune.add_argument("--export", help="then write this device's tuned configs to this file (shipped format)")
    tune.add_argument("op", help="a benchmark (ejkernel.benchmarks.<name>) or an op it times")
    tune.add_argument("rest", nargs=argparse.REMAINDER, help="options for the benchmark (see its --help)")
    tune.set_defaults(fn=_autotune)
    args = p.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
