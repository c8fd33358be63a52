"""`get_logger`: upstream's logger factory (EasyDeL imports it), a lazily built stderr logger per name.

The level comes from the call, else `$LOGGING_LEVEL_ED` (default INFO; an unknown name means INFO). Each
line reads `(HH:MM:SS name) message`. On a multi-process run, processes other than 0 log warnings and
above only, decided at the first message (so creating a logger never initialises JAX).
"""

from __future__ import annotations

import logging
import os
import sys
import threading

LEVEL_ENV = "LOGGING_LEVEL_ED"
_lock = threading.Lock()


def _level(value: int | str | None) -> int:
    if isinstance(value, int):
        return value
    if value is None:
        value = os.environ.get(LEVEL_ENV, "INFO")
    level = logging.getLevelName(str(value).strip().upper())
    return level if isinstance(level, int) else logging.INFO


def _other_process() -> bool:
    """Whether JAX is up already and this is not process 0 (never starts JAX's backends itself)."""
    try:
        from jax._src import xla_bridge

        if not xla_bridge._backends:
            return False
        import jax

        return jax.process_index() > 0
    except Exception:
        return False


class _LineFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        prefix = f"({self.formatTime(record, '%H:%M:%S')} {record.name}) "
        return "\n".join(prefix + line for line in record.getMessage().splitlines() or [""])


class LazyLogger:
    """A `logging.Logger` of one name, built at its first message; `.name`, `.level` and the log methods."""

    _LOG_METHODS = ("debug", "info", "warning", "warn", "error", "critical", "fatal", "exception", "log")

    def __init__(self, name: str, level: int | str | None = None) -> None:
        self.name = name
        self.level = _level(level)
        self._logger: logging.Logger | None = None

    def _built(self) -> logging.Logger:
        if self._logger is None:
            with _lock:
                logger = logging.getLogger(self.name)
                if not any(getattr(h, "_ejkernel", False) for h in logger.handlers):
                    handler = logging.StreamHandler(sys.stderr)
                    handler.setFormatter(_LineFormatter())
                    handler._ejkernel = True
                    logger.addHandler(handler)
                logger.propagate = False
                logger.setLevel(max(self.level, logging.WARNING) if _other_process() else self.level)
                self._logger = logger
        return self._logger

    def __getattr__(self, name: str):
        if name in self._LOG_METHODS:
            return getattr(self._built(), "warning" if name == "warn" else name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")


def get_logger(name: str, level: int | str | None = None) -> LazyLogger:
    """A logger for `name`, built lazily; `level` an int or a level name, else `$LOGGING_LEVEL_ED`."""
    return LazyLogger(name, level)
