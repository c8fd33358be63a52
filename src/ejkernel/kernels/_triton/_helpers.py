"""Numerics shared by the Pallas-Triton kernels: matmuls, block-range arithmetic, masking predicates.

Everything here runs inside kernel bodies (traced int32 scalars from `pl.program_id`, 2-D tiles) and
lowers through Triton. Positions are absolute indices; a sliding window is a static `(left, right)`
pair meaning `i - left <= j <= i + right`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu


def resolve_interpret(interpret: bool | None, who: str) -> bool:
    """Whether to run Pallas interpret mode: as asked, else compiled on a GPU.

    Off a GPU, `interpret=None` is an error rather than a silent switch to interpret mode (orders of
    magnitude slower): a GPU kernel called on a CPU host says so, and tests ask for interpretation.
    """
    if interpret is not None:
        return bool(interpret)
    backend = jax.default_backend()
    if backend != "gpu":
        raise RuntimeError(
            f"{who} is a GPU kernel and this device is {backend}: use the xla platform here, or call it with "
            "interpret=True to run it in Pallas interpret mode (slow; meant for tests)"
        )
    return False


def dot(a: jax.Array, b: jax.Array, *, trans_a: bool = False, trans_b: bool = False) -> jax.Array:
    """2-D matmul `op(a) @ op(b)` accumulated in float32, or int32 for integer operands (op = transpose when asked).

    float32 operands multiply in full float32 (Triton's default for them would be TF32).
    """
    dims = (((0 if trans_a else 1,), (1 if trans_b else 0,)), ((), ()))
    precision = lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
    accumulate = jnp.int32 if jnp.issubdtype(a.dtype, jnp.integer) else jnp.float32
    return lax.dot_general(a, b, dims, precision=precision, preferred_element_type=accumulate)


def exp2(x: jax.Array, *, interpret: bool) -> jax.Array:
    """2**x of a float32 tile; compiled for a GPU, one `ex2.approx.ftz` per element.

    `jnp.exp2` lowers to libdevice's exp2f, which wraps the same hardware instruction in handling for
    subnormal results; softmax weights below 2**-126 may as well be 0, and the saved instructions are
    a tenth of the forward's time where it is bound by instruction issue (head dim 64).
    """
    if interpret:
        return jnp.exp2(x)
    if x.dtype != jnp.float32:
        raise TypeError(f"exp2 expects a float32 tile, got {x.dtype}")
    [y] = plgpu.elementwise_inline_asm(
        "ex2.approx.ftz.f32 $0, $1;",
        args=[x],
        constraints="=f,f",
        pack=1,
        result_shape_dtypes=[jax.ShapeDtypeStruct(x.shape, x.dtype)],
    )
    return y


def _floor_div(x, d: int):
    """floor(max(x, 0) / d) for a traced int32 scalar `x` and a positive static `d`."""
    return lax.div(jnp.maximum(x, 0), jnp.int32(d))


def _ceil_div(x, d: int):
    """ceil(max(x, 0) / d)."""
    return lax.div(jnp.maximum(x, 0) + (d - 1), jnp.int32(d))


def _clamp(x, lo, hi):
    return jnp.minimum(jnp.maximum(x, lo), hi)


def right_reach(causal: bool, window: tuple[int, int] | None) -> int | None:
    """How far right of its own position a query may look (`j <= i + reach`); None = unbounded."""
    reach = None
    if causal:
        reach = 0
    if window is not None:
        reach = window[1] if reach is None else min(reach, window[1])
    return reach


def kv_blocks_for_q_block(
    q_start, *, block_q: int, block_k: int, kv_len: int, causal: bool, window: tuple[int, int] | None
):
    """Key blocks that a query block `[q_start, q_start + block_q)` must visit, split by masking need.

    Returns traced `(lo, mid_lo, mid_hi, hi)`: blocks `[lo, hi)` may hold allowed keys; the blocks in
    `[mid_lo, mid_hi)` are allowed for every (query, key) pair of the tile as far as positions go
    (causal, window, key length), so they need no positional mask; `[lo, mid_lo)` and `[mid_hi, hi)`
    are the edges that do. Blocks outside `[lo, hi)` are fully masked and skipped.
    """
    reach = right_reach(causal, window)
    left = None if window is None else window[0]
    num_blocks = -(-kv_len // block_k)  # blocks past the true key length hold only padding
    full_blocks = kv_len // block_k  # blocks entirely inside the true key length
    q_last = q_start + (block_q - 1)
    lo = jnp.int32(0) if left is None else _floor_div(q_start - left, block_k)
    hi = jnp.int32(num_blocks) if reach is None else jnp.minimum(_ceil_div(q_last + reach + 1, block_k), num_blocks)
    hi = jnp.maximum(hi, lo)
    mid_lo = lo if left is None else _clamp(_ceil_div(q_last - left, block_k), lo, hi)
    mid_hi = (
        jnp.int32(full_blocks) if reach is None else jnp.minimum(_floor_div(q_start + reach + 1, block_k), full_blocks)
    )
    mid_hi = _clamp(mid_hi, mid_lo, hi)
    return lo, mid_lo, mid_hi, hi


def q_blocks_for_kv_block(
    k_start, *, block_q: int, block_k: int, q_len: int, kv_len: int, causal: bool, window: tuple[int, int] | None
):
    """Query blocks that a key block `[k_start, k_start + block_k)` must visit (the transpose view).

    Same `(lo, mid_lo, mid_hi, hi)` convention as `kv_blocks_for_q_block`. Query blocks entirely past
    the true query length are skipped (their rows are padding with a zero output cotangent).
    """
    reach = right_reach(causal, window)
    left = None if window is None else window[0]
    num_blocks = -(-q_len // block_q)
    k_last = k_start + (block_k - 1)
    lo = jnp.int32(0) if reach is None else _floor_div(k_start - reach, block_q)
    hi = jnp.int32(num_blocks) if left is None else jnp.minimum(_ceil_div(k_last + left + 1, block_q), num_blocks)
    # A key block holding only padding keys attends to nothing.
    hi = jnp.where(k_start >= kv_len, lo, jnp.maximum(hi, lo))
    mid_lo = lo if reach is None else _clamp(_ceil_div(k_last - reach, block_q), lo, hi)
    mid_hi = hi if left is None else _floor_div(k_start + left + 1, block_q)
    # A key block that runs past the true key length needs the length mask everywhere.
    mid_hi = jnp.where(k_start + block_k > kv_len, mid_lo, _clamp(mid_hi, mid_lo, hi))
    return lo, mid_lo, mid_hi, hi


def position_mask(q_pos, k_pos, *, kv_len: int, kv_len_padded: int, causal: bool, window: tuple[int, int] | None):
    """Boolean tile: key `k_pos` is allowed for query `q_pos` by position (None = all allowed).

    `q_pos` and `k_pos` are int32 arrays that broadcast against each other into the tile shape.
    """
    ok = None

    def both(a, b):
        return b if a is None else a & b

    if kv_len != kv_len_padded:
        ok = both(ok, k_pos < kv_len)
    if causal:
        ok = both(ok, k_pos <= q_pos)
    if window is not None:
        left, right = window
        ok = both(ok, (k_pos >= q_pos - left) & (k_pos <= q_pos + right))
    return ok


def and_masks(*masks):
    """Conjunction of the given boolean tiles, skipping None; None when all are None."""
    out = None
    for m in masks:
        if m is not None:
            out = m if out is None else out & m
    return out


_NO_SEGMENT = 2**30


def segment_span(segment_ids):
    """(lowest, highest) valid (non-negative) id of a 1-D tile of segment ids; `(2**30, -1)` if none."""
    valid = segment_ids >= 0
    return jnp.min(jnp.where(valid, segment_ids, _NO_SEGMENT)), jnp.max(jnp.where(valid, segment_ids, -1))


def segment_guarded(step, own_span, other_ids_ref, block: int):
    """`step(i, carry)`, run only when block `i` of `other_ids_ref` may share a segment with `own_span`.

    Packed documents have sorted segment ids, so a tile pair whose id ranges do not meet is fully masked:
    skipping it saves its loads and matmuls (a block-diagonal mask then costs only its diagonal).
    """

    def run(i, carry):
        lo, hi = segment_span(other_ids_ref[pl.ds(pl.multiple_of(i * block, block), block)])
        meets = (own_span[0] <= hi) & (lo <= own_span[1])
        return lax.cond(meets, step, lambda _, unchanged: unchanged, i, carry)

    return run
