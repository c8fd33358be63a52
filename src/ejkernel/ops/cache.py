"""Config caches: in-memory (tier 3), persistent on disk (tier 4), and scoped overlays (tier 2)."""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import pathlib
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator, Mapping

import filelock
import platformdirs

from ejkernel.ops.config import ConfigBase

CACHE_DIR_ENV = "EJKERNEL_PERSISTENT_CACHE_DIR"
_FORMAT = "ejkernel-config-cache"
_FORMAT_VERSION = 1


class ConfigCache:
    """Thread-safe in-memory map from a cache key to the config chosen for it."""

    def __init__(self) -> None:
        self._entries: dict[str, ConfigBase] = {}
        self._lock = threading.Lock()

    def get(self, key: str) -> ConfigBase | None:
        with self._lock:
            return self._entries.get(key)

    def put(self, key: str, cfg: ConfigBase) -> None:
        with self._lock:
            self._entries[key] = cfg

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


def default_cache_dir() -> pathlib.Path:
    """`$EJKERNEL_PERSISTENT_CACHE_DIR`, else the platform's user cache dir (read at each call)."""
    configured = os.environ.get(CACHE_DIR_ENV)
    return pathlib.Path(configured) if configured else pathlib.Path(platformdirs.user_cache_dir("ejkernel"))


class PersistentCache:
    """Configs on disk as one JSON file, shared by processes.

    Each write takes a file lock, re-reads the file, adds its key and replaces the file atomically,
    so concurrent writers never lose each other's keys or leave a partial file. Readers need no lock
    (they always see a whole file) and re-parse only when the file changed, so a lookup on every eager
    call costs one `stat`. A file that is not valid cache JSON (truncated, foreign) is renamed aside
    with a warning and treated as empty.
    """

    FILE_NAME = "configs.json"

    def __init__(self, directory: str | os.PathLike | None = None) -> None:
        self._directory = pathlib.Path(directory) if directory is not None else None
        self._snapshot: tuple[tuple, dict[str, dict]] | None = None  # (file identity, its entries)

    @property
    def path(self) -> pathlib.Path:
        return (self._directory or default_cache_dir()) / self.FILE_NAME

    def _lock(self) -> filelock.FileLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return filelock.FileLock(str(self.path) + ".lock", timeout=60)

    def _read_unlocked(self) -> dict[str, dict]:
        path = self.path
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return {}
        try:
            data = json.loads(raw.decode("utf-8"))
            if data.get("format") != _FORMAT or not isinstance(data.get("entries"), dict):
                raise ValueError("not an ejkernel config cache")
            if data.get("version") != _FORMAT_VERSION:
                raise ValueError(f"cache format version {data.get('version')!r}")
            return data["entries"]
        except (ValueError, AttributeError) as err:
            aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}-{os.getpid()}")
            with contextlib.suppress(OSError):
                path.rename(aside)
            warnings.warn(f"ejkernel: config cache {path} is unreadable ({err}); moved it to {aside}", stacklevel=3)
            return {}

    def entries(self) -> dict[str, dict]:
        """Every stored entry: key -> {"config": json text, ...metadata}."""
        path = self.path
        try:
            stat = path.stat()
        except FileNotFoundError:
            return {}
        identity = (str(path), stat.st_ino, stat.st_mtime_ns, stat.st_size)
        snapshot = self._snapshot
        if snapshot is None or snapshot[0] != identity:
            snapshot = (identity, self._read_unlocked())
            self._snapshot = snapshot
        return dict(snapshot[1])

    def get(self, key: str) -> ConfigBase | None:
        entry = self.entries().get(key)
        if entry is None:
            return None
        try:
            return ConfigBase.from_json(entry["config"])
        except (ValueError, KeyError, TypeError) as err:
            warnings.warn(f"ejkernel: ignoring cache entry {key!r}: {err}", stacklevel=2)
            return None

    def put(self, key: str, cfg: ConfigBase, **metadata: object) -> None:
        with self._lock():
            entries = self._read_unlocked()
            entries[key] = {"config": cfg.to_json(), **metadata}
            payload = json.dumps({"format": _FORMAT, "version": _FORMAT_VERSION, "entries": entries}, indent=1)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".configs-", suffix=".tmp")
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(payload)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise

    def clear(self) -> int:
        """Delete the cache file; returns how many entries it held."""
        with self._lock():
            count = len(self._read_unlocked())
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        return count


_overlays: contextvars.ContextVar[tuple[Mapping[str, ConfigBase], ...]] = contextvars.ContextVar(
    "ejkernel_overlays", default=()
)


@contextlib.contextmanager
def overlay_cache(configs: Mapping[str, ConfigBase]) -> Iterator[None]:
    """Within the block, use these configs; keys are op ids (every call of that op) or full cache keys.

    Overlays nest; the innermost wins. Nothing is written to any cache.
    """
    token = _overlays.set((*_overlays.get(), dict(configs)))
    try:
        yield
    finally:
        _overlays.reset(token)


def overlay_lookup(op_id: str, key: str) -> ConfigBase | None:
    for overlay in reversed(_overlays.get()):
        for name in (key, op_id):
            if name in overlay:
                return overlay[name]
    return None
