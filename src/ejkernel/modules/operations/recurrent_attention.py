"""`recurrent_attention`: the general gated linear recurrence, with per-head, per-key and per-value gates.

`h_t = h_{t-1} ⊙ (exp(g_t) · exp(g_gamma) · exp(gk_t)[:, None] · exp(gv_t)[None, :]) + k_t v_tᵀ`,
`o_t = (scale · q_t)ᵀ h_t` (`ejkernel.reference.linear_attention`); every gate is optional.
"""

import dataclasses

from jaxtyping import Array, Float, Int

from ejkernel.kernels._common.linear_attention.checks import check_linear_call
from ejkernel.modules.operations._common import executor, typechecked
from ejkernel.modules.operations._linear_attention import ChunkedConfig, ChunkedKernel
from ejkernel.registry import Backend, Platform, implementations

IMPLEMENTATIONS = implementations(
    "recurrent",
    (Platform.TRITON, Backend.GPU, "ejkernel.kernels._triton.linear_attention:recurrent_attention_triton"),
    (Platform.XLA, Backend.ANY, "ejkernel.kernels._xla.linear_attention:recurrent_attention"),
)


@dataclasses.dataclass(frozen=True)
class RecurrentAttentionConfig(ChunkedConfig):
    """How `recurrent_attention` runs: the fields of `ChunkedConfig` (platform, chunk size, Triton
    tiling); none changes the result beyond rounding."""


class RecurrentAttention(ChunkedKernel):
    """The executor's `Kernel` for `recurrent_attention`: op id `"recurrent"`, config `RecurrentAttentionConfig`.

    Autotuning (policy `autotune`) times the default config and chunks of 32, 64 and 128 tokens, on forward
    and backward for a differentiated call (`ChunkedKernel`).
    """

    op_id = "recurrent"
    config_type = RecurrentAttentionConfig


@typechecked
def recurrent_attention(
    query: Float[Array, "batch seq heads dim_k"],
    key: Float[Array, "batch seq kv_heads dim_k"],
    value: Float[Array, "batch seq kv_heads dim_v"],
    g: Float[Array, "batch seq heads"] | Float[Array, "batch seq heads dim_k"] | None = None,
    g_gamma: Float[Array, "*gamma_batch heads"] | None = None,
    gk: Float[Array, "batch seq heads dim_k"] | None = None,
    gv: Float[Array, "batch seq heads dim_v"] | None = None,
    initial_state: Float[Array, "num_states heads dim_k dim_v"] | None = None,
    cu_seqlens: Int[Array, " num_seqs_plus_1"] | None = None,
    /,
    *,
    softmax_scale: float | None = None,
    reverse: bool = False,
    return_state: bool = False,
    platform: str | None = None,
    cfg: RecurrentAttentionConfig | None = None,
):
    """The general gated linear recurrence: gates per head, per key channel and per value channel.

    Per batch row and head, with a float32 `[dim_k, dim_v]` state,
    `h_t = h_{t-1} ⊙ (exp(g_t) · exp(g_gamma) · exp(gk_t)[:, None] · exp(gv_t)[None, :]) + k_t v_tᵀ` and
    `o_t = (softmax_scale · q_t)ᵀ h_t` (`ejkernel.reference.linear_attention`). Every gate is an optional log
    decay (the factor is `exp(gate)`). Key/value may have fewer heads than the query: query head h reads
    key/value head `h // (heads // kv_heads)`. A `gv`, or packed decoding (fewer than `num_seqs + 1`
    tokens), runs the recurrent form (token by token, on XLA).

    With `cu_seqlens` the batch is 1 and holds `num_seqs` sequences back to back, each with its own
    recurrence and state. Bounds must rise from 0, never decreasing, to `seq` exactly: a ValueError outside
    `jit` (under it too with `EJKERNEL_CHECKS=1`); otherwise, under `jit`, each bound is clamped into
    `[previous bound, seq]`, the first to 0 and the last to `seq` (a sequence past `seq` is empty), and the
    result is that of the clamped bounds.

    Args:
        query: `[batch, seq, heads, dim_k]`, any float dtype; key and value share it.
        key: `[batch, seq, kv_heads, dim_k]`; `kv_heads` divides `heads`.
        value: `[batch, seq, kv_heads, dim_v]`.
        g: `[batch, seq, heads]` float, a log decay per head and token; or `[batch, seq, heads, dim_k]`
            (upstream's shape), then a key-channel gate that joins `gk` (log decays add). None (default): none.
        g_gamma: `[heads]`, or `[1 or batch, heads]`, float: a constant log decay per head, at every token;
            None (default): none.
        gk: `[batch, seq, heads, dim_k]` float, a log decay per key channel and token; None (default): none.
        gv: `[batch, seq, heads, dim_v]` float, a log decay per value channel and token; None (default): none.
        initial_state: `[batch, heads, dim_k, dim_v]` (`[num_seqs, heads, dim_k, dim_v]` with `cu_seqlens`),
            any float dtype, the state before the first token; None (default): zeros.
        cu_seqlens: `[num_seqs + 1]` integer bounds of packed sequences, as above; None (default): each batch
            row is one sequence.
        softmax_scale: Multiplies the query; None (default): `dim_k ** -0.5`.
        reverse: Run each sequence from its last token to its first (default False); the state then enters
            at the last token and leaves after the first.
        return_state: Also return the final state (default False).
        platform: `"auto"`, `"xla"` or `"triton"`; None (default): `cfg.platform`, else auto.
        cfg: A `RecurrentAttentionConfig` fixing platform and tiling; None (default): the executor's choice
            (cache, tuning or heuristics).

    Returns:
        `out [batch, seq, heads, dim_v]` in the query's dtype, or with `return_state` the pair
        `(out, final_state)`, `final_state` float32 and shaped like `initial_state`.

    Raises:
        TypeError: An argument of another rank, dtype kind or named size than above (one line naming it),
            query, key and value of different dtypes, or a `cfg` of another class.
        ValueError: `heads` not a multiple of `kv_heads`; `g_gamma`, `initial_state` or `cu_seqlens` of a
            wrong shape; `cu_seqlens` with `batch` > 1 or with bad bounds (rule above); a `platform` that is
            unknown, has no implementation on this device or contradicts `cfg.platform`.
        NotImplementedError: `platform="triton"` for a call it does not serve: the recurrent form (a `gv`,
            packed decoding), or `dim_k` or `dim_v` not a power of two in [16, 256].

    Example:
        >>> import jax, numpy as np
        >>> from ejkernel.modules import recurrent_attention
        >>> rng = np.random.default_rng(0)
        >>> q, k = rng.standard_normal((2, 1, 6, 2, 8), np.float32)
        >>> v = rng.standard_normal((1, 6, 2, 4), np.float32)
        >>> g = -rng.random((1, 6, 2), np.float32)  # per head
        >>> gv = -rng.random((1, 6, 2, 4), np.float32)  # per value channel
        >>> out = jax.jit(recurrent_attention)(q, k, v, g, None, None, gv)
        >>> print(out.shape, out.dtype)
        (1, 6, 2, 4) float32
    """
    if g is not None and g.ndim == 4:
        g, gk = None, g if gk is None else gk + g
    dk, _ = check_linear_call(
        query,
        key,
        value,
        grouped=True,
        gates={"g": (g, "head"), "gk": (gk, "dim_k"), "gv": (gv, "dim_v")},
        g_gamma=g_gamma,
        initial_state=initial_state,
        cu_seqlens=cu_seqlens,
    )
    return executor(
        RecurrentAttention(),
        query,
        key,
        value,
        g,
        g_gamma,
        gk,
        gv,
        initial_state,
        cu_seqlens,
        softmax_scale=dk**-0.5 if softmax_scale is None else float(softmax_scale),
        reverse=bool(reverse),
        return_state=bool(return_state),
        platform=platform,
        cfg=cfg,
    )
