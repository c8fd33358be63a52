"""What every public op function shares: the executor, argument checks and the typing legend.

Shape symbols (jaxtyping): `batch`, `seq`/`seq_q`/`seq_k`, `heads`/`kv_heads`, `dim`, `tokens`,
`features`; `...` stands for any trailing dims.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
from beartype import BeartypeConf, beartype
from jaxtyping import TypeCheckError, jaxtyped

from ejkernel.kernels._common.bounds import check_with
from ejkernel.kernels._common.checks import require_int
from ejkernel.ops import create_default_executor

executor = create_default_executor(checked=True)
"""The public functions' executor: each checks its call and resolves its defaults before running it here, and the
implementations reached skip those checks (`ejkernel.checked_calls`)."""

_jaxtyped = jaxtyped(typechecker=beartype(conf=BeartypeConf(is_pep484_tower=True)))


def typechecked(fn):
    """Decorator for public op functions: NumPy arrays become JAX arrays (as `jax.numpy` functions take
    them), then jaxtyping shape annotations are checked with beartype; a mismatch is one `TypeError` line
    naming the argument, the expected layout with the sizes the other arguments fixed, and what came.
    An int passes where a float is annotated (`softmax_scale=1`, `logits_soft_cap=30`), as in Python's typing."""
    checked = _jaxtyped(fn)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        args = tuple(jnp.asarray(a) if isinstance(a, np.ndarray) else a for a in args)
        kwargs = {k: jnp.asarray(v) if isinstance(v, np.ndarray) else v for k, v in kwargs.items()}
        try:
            return checked(*args, **kwargs)
        except TypeCheckError as err:
            raise TypeError(one_line_type_error(fn.__name__, str(err))) from None

    return call


def one_line_type_error(op: str, message: str) -> str:
    """jaxtyping's report, `op: <argument> must be <type> with <the sizes bound so far>, got <value>`."""
    found = lambda pattern: (re.search(pattern, message, re.M) or [None, None])[1]
    argument = found(r"typechecking parameter '(\w+)'") or ("the result" if "return value" in message else None)
    expected, actual = found(r"^Expected type: (.*?)\.?$"), found(r"^Actual value: (.*)$")
    if argument is None or expected is None:
        return f"{op}: " + message.splitlines()[0]
    expected = re.sub(r"<class '(.*?)'>", r"\1", expected).replace("jaxtyping.", "")
    layout = lambda m: f"{m[1].lower()} [{', '.join(m[2].split())}]"  # Float[Array, 'b s h d'] -> float [b, s, h, d]
    expected = re.sub(r"(\w+)\[Array, '([^']*)'\]", layout, expected)
    actual = re.sub(r"\((jax|numpy)\)$", "", actual or "")
    bound = dict(re.findall(r"^(\w+)=(\S+)$", message.split("axis annotation are as follows.")[-1], re.M))
    names = [n for n in re.findall(r"\w+", expected) if n in bound]
    sizes = f" with {', '.join(f'{n}={bound[n]}' for n in dict.fromkeys(names))}" if names else ""
    return f"{op}: {argument} must be {expected}{sizes}, got {actual}"


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
