"""The linear-attention ops' argument checks: the public functions and the implementations raise the same words."""

from __future__ import annotations

from ejkernel.kernels._common.bounds import check_packed
from ejkernel.kernels._common.checks import require_float, require_int


def config_chunk(cfg, default):
    """The chunk a call runs: its config's `chunk_size` where set, else `default` (a call's own `chunk_size`, or an
    implementation's default; None passes on, for an implementation to choose)."""
    return getattr(cfg, "chunk_size", None) or default


def require_shape(name: str, x, shape: tuple[int, ...], layout: str) -> None:
    if x is not None and tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} must be {layout} = {tuple(shape)}, got {tuple(x.shape)}")


def check_qkv(query, key, value, *, grouped: bool) -> tuple[int, int, int, int, int, int]:
    """Layout `[B, S, H, D]` for all three, one float dtype; returns `(B, S, H, Hkv, Dk, Dv)`.

    `grouped`: key/value may have fewer heads than the query (a divisor of it); else the same.
    """
    for name, x in (("query", query), ("key", key), ("value", value)):
        if x.ndim != 4:
            raise ValueError(f"{name} must be [batch, seq, heads, dim], got shape {tuple(x.shape)}")
        require_float(name, x)
    if not query.dtype == key.dtype == value.dtype:
        raise TypeError(f"query, key and value must share one dtype, got {query.dtype}, {key.dtype}, {value.dtype}")
    batch, seq_len, num_heads, dk = query.shape
    kv_heads = key.shape[2]
    if key.shape[:2] != (batch, seq_len) or key.shape[3] != dk:
        raise ValueError(f"key must be [batch, seq, kv_heads, dim_k] = [{batch}, {seq_len}, _, {dk}], got {key.shape}")
    if value.shape[:3] != key.shape[:3]:
        raise ValueError(f"value must be [batch, seq, kv_heads, dim_v] = {key.shape[:3]} + [_], got {value.shape}")
    if grouped and num_heads % kv_heads:
        raise ValueError(f"query heads ({num_heads}) must be a multiple of key/value heads ({kv_heads})")
    if not grouped and kv_heads != num_heads:
        raise ValueError(f"key and value must have as many heads as the query ({num_heads}), got {kv_heads}")
    return batch, seq_len, num_heads, kv_heads, dk, value.shape[3]


def check_g_gamma(g_gamma, batch: int, num_heads: int) -> None:
    """A constant log decay per head: `[H]`, or `[B, H]` / `[1, H]`."""
    if g_gamma is None:
        return
    require_float("g_gamma", g_gamma)
    if (
        g_gamma.ndim not in (1, 2)
        or g_gamma.shape[-1] != num_heads
        or (g_gamma.ndim == 2 and g_gamma.shape[0] not in (1, batch))
    ):
        raise ValueError(f"g_gamma must be [heads] = ({num_heads},) or [1|batch, heads], got {tuple(g_gamma.shape)}")


def check_cu_seqlens(cu_seqlens, batch: int, total: int) -> int:
    """Packed sequences: batch 1, `cu_seqlens [N+1]` integer from 0 to the token count; returns N.

    Bad values are a ValueError (under `jit` with `EJKERNEL_CHECKS=1` only; else `linear_attention`
    clamps them: `bounds.clamp_packed`, exact).
    """
    if cu_seqlens is None:
        return batch
    check_packed("cu_seqlens", cu_seqlens, total, exact=True)
    if batch != 1:
        raise ValueError(f"with cu_seqlens the sequences are packed along axis 1: batch must be 1, got {batch}")
    return cu_seqlens.shape[0] - 1


def check_state(initial_state, num_states: int, num_heads: int, dk: int, dv: int) -> None:
    require_float("initial_state", initial_state)
    require_shape(
        "initial_state", initial_state, (num_states, num_heads, dk, dv), "[batch or num_seqs, heads, dim_k, dim_v]"
    )


def check_chunk_size(name: str, chunk_size) -> None:
    if chunk_size is not None and (
        not isinstance(chunk_size, int)
        or isinstance(chunk_size, bool)
        or chunk_size <= 0
        or chunk_size & (chunk_size - 1)
    ):
        raise ValueError(f"{name} must be a positive power of two, got {chunk_size!r}")


def check_layer(layer_idx, num_layers) -> None:
    """Lightning attention's layer: ints with `0 <= layer_idx < num_layers`."""
    if not isinstance(num_layers, int) or isinstance(num_layers, bool) or num_layers < 1:
        raise ValueError(f"num_layers must be a positive int, got {num_layers!r}")
    if not isinstance(layer_idx, int) or isinstance(layer_idx, bool) or not 0 <= layer_idx < num_layers:
        raise ValueError(f"layer_idx must be an int in [0, num_layers={num_layers}), got {layer_idx!r}")


def check_linear_call(
    query, key, value, *, grouped: bool, gates=None, g_gamma=None, initial_state=None, cu_seqlens=None, seg_ids=None
) -> tuple[int, int]:
    """Every check of a linear-attention call; returns `(dim_k, number of states)`.

    `gates` maps a name to `(array or None, kind)`, kind "head" (`[B, S, H]`), "dim_k" (`[B, S, H, Dk]`)
    or "dim_v" (`[B, S, H, Dv]`); beta counts as a gate of kind "head". `seg_ids` is `[B, S]` integer.
    """
    batch, seq_len, num_heads, _, dk, dv = check_qkv(query, key, value, grouped=grouped)
    trailing = {"head": (), "dim_k": (dk,), "dim_v": (dv,)}
    for name, (x, kind) in (gates or {}).items():
        require_float(name, x)
        layout = "[batch, seq, heads]" if kind == "head" else f"[batch, seq, heads, {kind}]"
        require_shape(name, x, (batch, seq_len, num_heads, *trailing[kind]), layout)
    require_int("seg_ids", seg_ids)
    require_shape("seg_ids", seg_ids, (batch, seq_len), "[batch, seq]")
    check_g_gamma(g_gamma, batch, num_heads)
    num_states = check_cu_seqlens(cu_seqlens, batch, seq_len)
    check_state(initial_state, num_states, num_heads, dk, dv)
    return dk, num_states
