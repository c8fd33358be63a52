"""What every public op function shares: the executor, argument checks and the typing legend.

Shape symbols (jaxtyping): `batch`, `seq`/`seq_q`/`seq_k`, `heads`/`kv_heads`, `dim`, `tokens`,
`features`; `...` stands for any trailing dims.
"""

from typing import Any

import jax
import jax.numpy as jnp
from beartype import BeartypeConf, beartype
from jaxtyping import jaxtyped

from ejkernel.kernels._common.bounds import check_with
from ejkernel.ops import create_default_executor

executor = create_default_executor()

typechecked = jaxtyped(typechecker=beartype(conf=BeartypeConf(is_pep484_tower=True)))
"""Decorator for public op functions: checks jaxtyping shape annotations with beartype at each call.
An int passes where a float is annotated (`softmax_scale=1`, `logits_soft_cap=30`), as in Python's typing."""


def require_float(name: str, x: Any) -> None:
    if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
        raise TypeError(f"{name} must be a floating-point array, got dtype {jnp.result_type(x)}")


def require_int(name: str, x: Any) -> None:
    if not jnp.issubdtype(jnp.result_type(x), jnp.integer):
        raise TypeError(f"{name} must be an integer array, got dtype {jnp.result_type(x)}")


def require_rank(name: str, x: jax.Array, ranks: tuple[int, ...] | range, layout: str) -> None:
    if x.ndim not in ranks:
        raise ValueError(f"{name} must have layout {layout}, got shape {tuple(x.shape)}")


def require_lengths(name: str, lengths: jax.Array, batch: int, length: int) -> None:
    """Per-row valid lengths: integer `[batch]`, each in `[0, length]` (values checked outside `jit`, and
    under it with `EJKERNEL_CHECKS=1`; the op states its rule for others)."""
    require_int(name, lengths)
    if lengths.shape != (batch,):
        raise ValueError(f"{name} must be [batch] = ({batch},), got shape {tuple(lengths.shape)}")
    in_range = lambda xp, values: (values >= 0) & (values <= length)
    check_with(name, lengths, in_range, f"[0, {length}] (the length of the axis)")
