"""The persistent config cache never breaks a call.

Every case puts something wrong where the cache lives (the directory, `configs.json`, one entry, the lock,
temp files) and runs a real op under both autotune policies: the call runs, its result is the result of a
call with no cache to read, at most one warning names the problem (twice called, still one), and the file
ends as the case says (set aside, left in place, rewritten). Root passes every permission check, so
unreadable and read-only places are also simulated by failing the file operations (`_deny`).
"""

import dataclasses
import errno
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import warnings
from collections.abc import Callable

import jax.numpy as jnp
import numpy as np
import platformdirs
import pytest

import ejkernel.ops.cache
import ejkernel.ops.executor
from ejkernel import kernel_registry
from ejkernel.modules import FlashAttentionConfig, MeanPoolingConfig, mean_pooling
from ejkernel.ops import FwdParams, PersistentCache, reset_caches
from ejkernel.registry import current_backend

CACHE_DIR_ENV, POLICY_ENV = "EJKERNEL_PERSISTENT_CACHE_DIR", "EJKERNEL_AUTOTUNE_POLICY"
X = jnp.arange(2 * 5 * 8, dtype=jnp.float32).reshape(2, 5, 8) / 7
XLA_CFG = MeanPoolingConfig(platform="xla").to_json()
ABSENT_PLATFORM = next(p for p in ("triton", "pallas", "cuda") if not kernel_registry.candidates("mean_pooling", p))
ABSENT_BACKEND = "tpu" if current_backend().value != "tpu" else "gpu"


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> tuple[str, np.ndarray]:
    """The call's cache key and its result with no cache to read (tuned into a scratch directory)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CACHE_DIR_ENV, str(tmp_path_factory.mktemp("scratch")))
        mp.setenv(POLICY_ENV, "autotune")
        reset_caches()
        out = np.asarray(mean_pooling(X))
        (key,) = PersistentCache().entries()
    reset_caches()
    return key, out


def _deny(monkeypatch, inside: Callable[[str], bool], *, reads=False, writes=False, lookups=False) -> None:
    """Fail the file operations on the paths `inside` selects with EACCES, as on another user's files or in a
    read-only or unsearchable directory (as root, chmod alone would not)."""

    def refuse(path):
        raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))

    real_open = os.open

    def fake_open(path, flags, *args, **kwargs):
        writing = flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
        if inside(os.fspath(path)) and (writes if writing else reads):
            refuse(path)
        return real_open(path, flags, *args, **kwargs)

    def guarded(real):
        def fake(*args, **kwargs):
            for arg in args:
                if isinstance(arg, str | os.PathLike) and inside(os.fspath(arg)):
                    refuse(arg)
            return real(*args, **kwargs)

        return fake

    monkeypatch.setattr(os, "open", fake_open)
    names = (["stat", "lstat"] if lookups else []) + (["rename", "replace", "unlink", "mkdir"] if writes else [])
    for name in names:
        monkeypatch.setattr(os, name, guarded(getattr(os, name)))


@dataclasses.dataclass(frozen=True)
class Case:
    """`setup(dir, key, monkeypatch)` spoils the cache dir `dir` and may return another value for
    `$EJKERNEL_PERSISTENT_CACHE_DIR`; `warns` counts the ejkernel warnings under heuristics and under
    autotune; `after(dir, key, policy)` says whether the files were left as they should be."""

    setup: Callable
    warns: tuple[int, int]
    after: Callable = lambda d, key, policy: True


def _file(d):
    return d / "configs.json"


def _aside(d):
    return sorted(d.glob("configs.json.corrupt-*"))


def _tuned_only_under_autotune(d, key, policy):
    return _aside(d) == [] and (PersistentCache(d).get(key) is not None) == (policy == "autotune")


def _unchanged(d, key, policy):
    """The file (whose first content the case kept as `original`) is where it was, as it was."""
    return _aside(d) == [] and _file(d).read_bytes() == d.joinpath("original").read_bytes()


def _write_cache(d, entries: dict) -> None:
    d.mkdir(parents=True, exist_ok=True)
    _file(d).write_text(json.dumps({"format": "ejkernel-config-cache", "version": 1, "entries": entries}))
    d.joinpath("original").write_bytes(_file(d).read_bytes())


def _valid_with_key(d, key, cfg=XLA_CFG):
    _write_cache(d, {key: {"config": cfg}})


def _corrupt(content: str | bytes) -> Case:
    """configs.json holds `content`: it is moved aside intact; under autotune a new file holds the tuned config."""
    raw = content.encode() if isinstance(content, str) else content

    def setup(d, key, mp):
        d.mkdir()
        _file(d).write_bytes(raw)

    return Case(setup, (1, 1), lambda d, key, policy: _moved_aside(d, key, policy, raw))


def _moved_aside(d, key, policy, raw=None):
    """Set aside intact (as `raw`, where given); under autotune a new file holds the tuned config."""
    aside = _aside(d)
    intact = len(aside) == 1 and (raw is None or aside[0].read_bytes() == raw)
    return intact and (PersistentCache(d).get(key) is not None) == (policy == "autotune")


def _entry(value, whole=False) -> Case:
    """The call's entry is `{"config": value}` (or `value` itself): skipped; under autotune, replaced."""
    written = value if whole else {"config": value}

    def after(d, key, policy):
        stored = PersistentCache(d).entries()
        return "other|key" in stored and (stored[key] != written) == (policy == "autotune")

    return Case(lambda d, key, mp: _write_cache(d, {key: written, "other|key": {"config": "{"}}), (1, 1), after)


def _inside(d):
    return lambda path: path.startswith(str(d) + os.sep)


def _dir_is_file(d, key, mp):
    d.write_text("not a directory")


def _dir_below_file(d, key, mp):
    d.write_text("not a directory")
    return str(d / "sub")


def _read_only(spoil=None):
    def setup(d, key, mp):
        d.mkdir()
        if spoil is not None:
            spoil(d, key)
        _deny(mp, _inside(d), writes=True)

    return setup


def _truncated(d, key):
    _valid_with_key(d, key)
    _file(d).write_bytes(_file(d).read_bytes()[:20])
    d.joinpath("original").write_bytes(_file(d).read_bytes())


def _unsearchable(d, key, mp):
    _valid_with_key(d, key)
    _deny(mp, _inside(d), reads=True, writes=True, lookups=True)


def _relative(d, key, mp):
    mp.chdir(d.parent)
    return "relative-cache"


def _tilde(d, key, mp):
    mp.setenv("HOME", str(d.parent))
    return "~/tilde-cache"


def _blank(d, key, mp):
    mp.setattr(platformdirs, "user_cache_dir", lambda *args, **kwargs: str(d))
    return "  "


def _chmod_000(d, key, mp):
    _valid_with_key(d, key)
    _file(d).chmod(0)


def _chmod_000_after(d, key, policy):
    _file(d).chmod(0o644)
    return _unchanged(d, key, policy)


def _unreadable(d, key, mp):
    _valid_with_key(d, key)
    _deny(mp, lambda path: path == str(_file(d)), reads=True)


def _fifo(d, key, mp):
    d.mkdir()
    os.mkfifo(_file(d))


def _dangling_symlink(d, key, mp):
    d.mkdir()
    _file(d).symlink_to(d / "nowhere")


def _lock_unwritable(d, key, mp):
    d.mkdir()
    _deny(mp, lambda path: _inside(d)(path) and path.endswith(".lock"), writes=True)


def _huge(d, key, mp):
    d.mkdir()
    with open(_file(d), "wb") as f:
        f.truncate((64 << 20) + 1)  # sparse: nothing is written, and the cache must not read it


def _stale_tmp(d, key, mp):
    d.mkdir()
    for name, age in (("old", 3600), ("fresh", 0)):
        tmp = d / f".configs-{name}.tmp"
        tmp.write_text("{")
        os.utime(tmp, (time.time() - age, time.time() - age))


def _stale_tmp_after(d, key, policy):
    left = sorted(p.name for p in d.glob(".configs-*.tmp"))
    return left == ([".configs-fresh.tmp"] if policy == "autotune" else [".configs-fresh.tmp", ".configs-old.tmp"])


def _mode_000_is_unreadable() -> bool:
    """False for root with its override of file modes (then chmod 000 hides nothing), else True."""
    with tempfile.NamedTemporaryFile() as f:
        os.chmod(f.name, 0)
        try:
            open(f.name).close()
        except PermissionError:
            return True
    return False


UNREADABLE = int(_mode_000_is_unreadable())
CASES = {
    # where the cache dir is
    "dir-is-a-file": Case(_dir_is_file, (1, 1), lambda d, key, policy: d.read_text() == "not a directory"),
    "dir-below-a-file": Case(_dir_below_file, (1, 1), lambda d, key, policy: d.is_file()),
    "dir-missing-parents": Case(
        lambda d, key, mp: str(d / "a" / "b"),
        (0, 0),
        lambda d, key, policy: _tuned_only_under_autotune(d / "a" / "b", key, policy),
    ),
    "dir-read-only-empty": Case(_read_only(), (0, 1), lambda d, key, policy: not _file(d).exists()),
    "dir-read-only-with-key": Case(_read_only(_valid_with_key), (0, 0), _unchanged),
    "dir-read-only-truncated": Case(_read_only(_truncated), (1, 1), _unchanged),
    "dir-unsearchable": Case(_unsearchable, (1, 1), _unchanged),
    "dir-relative": Case(
        _relative, (0, 0), lambda d, key, policy: _tuned_only_under_autotune(d.parent / "relative-cache", key, policy)
    ),
    "dir-tilde": Case(
        _tilde, (0, 0), lambda d, key, policy: _tuned_only_under_autotune(d.parent / "tilde-cache", key, policy)
    ),
    "dir-blank-means-default": Case(_blank, (0, 0), _tuned_only_under_autotune),
    "dir-symlink-loop": Case(lambda d, key, mp: d.symlink_to(d), (1, 1)),
    # configs.json itself
    "file-is-a-directory": Case(
        lambda d, key, mp: _file(d).mkdir(parents=True), (1, 1), lambda d, key, policy: _file(d).is_dir()
    ),
    "file-empty": _corrupt(b""),
    "file-truncated": _corrupt('{"format": "ejkernel-config-cache", "version": 1, "entries": {"k": {"con'),
    "file-binary": _corrupt(b"\xff\xfe\x00\x81garbage"),
    "file-not-json": _corrupt("format = 'toml'"),
    "file-json-list": _corrupt("[1, 2, 3]"),
    "file-entries-list": _corrupt('{"format": "ejkernel-config-cache", "version": 1, "entries": []}'),
    "file-nested-100k": _corrupt("[" * 100_000),
    "file-huge": Case(_huge, (1, 1), _moved_aside),
    "file-foreign-format": _corrupt('{"format": "someone-else", "version": 1, "entries": {}}'),
    "file-future-version": _corrupt('{"format": "ejkernel-config-cache", "version": 99, "entries": {}}'),
    "file-chmod-000": Case(_chmod_000, (UNREADABLE, UNREADABLE), _chmod_000_after),
    "file-unreadable": Case(_unreadable, (1, 1), _unchanged),
    "file-fifo": Case(_fifo, (1, 1), lambda d, key, policy: _file(d).is_fifo()),
    "file-dangling-symlink": Case(_dangling_symlink, (0, 0)),
    "lock-unwritable": Case(_lock_unwritable, (0, 1), lambda d, key, policy: not _file(d).exists()),
    "lock-is-a-directory": Case(
        lambda d, key, mp: d.joinpath("configs.json.lock").mkdir(parents=True),
        (0, 1),
        lambda d, key, policy: not _file(d).exists(),
    ),
    "stale-temp-files": Case(_stale_tmp, (0, 0), _stale_tmp_after),
    # the call's entry
    "entry-valid": Case(lambda d, key, mp: _valid_with_key(d, key), (0, 0), _unchanged),
    "entry-old-form": Case(
        lambda d, key, mp: _valid_with_key(d, key, '{"type": "MeanPoolingConfig", "fields": {"platform": "xla"}}'),
        (0, 0),
        _unchanged,
    ),
    "entry-unknown-type": _entry('{"type": "NoSuchConfig", "platform": "xla"}'),
    "entry-unknown-field": _entry('{"type": "MeanPoolingConfig", "platform": "xla", "colour": "red"}'),
    "entry-invalid-value": _entry('{"type": "MeanPoolingConfig", "fwd_params": {"block_k": 3}}'),
    "entry-unknown-platform": _entry('{"type": "MeanPoolingConfig", "platform": "rocm"}'),
    "entry-platform-absent-here": _entry(MeanPoolingConfig(platform=ABSENT_PLATFORM).to_json()),
    "entry-backend-absent-here": _entry(MeanPoolingConfig(backend=ABSENT_BACKEND).to_json()),
    "entry-of-another-op": _entry(FlashAttentionConfig(platform="xla").to_json()),
    "entry-config-not-json": _entry("{not json"),
    "entry-config-nested-deeply": _entry("[" * 100_000),
    "entry-config-not-text": _entry({"config": {"type": "MeanPoolingConfig"}}, whole=True),
    "entry-without-config": _entry({"median_seconds": 1.0}, whole=True),
    "entry-not-an-object": _entry("MeanPoolingConfig", whole=True),
}


def _ejkernel_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if str(w.message).startswith("ejkernel:")]


@pytest.mark.parametrize("policy", ["heuristics", "autotune"])
@pytest.mark.parametrize("name", list(CASES))
def test_the_call_runs_and_its_result_is_unchanged(name, policy, baseline, tmp_path, monkeypatch):
    key, expected = baseline
    case, d = CASES[name], tmp_path / "cache"
    value = case.setup(d, key, monkeypatch) or str(d)
    monkeypatch.setenv(CACHE_DIR_ENV, value)
    monkeypatch.setenv(POLICY_ENV, policy)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            np.testing.assert_allclose(np.asarray(mean_pooling(X)), expected, rtol=1e-6)
    messages = _ejkernel_warnings(caught)
    assert len(messages) == case.warns[policy == "autotune"], messages
    assert all("\n" not in m for m in messages)
    monkeypatch.undo()  # the files are checked as they are, not through a simulated denial
    assert case.after(d, key, policy)


def test_set_aside_only_when_moved(tmp_path, monkeypatch):
    """A file that cannot be moved aside is said to stay in place; one that can is said to be moved."""
    d = tmp_path / "cache"
    d.mkdir()
    _file(d).write_text("{")
    _deny(monkeypatch, _inside(d), writes=True)
    with pytest.warns(UserWarning, match="left it in place") as caught:
        assert PersistentCache(d).get("k") is None
    assert "moved it" not in str(caught[0].message)
    monkeypatch.undo()
    with pytest.warns(UserWarning, match="moved it to"):
        assert PersistentCache(d).get("k") is None
    assert len(_aside(d)) == 1 and not _file(d).exists()


def test_a_file_left_in_place_is_not_overwritten(tmp_path, monkeypatch):
    """A write that finds an invalid file it cannot move aside leaves it alone, with the one warning."""
    _file(tmp_path).write_text("{")
    rename = os.rename

    def refuse_rename(src, dst):
        if os.fspath(src) == str(_file(tmp_path)):
            raise OSError(errno.EBUSY, "Device or resource busy", os.fspath(src))
        rename(src, dst)

    monkeypatch.setattr(os, "rename", refuse_rename)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert PersistentCache(tmp_path).try_put("k", MeanPoolingConfig()) is False
    (message,) = _ejkernel_warnings(caught)
    assert "left it in place" in message
    assert _file(tmp_path).read_text() == "{" and list(tmp_path.glob(".configs-*.tmp")) == []


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o644)])
def test_files_are_written_readable_as_the_umask_allows(tmp_path, umask, mode):
    cache = PersistentCache(tmp_path)
    tmp_path.joinpath("configs.json").write_text("{}")  # an older writer's 0600 file is replaced too
    tmp_path.joinpath("configs.json").chmod(0o600)
    previous = os.umask(umask)
    try:
        with pytest.warns(UserWarning, match="moved it"):
            cache.put("k", MeanPoolingConfig())
    finally:
        os.umask(previous)
    assert cache.path.stat().st_mode & 0o777 == mode


_KILLED_WRITER = textwrap.dedent(
    """
    import os, pathlib, sys, time, types

    directory, ready, ops_dir = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3]
    for name, path in (("ejkernel", os.path.dirname(ops_dir)), ("ejkernel.ops", ops_dir)):
        package = types.ModuleType(name)
        package.__path__ = [path]
        sys.modules[name] = package
    from ejkernel.ops.cache import PersistentCache
    from ejkernel.ops.config import FwdParams

    def hang(*args):  # the temp file is written; the process dies before it replaces the cache
        ready.touch()
        time.sleep(600)

    os.replace = hang
    PersistentCache(directory).put("killed", FwdParams(block_q=4))
    """
)


def test_writer_killed_mid_write(baseline, tmp_path, monkeypatch):
    """SIGKILL between writing the temp file and replacing the cache: the cache is intact, the lock free,
    the call runs, and a later write deletes the orphan once it is old."""
    key, expected = baseline
    d, ready = tmp_path / "cache", tmp_path / "ready"
    _valid_with_key(d, "other|key")
    ops_dir = os.path.dirname(ejkernel.ops.cache.__file__)
    child = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(d), str(ready), ops_dir])
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert child.poll() is None and time.monotonic() < deadline, "the writer did not get to its write"
            time.sleep(0.01)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert _unchanged(d, key, "autotune")
    (orphan,) = d.glob(".configs-*.tmp")
    monkeypatch.setenv(CACHE_DIR_ENV, str(d))
    monkeypatch.setenv(POLICY_ENV, "autotune")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        np.testing.assert_allclose(np.asarray(mean_pooling(X)), expected, rtol=1e-6)
    assert _ejkernel_warnings(caught) == []
    assert set(PersistentCache(d).entries()) == {"other|key", key}
    assert orphan.exists()  # too young to tell from a live writer's
    os.utime(orphan, (time.time() - 3600, time.time() - 3600))
    PersistentCache(d).put("later", MeanPoolingConfig())
    assert list(d.glob(".configs-*.tmp")) == []


def test_concurrent_writers_and_readers_in_threads(tmp_path):
    cache, errors = PersistentCache(tmp_path), []

    def write(worker):
        try:
            for i in range(5):
                cache.put(f"w{worker}-{i}", MeanPoolingConfig(fwd_params=FwdParams(block_k=2**i)))
                PersistentCache(tmp_path).entries()
        except Exception as err:
            errors.append(err)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        threads = [threading.Thread(target=write, args=(w,)) for w in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == [] and _ejkernel_warnings(caught) == []
    assert len(PersistentCache(tmp_path).entries()) == 30
    assert list(tmp_path.glob(".configs-*.tmp")) == []


@pytest.mark.parametrize(
    "variable, value",
    [
        (POLICY_ENV, "sometimes"),
        ("EJKERNEL_AUTOTUNE_THREADS", "abc"),
        ("EJKERNEL_AUTOTUNE_THREADS", "0"),
        ("EJKERNEL_AUTOTUNE_THREADS", "-2"),
        ("EJKERNEL_AUTOTUNE_THREADS", "1.5"),
        ("EJKERNEL_LOG_AUTOTUNE", "yes"),
        ("EJKERNEL_AUTOTUNE_PROGRESS", "maybe"),
    ],
)
def test_bad_environment_value_is_a_one_line_error_naming_it(variable, value, monkeypatch):
    monkeypatch.setenv(POLICY_ENV, "autotune")
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=variable) as err:
        mean_pooling(X)
    assert "\n" not in str(err.value) and repr(value) in str(err.value)


@pytest.mark.parametrize(
    "variable, value",
    [
        (POLICY_ENV, "  "),
        ("EJKERNEL_AUTOTUNE_THREADS", " 2 "),
        ("EJKERNEL_AUTOTUNE_THREADS", ""),
        ("EJKERNEL_LOG_AUTOTUNE", "0"),
        ("EJKERNEL_AUTOTUNE_PROGRESS", "0"),
    ],
)
def test_good_environment_values_run(variable, value, baseline, monkeypatch):
    if variable != POLICY_ENV:
        monkeypatch.setenv(POLICY_ENV, "autotune")
    monkeypatch.setenv(variable, value)
    np.testing.assert_allclose(np.asarray(mean_pooling(X)), baseline[1], rtol=1e-6)


def test_tuning_variables_are_not_read_without_tuning(baseline, monkeypatch):
    for variable in ("EJKERNEL_AUTOTUNE_THREADS", "EJKERNEL_LOG_AUTOTUNE", "EJKERNEL_AUTOTUNE_PROGRESS"):
        monkeypatch.setenv(variable, "abc")
    np.testing.assert_allclose(np.asarray(mean_pooling(X)), baseline[1], rtol=1e-6)


@pytest.mark.parametrize(
    "shipped",
    ["{not json", '{"type": "NoSuchConfig"}', MeanPoolingConfig(platform=ABSENT_PLATFORM).to_json()],
    ids=["not-json", "unknown-type", "platform-absent-here"],
)
def test_bad_shipped_config_falls_back_to_the_heuristic(shipped, baseline, monkeypatch):
    key, expected = baseline
    op, _, signature = key.split("|", 2)
    monkeypatch.setattr(ejkernel.ops.executor, "_shipped_configs", lambda kind: {f"{op}|{signature}": shipped})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            np.testing.assert_allclose(np.asarray(mean_pooling(X)), expected, rtol=1e-6)
    assert len(_ejkernel_warnings(caught)) == 1


@pytest.mark.parametrize("content", ["{not json", "[1]"], ids=["not-json", "not-an-object"])
def test_bad_shipped_file_is_ignored(content, tmp_path, monkeypatch):
    tmp_path.joinpath("tuned").mkdir()
    tmp_path.joinpath("tuned", "Some_Device.json").write_text(content)
    monkeypatch.setattr(ejkernel.ops.executor.resources, "files", lambda package: tmp_path)
    with pytest.warns(UserWarning, match="shipped configs"):
        assert ejkernel.ops.executor._shipped_configs.__wrapped__("Some Device") == {}
