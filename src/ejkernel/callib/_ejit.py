"""`ejit`, `cdiv` and `_get_args_signature`, at upstream's paths (`ejkernel.callib._ejit`).

`ejit` is `jax.jit` with upstream's keyword list: only the options given reach `jax.jit`, so its defaults
hold, and the result keeps every `jax.jit` method (`.lower`, `.trace`, `.eval_shape`, `.clear_cache`).
Reusing compiled programs across processes is opt-in (`EASYDEL_CACHE_COMPILES=1`): it turns on JAX's own
persistent compilation cache in a directory of this user's (`COMPILE_FUNC_DIR`, else the user cache dir),
unless one is configured already or `EASYDEL_RECOMPILE_FORCE=1`. Without it no global setting changes.
"""

from __future__ import annotations

import numbers
import os
import pathlib
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import platformdirs

CACHE_ENV, FORCE_ENV, DIR_ENV = "EASYDEL_CACHE_COMPILES", "EASYDEL_RECOMPILE_FORCE", "COMPILE_FUNC_DIR"


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _use_persistent_cache() -> None:
    """Point JAX's compilation cache at this user's ejit directory, when opted in and nothing else is set."""
    if not _env_flag(CACHE_ENV) or _env_flag(FORCE_ENV) or jax.config.jax_compilation_cache_dir:
        return
    default = pathlib.Path(platformdirs.user_cache_dir("ejkernel-cache")) / "ejit_compiled_functions"
    directory = pathlib.Path(os.environ.get(DIR_ENV) or default)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    jax.config.update("jax_compilation_cache_dir", str(directory))


def ejit(
    func: Callable | None = None,
    *,
    static_argnums=None,
    static_argnames=None,
    donate_argnums=None,
    in_shardings=None,
    out_shardings=None,
    donate_argnames=None,
    keep_unused: bool = False,
    backend: str | None = None,
    inline: bool = False,
    compiler_options: dict[str, Any] | None = None,
):
    """`jax.jit(func, **options)`, as a bare decorator, a decorator with options, or called directly."""
    given = {
        "static_argnums": static_argnums,
        "static_argnames": static_argnames,
        "donate_argnums": donate_argnums,
        "donate_argnames": donate_argnames,
        "in_shardings": in_shardings,
        "out_shardings": out_shardings,
        "backend": backend,
        "compiler_options": compiler_options,
    }
    options = {name: value for name, value in given.items() if value is not None}
    if keep_unused:
        options["keep_unused"] = True
    if inline:
        options["inline"] = True

    def wrap(fn: Callable):
        _use_persistent_cache()
        return jax.jit(fn, **options)

    return wrap if func is None else wrap(func)


def cdiv(a, b):
    """`ceil(a / b)` for `b > 0`: a Python int for integer scalars (NumPy's too), an array for arrays.

    Floor division of `a + b - 1` is exact for negative `a` as well (upstream's array path truncated)."""
    if isinstance(a, numbers.Integral) and isinstance(b, numbers.Integral):
        return (int(a) + int(b) - 1) // int(b)
    return (a + b - 1) // b


_SCALARS = (bool, int, float, complex, str, bytes, type(None), np.generic, np.dtype)


def _leaf_signature(leaf: Any) -> tuple:
    """What of one leaf decides a compiled program: shape, dtype and sharding of arrays; value of scalars."""
    if isinstance(leaf, jax.core.Tracer):
        return (tuple(leaf.shape), np.dtype(leaf.dtype).name)
    if isinstance(leaf, jax.Array | np.ndarray):
        described = (tuple(leaf.shape), np.dtype(leaf.dtype).name)
        sharding = getattr(leaf, "sharding", None)
        return (*described, repr(sharding)) if sharding is not None else described
    if isinstance(leaf, _SCALARS) or (isinstance(leaf, type) and issubclass(leaf, np.generic)):
        return (type(leaf).__name__, repr(leaf))
    return (type(leaf).__name__,)


def _get_args_signature(args: tuple, kwargs: dict) -> str:
    """A deterministic string of `(args, kwargs)`: the tree structure and each leaf's `_leaf_signature`.

    EasyDeL hashes it into a module's static hash; scalar values count (upstream counted only their type,
    so two configs differing in a value hashed alike)."""
    leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
    return str((treedef, [_leaf_signature(leaf) for leaf in leaves]))
