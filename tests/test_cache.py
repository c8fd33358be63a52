"""Config caches: in memory, on disk (concurrency, corruption, location) and overlays' storage."""

import json
import os
import pathlib
import subprocess
import sys
import textwrap
import time

import platformdirs
import pytest

import ejkernel.ops.cache
from ejkernel.modules import MeanPoolingConfig
from ejkernel.ops import BwdParams, ConfigCache, FwdParams, PersistentCache

pytestmark = pytest.mark.lowest

CFG_A = MeanPoolingConfig(platform="xla", fwd_params=FwdParams(block_k=16))
CFG_B = MeanPoolingConfig(platform="triton", fwd_params=FwdParams(block_k=32, block_d=256, num_warps=4))


def _corrupt_files(path: pathlib.Path) -> list[pathlib.Path]:
    return sorted(path.parent.glob(path.name + ".corrupt-*"))


# --- ConfigCache -------------------------------------------------------------------------------------


def test_config_cache_basic_ops():
    cache = ConfigCache()
    assert len(cache) == 0 and cache.get("k") is None
    cache.put("k", CFG_A)
    cache.put("j", CFG_B)
    assert cache.get("k") is CFG_A and cache.get("j") is CFG_B
    assert len(cache) == 2
    cache.put("k", CFG_B)  # replaces
    assert cache.get("k") is CFG_B and len(cache) == 2
    cache.clear()
    assert len(cache) == 0 and cache.get("k") is None


def test_config_caches_are_independent():
    a, b = ConfigCache(), ConfigCache()
    a.put("k", CFG_A)
    assert b.get("k") is None


# --- PersistentCache basics --------------------------------------------------------------------------


def test_persistent_put_get_entries_clear(tmp_path):
    cache = PersistentCache(tmp_path / "cache")
    assert cache.get("k") is None
    assert cache.entries() == {}
    assert cache.clear() == 0
    cache.put("k", CFG_A, median_seconds=0.5, candidates=3)
    cache.put("j", CFG_B)
    assert cache.get("k") == CFG_A and type(cache.get("k")) is MeanPoolingConfig
    assert cache.get("j") == CFG_B
    assert cache.get("missing") is None
    entries = cache.entries()
    assert set(entries) == {"k", "j"}
    assert entries["k"]["median_seconds"] == 0.5 and entries["k"]["candidates"] == 3
    assert json.loads(entries["k"]["config"])["type"] == "MeanPoolingConfig"
    cache.put("k", CFG_B)  # replaces, metadata too
    assert cache.get("k") == CFG_B and "median_seconds" not in cache.entries()["k"]
    assert cache.clear() == 2
    assert cache.entries() == {} and cache.get("k") is None
    assert not cache.path.exists()


def test_persistent_entries_are_shared_by_instances(tmp_path):
    PersistentCache(tmp_path).put("k", CFG_A)
    assert PersistentCache(tmp_path).get("k") == CFG_A
    assert PersistentCache(tmp_path / "elsewhere").get("k") is None


def test_persistent_file_is_readable_json(tmp_path):
    cache = PersistentCache(tmp_path)
    cache.put("key with | and spaces", CFG_B)
    data = json.loads(cache.path.read_text())
    assert isinstance(data, dict) and "key with | and spaces" in json.dumps(data)
    # No temporary file is left beside it.
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_persistent_round_trips_nested_params(tmp_path):
    cfg = MeanPoolingConfig(platform="pallas", fwd_params=FwdParams(block_k=8), bwd_params=BwdParams(block_k=4))
    cache = PersistentCache(tmp_path)
    cache.put("k", cfg)
    back = PersistentCache(tmp_path).get("k")
    assert back == cfg and type(back.bwd_params) is BwdParams


def test_persistent_cache_creates_missing_directories(tmp_path):
    cache = PersistentCache(tmp_path / "a" / "b" / "c")
    cache.put("k", CFG_A)
    assert cache.path.parent == tmp_path / "a" / "b" / "c"
    assert cache.get("k") == CFG_A


# --- location ----------------------------------------------------------------------------------------


def test_env_var_moves_the_file(tmp_path, monkeypatch):
    first, second = tmp_path / "first", tmp_path / "second"
    monkeypatch.setenv("EJKERNEL_PERSISTENT_CACHE_DIR", str(first))
    cache = PersistentCache()
    assert cache.path == first / PersistentCache.FILE_NAME
    cache.put("k", CFG_A)
    assert (first / PersistentCache.FILE_NAME).is_file()
    monkeypatch.setenv("EJKERNEL_PERSISTENT_CACHE_DIR", str(second))  # read at each use
    assert cache.path == second / PersistentCache.FILE_NAME
    assert cache.get("k") is None
    cache.put("j", CFG_B)
    assert set(PersistentCache(second).entries()) == {"j"}
    assert set(PersistentCache(first).entries()) == {"k"}


def test_explicit_directory_beats_env_var(tmp_path, monkeypatch):
    monkeypatch.setenv("EJKERNEL_PERSISTENT_CACHE_DIR", str(tmp_path / "env"))
    assert PersistentCache(tmp_path / "mine").path == tmp_path / "mine" / PersistentCache.FILE_NAME


def test_default_location_is_user_cache_dir(monkeypatch):
    monkeypatch.delenv("EJKERNEL_PERSISTENT_CACHE_DIR", raising=False)
    path = PersistentCache().path  # only looked at, never written
    expected = pathlib.Path(platformdirs.user_cache_dir("ejkernel"))
    assert path.parent == expected
    assert path.name.endswith(".json")


def test_empty_env_var_means_default_location(monkeypatch):
    monkeypatch.setenv("EJKERNEL_PERSISTENT_CACHE_DIR", "")
    assert PersistentCache().path.parent == pathlib.Path(platformdirs.user_cache_dir("ejkernel"))


# --- corruption --------------------------------------------------------------------------------------


def _valid_file(tmp_path) -> PersistentCache:
    cache = PersistentCache(tmp_path)
    for i in range(6):
        cache.put(f"key-{i}", CFG_A if i % 2 else CFG_B, median_seconds=i / 1000)
    return cache


def _check_set_aside(cache: PersistentCache, original: bytes):
    assert not cache.path.exists()
    (aside,) = _corrupt_files(cache.path)
    assert aside.read_bytes() == original  # kept for inspection, not destroyed
    # A later write starts a fresh, valid file.
    cache.put("fresh", CFG_A)
    assert cache.get("fresh") == CFG_A
    assert set(cache.entries()) == {"fresh"}
    json.loads(cache.path.read_text())
    assert _corrupt_files(cache.path) == [aside]


def test_truncated_file_is_set_aside_with_warning(tmp_path):
    cache = _valid_file(tmp_path)
    text = cache.path.read_bytes()
    cache.path.write_bytes(text[: len(text) // 2])
    original = cache.path.read_bytes()
    with pytest.warns(UserWarning, match="configs.json"):
        assert cache.get("key-1") is None
    _check_set_aside(cache, original)


def test_truncated_file_then_put_keeps_the_new_key(tmp_path):
    cache = _valid_file(tmp_path)
    text = cache.path.read_bytes()
    cache.path.write_bytes(text[: len(text) // 2])
    with pytest.warns(UserWarning):
        cache.put("after", CFG_B)
    assert len(_corrupt_files(cache.path)) == 1
    assert cache.get("after") == CFG_B


@pytest.mark.parametrize(
    "content",
    [
        "[1, 2, 3]",
        '"just a string"',
        "null",
        "42",
        '{"hello": "world"}',
        '{"format": "ejkernel-config-cache", "version": 999, "entries": {}}',
        '{"format": "ejkernel-config-cache", "version": 1, "entries": []}',
        '{"format": "someone-else", "version": 1, "entries": {}}',
    ],
    ids=["list", "string", "null", "number", "other-dict", "future-version", "entries-list", "other-format"],
)
def test_foreign_json_file_is_set_aside_with_warning(tmp_path, content):
    cache = PersistentCache(tmp_path)
    cache.path.write_text(content)
    with pytest.warns(UserWarning, match="configs.json"):
        assert cache.get("k") is None
    _check_set_aside(cache, content.encode())


def test_entries_on_corrupt_file_warns_and_is_empty(tmp_path):
    cache = PersistentCache(tmp_path)
    cache.path.write_text("{not json")
    with pytest.warns(UserWarning):
        assert cache.entries() == {}
    assert len(_corrupt_files(cache.path)) == 1


def test_binary_garbage_file_is_set_aside_with_warning(tmp_path):
    """A file that is not even text (a torn write, a disk error) must not crash the call."""
    cache = PersistentCache(tmp_path)
    original = b"\xff\xfe\x00\x81garbage\x00\xc3"
    cache.path.write_bytes(original)
    with pytest.warns(UserWarning, match="configs.json"):
        assert cache.get("k") is None
    _check_set_aside(cache, original)


def test_corrupt_entry_is_ignored_with_warning_and_others_still_work(tmp_path):
    cache = PersistentCache(tmp_path)
    cache.put("good", CFG_A)
    data = json.loads(cache.path.read_text())
    data["entries"]["bad-json"] = {"config": "{not json"}
    data["entries"]["bad-value"] = {"config": json.dumps({"type": "FwdParams", "fields": {"block_q": 3}})}
    data["entries"]["bad-type"] = {"config": json.dumps({"type": "NoSuchConfig", "fields": {}})}
    data["entries"]["no-config"] = {"median_seconds": 1.0}
    data["entries"]["not-a-dict"] = "MeanPoolingConfig"
    cache.path.write_text(json.dumps(data))
    for key in ("bad-json", "bad-value", "bad-type", "no-config", "not-a-dict"):
        with pytest.warns(UserWarning, match=key):
            assert cache.get(key) is None
    assert cache.get("good") == CFG_A
    assert _corrupt_files(cache.path) == []  # one bad entry does not discard the file


@pytest.mark.parametrize("config_text", ["5", "[1, 2]"], ids=["int", "list"])
def test_entry_whose_config_is_foreign_json_is_ignored_with_warning(tmp_path, config_text):
    cache = PersistentCache(tmp_path)
    cache.put("good", CFG_A)
    data = json.loads(cache.path.read_text())
    data["entries"]["foreign"] = {"config": config_text}
    cache.path.write_text(json.dumps(data))
    with pytest.warns(UserWarning, match="foreign"):
        assert cache.get("foreign") is None
    assert cache.get("good") == CFG_A


# --- concurrency -------------------------------------------------------------------------------------

# Each writer loads the real `ejkernel.ops.cache` (and the `config` module it needs) without running the
# package `__init__`s, which import JAX: eight JAX imports would cost most of this suite's time budget on
# two cores, and the cache code does not use JAX.
_WRITER = textwrap.dedent(
    """
    import os, pathlib, sys, time, types

    worker, directory, go, ops_dir = int(sys.argv[1]), sys.argv[2], pathlib.Path(sys.argv[3]), sys.argv[4]
    for name, path in (("ejkernel", os.path.dirname(ops_dir)), ("ejkernel.ops", ops_dir)):
        package = types.ModuleType(name)
        package.__path__ = [path]
        sys.modules[name] = package
    from ejkernel.ops.cache import PersistentCache
    from ejkernel.ops.config import FwdParams

    cache = PersistentCache(directory)
    pathlib.Path(go.parent, f"ready-{worker}").touch()
    deadline = time.monotonic() + 120
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.002)
    for i in range(10):
        cfg = FwdParams(block_q=2 ** (i % 8), num_stages=worker + 1)
        cache.put(f"worker-{worker}-key-{i}", cfg, pid=os.getpid())
    print("done", worker, "jax" in sys.modules)
    """
)


def test_concurrent_writers_lose_no_key(tmp_path):
    workers = 8
    sync = tmp_path / "sync"
    sync.mkdir()
    directory = tmp_path / "shared-cache"
    go = sync / "go"
    ops_dir = os.path.dirname(ejkernel.ops.cache.__file__)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(w), str(directory), str(go), ops_dir],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in range(workers)
    ]
    try:
        deadline = time.monotonic() + 120
        while len(list(sync.glob("ready-*"))) < workers:
            assert time.monotonic() < deadline, "writers did not start"
            exited = [p.communicate() for p in procs if p.poll() is not None]
            assert not exited, exited
            time.sleep(0.01)
        go.touch()  # all start writing at once
        results = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (out, err) in zip(procs, results, strict=True):
        assert p.returncode == 0, err
        assert f"done {procs.index(p)} False" in out  # finished, and without JAX
        assert "Warning" not in err, err  # nobody ever saw a partial file
    cache = PersistentCache(directory)
    data = json.loads(cache.path.read_text())  # valid JSON
    assert isinstance(data, dict)
    entries = cache.entries()
    expected = {f"worker-{w}-key-{i}" for w in range(workers) for i in range(10)}
    assert set(entries) == expected
    for w in range(workers):
        for i in range(10):
            cfg = cache.get(f"worker-{w}-key-{i}")
            assert cfg == FwdParams(block_q=2 ** (i % 8), num_stages=w + 1)
    assert _corrupt_files(cache.path) == []
    assert [p for p in os.listdir(directory) if p.endswith(".tmp")] == []
