"""Config caches: in-memory (tier 3), persistent on disk (tier 4), and scoped overlays (tier 2)."""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import pathlib
import secrets
import stat
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping

import filelock
import platformdirs

from ejkernel.ops.config import ConfigBase

CACHE_DIR_ENV = "EJKERNEL_PERSISTENT_CACHE_DIR"
_FORMAT = "ejkernel-config-cache"
_FORMAT_VERSION = 1
_MAX_BYTES = 64 << 20  # larger is no cache this code wrote (100,000 tuned signatures take about 50 MiB)
_ORPHAN_AGE_S = 300  # a writer's temp file this old was left by a killed process (a write takes milliseconds)
_LOCK_TIMEOUT_S = 30
_TMP_PREFIX, _TMP_SUFFIX = ".configs-", ".tmp"

_warned: set[tuple[str, ...]] = set()
_warned_lock = threading.Lock()


def warn_once(subject: tuple[str, ...], message: str) -> None:
    """`warnings.warn(message)` the first time this process meets `subject` (a cache file, an entry): a
    problem is reported once, not at every call that runs into it."""
    with _warned_lock:
        if subject in _warned:
            return
        _warned.add(subject)
    warnings.warn(message, stacklevel=3)


def _warn_unreadable(path: pathlib.Path, err: OSError) -> None:
    warn_once((str(path),), f"ejkernel: cannot read config cache {path} ({err}); ignoring it")


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
    """`$EJKERNEL_PERSISTENT_CACHE_DIR` (`~` expanded; blank counts as unset), else the platform's user
    cache dir. Read at each call."""
    configured = os.environ.get(CACHE_DIR_ENV, "").strip()
    if configured:
        return pathlib.Path(os.path.expanduser(configured))
    return pathlib.Path(platformdirs.user_cache_dir("ejkernel"))


def _identity(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


def _create_readable(path: str, flags: int) -> int:
    """`open()`'s opener for a new file of mode 0644 less the umask (`mkstemp` makes 0600 files, which the
    other users of a shared cache dir cannot read)."""
    return os.open(path, flags | os.O_EXCL, 0o644)


class PersistentCache:
    """Configs on disk as one JSON file, shared by processes.

    Each write takes a file lock, re-reads the file, adds its key and replaces the file atomically (through
    a temp file beside it, mode 0644 less the umask), so concurrent writers never lose each other's keys or
    leave a partial file; temp files orphaned by a killed writer are deleted by a later write. Readers need
    no lock (they always see a whole file) and re-parse only when the file changed, so a lookup on every
    eager call costs one `stat`.

    A lookup never fails: a path that cannot be read (a directory, another user's file, below a file) is
    ignored; a file that is not valid cache JSON (truncated, foreign, too deep, too large) is renamed aside,
    or ignored where it cannot be moved; an entry that does not decode is skipped. Each problem is reported
    by one warning per process. `put` raises `OSError` when the file cannot be written; `try_put` warns.
    """

    FILE_NAME = "configs.json"

    def __init__(self, directory: str | os.PathLike | None = None) -> None:
        self._directory = pathlib.Path(directory) if directory is not None else None
        self._snapshot: tuple[tuple, dict[str, dict]] | None = None  # ((path, file identity), its entries)

    @property
    def path(self) -> pathlib.Path:
        return (self._directory or default_cache_dir()) / self.FILE_NAME

    @staticmethod
    def _lock(path: pathlib.Path) -> filelock.FileLock:
        path.parent.mkdir(parents=True, exist_ok=True)
        return filelock.FileLock(str(path) + ".lock", timeout=_LOCK_TIMEOUT_S)

    def _load(self, path: pathlib.Path, *, locked: bool) -> dict[str, dict]:
        """The file's entries; {} when there is none, or when it is no valid cache (it is then set aside).
        `OSError` when it exists but cannot be read (a directory, another user's file): it is left alone."""
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO there must not block
        except FileNotFoundError:
            return {}
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise OSError("not a regular file")
            with open(fd, "rb", closefd=False) as f:
                raw = f.read(_MAX_BYTES + 1) if st.st_size <= _MAX_BYTES else b""  # a huge file is not read
        finally:
            os.close(fd)
        try:
            if st.st_size > _MAX_BYTES or len(raw) > _MAX_BYTES:
                raise ValueError(f"larger than {_MAX_BYTES >> 20} MiB")
            data = json.loads(raw.decode("utf-8"))
            if not isinstance(data, dict) or data.get("format") != _FORMAT or not isinstance(data.get("entries"), dict):
                raise ValueError("not an ejkernel config cache")
            if data.get("version") != _FORMAT_VERSION:
                raise ValueError(f"cache format version {data.get('version')!r}")
            return data["entries"]
        except (ValueError, RecursionError) as err:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            reason = "nested too deeply" if isinstance(err, RecursionError) else str(err)
            if not self._set_aside(path, _identity(st), reason, locked=locked) and locked:
                raise OSError(f"{path} is invalid and could not be moved aside") from None
            return {}

    def _set_aside(self, path: pathlib.Path, identity: tuple[int, ...], reason: str, *, locked: bool) -> bool:
        """Rename the invalid file `path` (kept for inspection) or, if it cannot be moved, say that it stays and
        is ignored (then False). Under the lock, and only if it is still the file read: a writer may have
        replaced it."""
        aside = path.with_name(f"{path.name}.corrupt-{time.time_ns()}-{os.getpid()}")
        try:
            with contextlib.nullcontext() if locked else self._lock(path):
                if _identity(os.stat(path)) != identity:
                    return True
                os.rename(path, aside)
        except FileNotFoundError:
            return True  # another process set it aside first
        except OSError as err:
            warn_once(
                (str(path),),
                f"ejkernel: config cache {path} is unreadable ({reason}) and could not be moved aside ({err}); "
                "left it in place, ignoring it",
            )
            return False
        warnings.warn(f"ejkernel: config cache {path} is unreadable ({reason}); moved it to {aside}", stacklevel=4)
        return True

    def entries(self) -> dict[str, dict]:
        """Every stored entry: key -> {"config": json text, ...metadata}; {} when the file cannot be used."""
        path = self.path
        try:
            identity = (str(path), *_identity(os.stat(path)))
        except FileNotFoundError:
            return {}
        except OSError as err:  # the cache dir is a file, or cannot be searched
            _warn_unreadable(path, err)
            return {}
        snapshot = self._snapshot
        if snapshot is None or snapshot[0] != identity:
            try:
                found = self._load(path, locked=False)
            except OSError as err:
                _warn_unreadable(path, err)
                found = {}
            snapshot = (identity, found)
            self._snapshot = snapshot
        return dict(snapshot[1])

    def get(self, key: str, check: Callable[[ConfigBase], str | None] | None = None) -> ConfigBase | None:
        """The config stored under `key`, else None. An entry that does not decode, or that `check` rejects
        (returning why: another op's config type, a platform this host lacks), is skipped with a warning."""
        entry = self.entries().get(key)
        if entry is None:
            return None
        try:
            cfg = ConfigBase.from_json(entry["config"])
            reason = check(cfg) if check is not None else None
        except Exception as err:  # whatever a malformed entry raises, the call goes on without it
            cfg, reason = None, f"{type(err).__name__}: {err}"
        if reason is None:
            return cfg
        path = str(self.path)
        warn_once((path, key, reason), f"ejkernel: ignoring config cache entry {key!r} of {path}: {reason}")
        return None

    def put(self, key: str, cfg: ConfigBase, **metadata: object) -> None:
        """Store `cfg` under `key`. `OSError` if the file cannot be written, or exists but cannot be read (it is
        then left alone, not replaced)."""
        path = self.path
        entry = {"config": cfg.to_json(), **metadata}
        with self._lock(path):
            entries = self._load(path, locked=True)
            entries[key] = entry
            payload = json.dumps({"format": _FORMAT, "version": _FORMAT_VERSION, "entries": entries}, indent=1)
            self._remove_orphans(path.parent)
            tmp = path.with_name(f"{_TMP_PREFIX}{os.getpid()}-{secrets.token_hex(6)}{_TMP_SUFFIX}")
            try:
                with open(tmp, "w", encoding="utf-8", opener=_create_readable) as f:
                    f.write(payload)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise

    def try_put(self, key: str, cfg: ConfigBase, **metadata: object) -> bool:
        """`put` for a call that must not fail: if the cache cannot be written, warn once and return False
        (the caller keeps the config in memory)."""
        try:
            self.put(key, cfg, **metadata)
        except (OSError, TypeError, ValueError) as err:  # unwritable or unreadable; metadata JSON cannot hold
            path = self.path
            warn_once((str(path),), f"ejkernel: cannot write config cache {path} ({err}); not saving to it")
            return False
        return True

    @staticmethod
    def _remove_orphans(directory: pathlib.Path) -> None:
        """Delete the temp files of writers killed mid-write (old ones only, never one being written)."""
        cutoff = time.time() - _ORPHAN_AGE_S
        for tmp in directory.glob(f"{_TMP_PREFIX}*{_TMP_SUFFIX}"):
            with contextlib.suppress(OSError):
                if tmp.lstat().st_mtime < cutoff:
                    tmp.unlink()

    def clear(self) -> int:
        """Delete the cache file; returns how many entries it held."""
        path = self.path
        with self._lock(path):
            count = len(self._load(path, locked=True))
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
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
