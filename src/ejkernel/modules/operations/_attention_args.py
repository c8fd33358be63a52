"""Argument checks shared by the dense attention ops (`flash_attention`, `attention`, ...)."""

import jax
from jax.sharding import PartitionSpec

from ejkernel.kernels._common.checks import require_float
from ejkernel.modules.operations._common import require_rank
from ejkernel.ops.axis_roles import sink_roles
from ejkernel.types.windows import window_pair


def check_qkv(query: jax.Array, key: jax.Array, value: jax.Array) -> None:
    """Ranks, a shared float dtype, and query heads a multiple of key/value heads."""
    for name, x in (("query", query), ("key", key), ("value", value)):
        require_float(name, x)
        require_rank(name, x, (4,), "[batch, seq, heads, dim]")
    if key.dtype != query.dtype or value.dtype != query.dtype:
        raise TypeError(f"query, key and value must share a dtype, got {query.dtype}, {key.dtype}, {value.dtype}")
    if query.shape[2] % key.shape[2]:
        raise ValueError(f"query heads ({query.shape[2]}) must be a multiple of key/value heads ({key.shape[2]})")


def parse_window(sliding_window) -> tuple[int, int] | None:
    """`None`, an int `w` (meaning `(w, w)`) or a `(left, right)` pair of non-negative ints."""
    return None if sliding_window is None else window_pair(sliding_window, "sliding_window")


def check_bias(bias: jax.Array | None, batch: int, heads: int, q_len: int, kv_len: int) -> jax.Array | None:
    """A bias of rank <= 4 broadcastable as `[1|B, 1|H, Sq, Sk]`, returned with rank 4."""
    if bias is None:
        return None
    bias = bias.reshape((1,) * (4 - bias.ndim) + bias.shape) if bias.ndim < 4 else bias
    if (
        bias.ndim != 4
        or bias.shape[0] not in (1, batch)
        or bias.shape[1] not in (1, heads)
        or bias.shape[2:]
        != (
            q_len,
            kv_len,
        )
    ):
        raise ValueError(f"bias must be [1|{batch}, 1|{heads}, {q_len}, {kv_len}], got {tuple(bias.shape)}")
    return bias


def dense_mask_spec(mask: jax.Array, q_spec, k_spec) -> PartitionSpec:
    """Shard spec of a `[1|B, 1|H, Sq, Sk]` mask: it follows the query's batch, heads and sequence and the keys'."""
    q_spec, k_spec = (tuple(s) + (None,) * 4 for s in (q_spec, k_spec))
    return PartitionSpec(
        q_spec[0] if mask.shape[0] > 1 else None, q_spec[2] if mask.shape[1] > 1 else None, q_spec[1], k_spec[1]
    )


def attention_roles(args, *, bias_at: int | None = 3, sinks_at: int | None = 4, heads_first: bool = False):
    """`Kernel.axis_roles` of a canonical attention call `(query, key, value, ...)` with the bias and sinks
    (each optional) at `bias_at` / `sinks_at`, in layout `[B, S, H, D]` (`heads_first`: `[B, H, S, D]`):
    batch, heads and query rows split freely and alike; head dims, and sinks shared by all heads, never.
    The key/value sequence is left to the op's own check."""
    query = args[0]
    num_heads = query.shape[1 if heads_first else 2]
    rows = lambda seq: ("batch", "heads", seq, "dim") if heads_first else ("batch", seq, "heads", "dim")
    inputs = {0: ("query", rows("queries")), 1: ("key", rows(None)), 2: ("value", rows(None))}
    bias = None if bias_at is None else args[bias_at]
    if bias is not None:  # [1|B, 1|H, Sq, Sk]: a broadcast axis has no role
        roles = ("batch" if bias.shape[0] > 1 else None, "heads" if bias.shape[1] > 1 else None, "queries", None)
        inputs[bias_at] = ("bias", roles)
    sinks = None if sinks_at is None else args[sinks_at]
    if sinks is not None:
        inputs[sinks_at] = ("softmax_aux", sink_roles(sinks, num_heads))
    out = ("batch", "heads", "queries", None) if heads_first else ("batch", "queries", "heads", None)
    return inputs, out
