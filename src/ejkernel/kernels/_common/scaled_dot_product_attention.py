"""What every scaled dot-product attention route shares: its rule for query rows that see no key.

jax.nn gives a query row that sees no key (all masked, but within its query length) the mean of V;
ours gives zeros, as `flash_attention` and `attention` do: every route zeros those rows afterwards
(`zero_rows_without_keys`), computed from the same masking options jax.nn reads.
"""

import jax.numpy as jnp


def rows_with_keys(
    batch: int,
    q_len: int,
    kv_len: int,
    *,
    mask=None,
    is_causal: bool = False,
    query_seq_lengths=None,
    key_value_seq_lengths=None,
    local_window_size: tuple[int, int] | None = None,
):
    """Bool `[B|1, Sq, H|1, 1]`: whether query row i sees at least one key under jax.nn's rules (top-left
    causal j <= i, window i - left <= j <= i + right, i < query length, j < key length, dense `mask`).

    The positional rules and lengths leave each row one interval of keys, so without a dense mask this
    costs O(B * Sq); with one it costs what the mask does."""
    i = jnp.arange(q_len, dtype=jnp.int32)
    lo = jnp.zeros((1, q_len), jnp.int32)
    hi = jnp.full((1, q_len), kv_len - 1, jnp.int32)
    if local_window_size is not None:
        left, right = local_window_size
        lo = jnp.maximum(lo, i - left)
        hi = jnp.minimum(hi, i + right)
    if is_causal:
        hi = jnp.minimum(hi, i)
    if key_value_seq_lengths is not None:
        hi = jnp.minimum(hi, key_value_seq_lengths.astype(jnp.int32)[:, None] - 1)
    seen = lo <= hi  # [1|B, Sq]
    if query_seq_lengths is not None:
        seen = seen & (i < query_seq_lengths.astype(jnp.int32)[:, None])
    if mask is None:
        return seen[:, :, None, None]
    mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)  # broadcastable to [B, H, Sq, Sk], as jax.nn takes it
    j = jnp.arange(kv_len, dtype=jnp.int32)
    in_interval = (lo[..., None] <= j) & (j <= hi[..., None])  # [1|B, Sq, Sk]
    seen = seen[:, None] & jnp.any(mask & in_interval[:, None], axis=-1)  # [B|1, H|1, Sq]
    return jnp.swapaxes(seen, 1, 2)[..., None]


def zero_rows_without_keys(out, query, key, *, mask=None, **options):
    """`out [B, Sq, H, D]` with the rows that see no key set to 0 (their gradients are then 0 too)."""
    seen = rows_with_keys(
        query.shape[0],
        query.shape[1],
        key.shape[1],
        mask=mask,
        is_causal=options.get("is_causal", False),
        query_seq_lengths=options.get("query_seq_lengths"),
        key_value_seq_lengths=options.get("key_value_seq_lengths"),
        local_window_size=options.get("local_window_size"),
    )
    return jnp.where(seen, out, jnp.zeros((), out.dtype))
