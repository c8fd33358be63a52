"""The `ejkernel` command: info, demo, cache, bench."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ejkernel import demo
from ejkernel.benchmarks.flash_attention import attended_pairs, parse_shape
from ejkernel.cli import main
from ejkernel.modules import MeanPoolingConfig
from ejkernel.ops import PersistentCache


def test_info_lists_ops_and_platforms(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "fingerprint" in out
    assert "mean_pooling" in out and "flash_attention" in out


def test_demo_checks_its_ops_against_their_references(capsys, monkeypatch):
    """The demo end to end on three of its cases (each op against its reference is its own tests' job: the whole
    demo takes over a minute of CI)."""
    cases = [case for case in demo.demo_cases() if case.op in ("mean_pooling", "gla_attention", "page_attention")]
    monkeypatch.setattr("ejkernel.demo.demo_cases", lambda: cases)
    monkeypatch.setattr("ejkernel.demo.time_fn", lambda fn, **_: 1e-3)  # its timings are for people, not this test
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "mean_pooling" in out and "page_attention" in out and "rel_error" in out and "NO" not in out


def test_every_demo_case_fits_its_op():
    """Each demo case's inputs and options are ones its op takes (traced, not compiled)."""
    for index, case in enumerate(demo.demo_cases()):
        args, options = case.make_inputs(jax.random.PRNGKey(index))
        out = jax.eval_shape(case.call(options), *args)
        assert out.shape and jnp.issubdtype(out.dtype, jnp.floating), case.op


@pytest.mark.lowest
def test_cache_list_and_clear(capsys):
    PersistentCache().put("mean_pooling|fp|sig", MeanPoolingConfig(platform="xla"))
    assert main(["cache", "list"]) == 0
    assert "1 entries" in capsys.readouterr().out
    assert main(["cache", "clear"]) == 0
    assert "removed 1 entries" in capsys.readouterr().out
    assert PersistentCache().entries() == {}


def test_bench_writes_json_and_plot(tmp_path):
    assert main(["bench", "mean_pooling", "--quick", "--repeats", "2", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "mean_pooling.json").read_text())
    assert record["rows"] and record["device"]["device_kind"]
    assert (tmp_path / "mean_pooling.png").stat().st_size > 0


def test_flash_attention_bench_times_each_feature_and_names_what_auto_ran(tmp_path):
    argv = ["bench", "flash_attention", "--quick", "--features", "--repeats", "1", "--out", str(tmp_path)]
    assert main(argv) == 0
    rows = json.loads((tmp_path / "flash_attention.json").read_text())["rows"]
    assert len(rows) == 4  # causal or not, forward or forward + backward
    for row in rows:
        assert row["auto ran"] == "xla"  # the only kernel on the CPU
        assert all(row[f"ejkernel-xla+{feature}"] > 0 for feature in ("softcap", "sinks", "segments"))


def test_flash_attention_bench_fp8_part_times_float8_beside_bf16(tmp_path):
    argv = ["bench", "flash_attention", "--part", "fp8", "--quick", "--repeats", "1", "--out", str(tmp_path)]
    assert main(argv) == 0
    rows = json.loads((tmp_path / "flash_attention_fp8.json").read_text())["rows"]
    assert len(rows) == 2 and all(r["fp8 ran"] == "xla" and r["ejkernel-fp8"] > 0 for r in rows)


def test_flash_attention_bench_window_counts_the_pairs_it_allows_with_grouped_queries(tmp_path):
    argv = ["bench", "flash_attention", "--shape", "1,256,4,16,2", "--window", "64,8", "--only", "ejkernel-xla"]
    assert main([*argv, "--repeats", "1", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "flash_attention_window_64_8.json").read_text())["rows"]
    assert len(rows) == 4 and all(r["window"] == "64,8" and r["ejkernel-xla"] > 0 for r in rows)
    assert all(r["H"] == 4 and r["Hkv"] == 2 for r in rows)  # `B,S,H,D,Hkv`: grouped-query attention
    q, k = np.arange(256)[:, None], np.arange(256)[None, :]
    inside = (k >= q - 64) & (k <= q + 8)
    assert attended_pairs(256, False, (64, 8)) == inside.sum()
    assert attended_pairs(256, True, (64, 8)) == (inside & (k <= q)).sum()


def test_flash_attention_bench_refuses_a_bad_shape(capsys):
    assert parse_shape("2,4096,16,128") == (2, 4096, 16, 128)  # four fields: Hkv = H, whatever D is
    with pytest.raises(SystemExit):
        main(["bench", "flash_attention", "--shape", "1,64,4,16,3"])
    assert "Hkv dividing H), got 1,64,4,16,3" in capsys.readouterr().err


def test_bench_unknown_op_lists_available(capsys):
    assert main(["bench", "no_such_op"]) == 2
    assert "mean_pooling" in capsys.readouterr().err


def test_bench_lists_benchmarks_and_takes_op_names(monkeypatch, capsys):
    import ejkernel.benchmarks.mla as mla

    assert main(["bench"]) == 0
    serving = [line.split() for line in capsys.readouterr().out.splitlines() if "serving_attention" in line]
    assert serving[0][:2] == ["serving_attention", "page_attention,"]
    ran = []
    monkeypatch.setattr(mla, "main", ran.append)
    assert main(["bench", "flash_mla", "--quick"]) == 0
    assert ran == [["--quick"]] and "timed by the mla benchmark" in capsys.readouterr().out


@pytest.mark.lowest
def test_version_and_python_dash_m():
    import subprocess
    import sys

    from ejkernel import __version__

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    done = subprocess.run([sys.executable, "-m", "ejkernel", "--version"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == f"ejkernel {__version__}"


def test_cache_export_writes_standard_output_by_default(capsys):
    from ejkernel.ops import device_fingerprint

    PersistentCache().put(f"mean_pooling|{device_fingerprint()}|sig", MeanPoolingConfig(platform="xla"))
    assert main(["cache", "export"]) == 0
    assert json.loads(capsys.readouterr().out) == {"mean_pooling|sig": MeanPoolingConfig(platform="xla").to_json()}


@pytest.mark.parametrize("argv", [[], ["cache", "drop"]])
def test_bad_command_lines_exit_with_usage(argv):
    with pytest.raises(SystemExit):
        main(argv)


@pytest.mark.lowest
def test_autotune_caches_and_exports_the_winners(tmp_path, capsys):
    exported = tmp_path / "tuned.json"
    args = ["autotune", "--export", str(exported), "mean_pooling", "--quick", "--repeats", "2", "--out", str(tmp_path)]
    assert main(args) == 0
    shipped = json.loads(exported.read_text())
    assert shipped and all(key.startswith("mean_pooling|") for key in shipped)
    assert len(PersistentCache().entries()) == len(shipped)


def test_ring_bench_reports_speed_up_and_scaling_efficiency(tmp_path):
    """On two simulated CPU devices: both one-device baselines (total and per-device length) and their ratios."""
    argv = ["bench", "ring_attention", "--quick", "--repeats", "1", "--platform", "xla", "--devices", "2"]
    argv += ["--out", str(tmp_path)]
    assert main(argv) == 0
    record = json.loads((tmp_path / "ring_attention.json").read_text())
    n = record["devices"]
    assert n > 1
    for row in record["rows"]:
        ring, whole, per_device = row[f"ring-xla x{n}"], row["flash x1"], row["flash x1 S/n"]
        assert row["ring-xla / flash"] == pytest.approx(ring / whole)
        assert row["ring-xla efficiency"] == pytest.approx(ring / (n * per_device))


@pytest.mark.long
def test_multi_gpu_bench_times_each_split_beside_one_device(tmp_path):
    argv = ["bench", "multi_gpu", "--quick", "--devices", "2", "--repeats", "1", "--out", str(tmp_path)]
    assert main(argv) == 0
    rows = json.loads((tmp_path / "multi_gpu.json").read_text())["rows"]
    assert {row["case"].split()[0] for row in rows} == {
        "page_attention",
        "grouped_matmul",
        "gla_attention",
        "flash_attention",
    }
    assert all(row["speed-up"] == pytest.approx(row["ms x1"] / row["ms x2"]) for row in rows)


def test_causal_conv1d_bench_reports_bandwidth(tmp_path):
    assert main(["bench", "causal_conv1d", "--quick", "--repeats", "1", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "causal_conv1d.json").read_text())["rows"]
    cases = ("packed + pool", "decode step", "dense fwd", "dense fwd+bwd")
    assert [(row["case"], row["platform"]) for row in rows] == [(c, p) for p in ("auto", "xla") for c in cases]


def test_ragged_gated_delta_rule_bench_reports_bandwidth_and_ratio(tmp_path):
    argv = [
        "bench",
        "ragged_gated_delta_rule",
        "--quick",
        "--part",
        "serving",
        "--repeats",
        "1",
        "--out",
        str(tmp_path),
    ]
    assert main(argv) == 0
    rows = json.loads((tmp_path / "linear_attention_serving.json").read_text())["rows"]
    decode = [r for r in rows if r["case"].startswith("decode")]
    assert {r["platform"] for r in decode} >= {"auto", "xla"} and all(r["ratio_to_copy"] > 0 for r in decode)
    xla = [r for r in rows if r["case"].startswith("prefill") and r["platform"] == "xla"]
    assert [r["op"] for r in xla] == ["ragged_gated_delta_rule", "gated_delta_rule"] and xla[1][
        "vs_gated_delta_rule"
    ] == 1


def test_quantized_matmul_bench_reports_packed_bandwidth(tmp_path):
    argv = ["bench", "quantized_matmul", "--quick", "--repeats", "1", "--modes", "int4", "--out", str(tmp_path)]
    assert main(argv) == 0
    rows = json.loads((tmp_path / "quantized_matmul.json").read_text())["rows"]
    assert [(row["mode"], row["M"]) for row in rows] == [("bf16 x@W", 1), ("int4", 1), ("bf16 x@W", 4), ("int4", 4)]
    assert all(row["ratio_to_copy"] == pytest.approx(row["TBps"] / row["copy_TBps"]) for row in rows)
