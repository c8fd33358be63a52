"""Parsing of the package's environment variables, with errors that name the variable (a leaf module: every
layer may read the environment through it)."""

from __future__ import annotations

import os


def env_flag(name: str) -> bool | None:
    """A 0/1 environment variable: None when unset or blank; any other value is an error naming it."""
    value = os.environ.get(name, "").strip()
    if value in ("0", "1"):
        return value == "1"
    if value:
        raise ValueError(f"{name} must be 1 or 0, got {value!r}")
    return None
