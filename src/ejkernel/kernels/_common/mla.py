"""What every multi-head latent attention (MLA) implementation shares: checks, canonical options, the absorbed form.

Keys and values are stored compressed, one latent row `c_j [rank]` per token (`key_value [B, Sk, rank]`),
and decompressed per key/value head: `k_j = c_j · w_kc[:, g]`, `v_j = c_j · w_vc[:, g]`. The absorbed
form never decompresses them. Folding `w_kc` into the query, `q · k_j = (w_kc[:, g] · q) · c_j`, every
query head scores directly against the latent rows; the weighted sum of latent rows then goes through
`w_vc[:, g]` once per query. All heads share one latent "key/value head" (multi-query attention of head
dim `rank (+ rope)`), so the attention is any MQA implementation, and nothing per head is kept per token.

RoPE modes (by which of `b_q`, `b_k` are given): none (`query [.., d_nope]`); only `b_k [B, Sk, d_rope]`
(`query [.., d_nope + d_rope]`, its last `d_rope` dims score against `b_k`); both (decoupled: `query
[.., d_nope]` and `b_q [B, Sq, d_rope]` or `[B, Sq, Hq, d_rope]`, which scores against `b_k`). Rope key
dims are shared by all heads, so they append to the latent key rows.

`absorbed_attention` is the whole absorbed form around a flash attention: the XLA implementation, and
the differentiated path of the kernels, which take their backward from it.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from ejkernel.kernels._common.attention import check_broadcastable
from ejkernel.kernels._common.attention_call import AttentionCall
from ejkernel.kernels._common.bounds import check_packed, clamp_packed
from ejkernel.kernels._common.checks import require_float
from ejkernel.types.windows import window_pair


@dataclasses.dataclass(frozen=True)
class MlaDims:
    """Sizes of one call."""

    batch: int
    q_len: int
    kv_len: int
    num_heads: int
    num_kv_heads: int
    rank: int
    nope_dim: int
    rope_dim: int  # 0 without RoPE
    value_dim: int

    @property
    def group(self) -> int:
        return self.num_heads // self.num_kv_heads


def _shape(x) -> tuple | None:
    return None if x is None else tuple(x.shape)


def check_inputs(query, key_value, w_kc, w_vc, b_q=None, b_k=None) -> MlaDims:
    """Ranks, shapes and a shared float dtype of the tensors; the RoPE mode's dims. ValueError / TypeError."""
    layouts = {
        "query": (query, 4, "[batch, seq_q, heads, dim]"),
        "key_value": (key_value, 3, "[batch, seq_k, rank]"),
        "w_kc": (w_kc, 3, "[rank, kv_heads, d_nope]"),
        "w_vc": (w_vc, 3, "[rank, kv_heads, d_v]"),
        "b_k": (b_k, 3, "[batch, seq_k, d_rope]"),
    }
    for name, (x, rank, layout) in layouts.items():
        if x is not None and getattr(x, "ndim", None) != rank:
            raise ValueError(f"{name} must be {layout}, got shape {_shape(x)}")
    if b_q is not None and getattr(b_q, "ndim", None) not in (3, 4):
        raise ValueError(f"b_q must be [batch, seq_q, d_rope] or [batch, seq_q, heads, d_rope], got {_shape(b_q)}")
    tensors = {"query": query, "key_value": key_value, "w_kc": w_kc, "w_vc": w_vc, "b_q": b_q, "b_k": b_k}
    for name, x in tensors.items():
        require_float(name, x)
    dtypes = {name: x.dtype for name, x in tensors.items() if x is not None}
    if len(set(dtypes.values())) > 1:
        raise TypeError(f"query, key_value, w_kc, w_vc, b_q and b_k must share a dtype, got {dtypes}")

    batch, q_len, num_heads, q_dim = query.shape
    kv_len, rank = key_value.shape[1], key_value.shape[2]
    num_kv_heads, nope_dim = w_kc.shape[1], w_kc.shape[2]
    if key_value.shape[0] != batch:
        raise ValueError(f"key_value must be [batch={batch}, seq_k, rank], got {key_value.shape}")
    if w_kc.shape[0] != rank or w_vc.shape[:2] != (rank, num_kv_heads):
        raise ValueError(
            f"w_kc and w_vc must be [rank={rank}, kv_heads, ...] with the same kv_heads, got {w_kc.shape}, {w_vc.shape}"
        )
    if num_kv_heads == 0 or num_heads % num_kv_heads:
        raise ValueError(f"query heads ({num_heads}) must be a multiple of kv_heads ({num_kv_heads})")
    rope_dim = 0
    if b_q is not None and b_k is None:
        raise ValueError("b_q (the query's RoPE part) needs b_k (the keys' RoPE part)")
    if b_k is not None:
        rope_dim = b_k.shape[2]
        if b_k.shape[:2] != (batch, kv_len):
            raise ValueError(f"b_k must be [batch={batch}, seq_k={kv_len}, d_rope], got {b_k.shape}")
    if b_q is not None:
        expected = [(batch, q_len, rope_dim), (batch, q_len, num_heads, rope_dim)]
        if b_q.shape not in expected:
            raise ValueError(f"b_q must be {expected[0]} or {expected[1]} (d_rope from b_k), got {b_q.shape}")
    want_q = nope_dim + (rope_dim if b_k is not None and b_q is None else 0)
    if q_dim != want_q:
        mode = (
            "d_nope + d_rope (b_k only: the query holds its RoPE part)" if b_q is None and b_k is not None else "d_nope"
        )
        raise ValueError(f"query's last dim must be {mode} = {want_q}, got {q_dim}")
    return MlaDims(batch, q_len, kv_len, num_heads, num_kv_heads, rank, nope_dim, rope_dim, w_vc.shape[2])


def packed_segment_ids(cu_seqlens, length: int) -> jax.Array:
    """Segment id of each of `length` positions for sequences packed by `cu_seqlens [N+1]`; -1 past the last."""
    positions = jnp.arange(length, dtype=jnp.int32)
    bounds = cu_seqlens.astype(jnp.int32)
    ids = jnp.searchsorted(bounds[1:], positions, side="right").astype(jnp.int32)
    return jnp.where(positions < bounds[-1], ids, -1)


@dataclasses.dataclass(frozen=True)
class MlaCall:
    """A checked call: its sizes and the canonical options of the attention over the latent rows."""

    dims: MlaDims
    attention: AttentionCall


def canonical_call(
    query,
    key_value,
    w_kc,
    w_vc,
    b_q=None,
    b_k=None,
    cu_seqlens=None,
    *,
    softmax_scale=None,
    causal=False,
    attention_mask=None,
    bias=None,
    softmax_aux=None,
    logits_soft_cap=None,
    deterministic=True,
    dropout_rng=None,
    dropout_prob=0.0,
    sliding_window=None,
    softmax_dtype=None,
) -> MlaCall:
    """Checks a call of the public contract and turns its options into flash attention's `AttentionCall`.

    The default scale is `1 / sqrt(d_nope + d_rope)` (the head dim of the decompressed scores);
    `cu_seqlens` becomes segment ids (tokens past its last bound are padding, with zero output; traced
    bounds are clamped first, each into `[previous bound, S]`, the first to 0);
    dropout (`dropout_prob > 0` and `deterministic=False`) draws its seed from `dropout_rng`. The
    softmax runs in float32 whatever `softmax_dtype` (None or a float dtype) says.
    """
    dims = check_inputs(query, key_value, w_kc, w_vc, b_q, b_k)
    if softmax_dtype is not None and not jnp.issubdtype(jnp.dtype(softmax_dtype), jnp.floating):
        raise TypeError(f"softmax_dtype must be a float dtype, got {softmax_dtype}")
    if not 0.0 <= dropout_prob < 1.0:
        raise ValueError(f"dropout_prob must be in [0, 1), got {dropout_prob}")
    dropout = dropout_prob > 0.0 and not deterministic
    if dropout and dropout_rng is None:
        raise ValueError("dropout (dropout_prob > 0 with deterministic=False) needs dropout_rng")
    if logits_soft_cap is not None and not logits_soft_cap > 0:
        raise ValueError(f"logits_soft_cap must be positive, got {logits_soft_cap}")
    batch, heads, q_len, kv_len = dims.batch, dims.num_heads, dims.q_len, dims.kv_len
    if bias is not None:
        require_float("bias", bias)
        check_broadcastable("bias", bias, batch, heads, q_len, kv_len, seq_broadcast=False)
    if attention_mask is not None:
        if attention_mask.dtype != jnp.bool_ and not jnp.issubdtype(attention_mask.dtype, jnp.integer):
            raise TypeError(
                f"attention_mask must be boolean or integer (nonzero = attend; additive masks go in bias), "
                f"got dtype {attention_mask.dtype}"
            )
        check_broadcastable("attention_mask", attention_mask, batch, heads, q_len, kv_len, seq_broadcast=False)
    if softmax_aux is not None and (
        softmax_aux.ndim != 1 or softmax_aux.size == 0 or not jnp.issubdtype(softmax_aux.dtype, jnp.floating)
    ):
        raise ValueError(
            f"softmax_aux must be a non-empty 1-D float array, got {softmax_aux.dtype}{list(softmax_aux.shape)}"
        )
    q_seg = kv_seg = None
    if cu_seqlens is not None:
        if q_len != kv_len:
            raise ValueError(
                f"cu_seqlens packs one sequence axis: query and key_value lengths differ ({q_len}, {kv_len})"
            )
        check_packed("cu_seqlens", cu_seqlens, q_len)
        bounds = clamp_packed(cu_seqlens, q_len)
        q_seg = kv_seg = jnp.broadcast_to(packed_segment_ids(bounds, q_len), (batch, q_len))
    if softmax_scale is None:
        softmax_scale = (dims.nope_dim + dims.rope_dim) ** -0.5
    window = None if sliding_window is None else window_pair(sliding_window, "sliding_window")
    seed = jax.random.bits(dropout_rng, dtype=jnp.uint32) if dropout else None
    attention = AttentionCall(
        softmax_scale=float(softmax_scale),
        causal=bool(causal),
        sliding_window=window,
        logits_soft_cap=None if logits_soft_cap is None else float(logits_soft_cap),
        dropout_prob=float(dropout_prob) if dropout else 0.0,
        q_segment_ids=q_seg,
        kv_segment_ids=kv_seg,
        attention_mask=None if attention_mask is None else attention_mask.astype(bool),
        dropout_seed=seed,
    )
    return MlaCall(dims, attention)


def absorbed_query(query, w_kc, b_q, b_k, dims: MlaDims) -> jax.Array:
    """`[B, Sq, Hq, rank + d_rope]`: each head's no-RoPE query folded through its `w_kc`, then its RoPE part."""
    nope = query[..., : dims.nope_dim]
    nope = nope.reshape(dims.batch, dims.q_len, dims.num_kv_heads, dims.group, dims.nope_dim)
    latent = jnp.einsum("bshgd,rhd->bshgr", nope, w_kc, preferred_element_type=jnp.float32)
    latent = latent.reshape(dims.batch, dims.q_len, dims.num_heads, dims.rank).astype(query.dtype)
    if b_k is None:
        return latent
    if b_q is None:
        rope = query[..., dims.nope_dim :]
    else:
        rope = b_q if b_q.ndim == 4 else jnp.broadcast_to(b_q[:, :, None], (*latent.shape[:3], dims.rope_dim))
    return jnp.concatenate([latent, rope.astype(query.dtype)], axis=-1)


def latent_keys(key_value, b_k) -> jax.Array:
    """`[B, Sk, 1, rank + d_rope]`: the latent rows with the shared RoPE key dims appended (one head)."""
    keys = key_value if b_k is None else jnp.concatenate([key_value, b_k], axis=-1)
    return keys[:, :, None]


def expand_values(latent_out, w_vc, dims: MlaDims, dtype) -> jax.Array:
    """`[B, Sq, Hq, rank]` weighted latent rows -> `[B, Sq, Hq, Dv]` through each head's `w_vc`."""
    grouped = latent_out.reshape(dims.batch, dims.q_len, dims.num_kv_heads, dims.group, dims.rank)
    out = jnp.einsum("bshgr,rhd->bshgd", grouped, w_vc, preferred_element_type=jnp.float32)
    return out.reshape(dims.batch, dims.q_len, dims.num_heads, dims.value_dim).astype(dtype)


def absorbed_attention(
    attention, query, key_value, w_kc, w_vc, b_q=None, b_k=None, cu_seqlens=None, *, cfg=None, **options
):
    """`[B, Sq, Hq, Dv]` (semantics and options: `flash_mla_reference`) in the absorbed form over `attention`.

    `attention` is a flash attention called as `flash_attention_xla` is (`query, key, value, bias,
    softmax_aux, call`, `fwd_params` / `bwd_params`); its tiles come from `cfg`. All
    query heads attend, as one multi-query group, to the latent rows; per-head keys and values are never
    built, and gradients reach every input through `attention`'s VJP and plain autodiff of the folds.
    """
    call = canonical_call(query, key_value, w_kc, w_vc, b_q, b_k, cu_seqlens, **options)
    latent_out = attention(
        absorbed_query(query, w_kc, b_q, b_k, call.dims),
        latent_keys(key_value, b_k),
        key_value[:, :, None],
        options.get("bias"),
        options.get("softmax_aux"),
        call.attention,
        fwd_params=getattr(cfg, "fwd_params", None),
        bwd_params=getattr(cfg, "bwd_params", None),
    )
    return expand_values(latent_out, w_vc, call.dims, query.dtype)
