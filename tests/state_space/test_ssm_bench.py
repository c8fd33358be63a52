"""`ejkernel bench state_space --quick` runs on the CPU and records every section."""

import json

from ejkernel.benchmarks import state_space


def test_quick_bench_writes_every_section(tmp_path):
    state_space.main(["--quick", "--repeats", "1", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "state_space.json").read_text())["rows"]
    sections = {(r["op"], r["mode"]) for r in rows}
    assert {("v2", "forward"), ("v2", "forward+backward"), ("v1", "forward+backward")} <= sections
    assert {("v1 decode", "batch 4"), ("v2 decode", "batch 4")} <= sections
    variants = {r["variant"] for r in rows if r["op"] == "v1"}
    assert {"xla", "xla-sequential", "xla-associative"} <= variants
    assert all(r["ms"] > 0 for r in rows)
