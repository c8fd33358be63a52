"""`gla_attention`: gated linear attention, a per-key-channel decaying state instead of a softmax over keys.

Per batch row and head: `h_t = h_{t-1} ⊙ exp(g_t + g_gamma)[:, None] + k_t v_tᵀ`, `o_t = (scale · q_t)ᵀ h_t`
(`ejkernel.reference.linear_attention`). Time and memory are linear in the sequence length.
"""

import dataclasses

from jaxtyping import Array, Float, Int

from ejkernel.kernels._common.linear_attention.checks import check_linear_call
from ejkernel.modules.operations._common import executor, typechecked
from ejkernel.modules.operations._linear_attention import ChunkedConfig, ChunkedKernel
from ejkernel.registry import Backend, Platform, implementations

IMPLEMENTATIONS = implementations(
    "gla",
    (Platform.TRITON, Backend.GPU, "ejkernel.kernels._triton.linear_attention:gla_attention_triton"),
    (Platform.XLA, Backend.ANY, "ejkernel.kernels._xla.linear_attention:gla_attention"),
)


@dataclasses.dataclass(frozen=True)
class GLAttentionConfig(ChunkedConfig):
    """How `gla_attention` runs: the fields of `ChunkedConfig` (platform, chunk size, Triton
    tiling); none changes the result beyond rounding."""


class GLAttention(ChunkedKernel):
    """The executor's `Kernel` for `gla_attention`: op id `"gla"`, config `GLAttentionConfig`.

    Autotuning (policy `autotune`) times the default config and chunks of 32, 64 and 128 tokens, on forward
    and backward for a differentiated call (`ChunkedKernel`).
    """

    op_id = "gla"
    config_type = GLAttentionConfig


@typechecked
def gla_attention(
    query: Float[Array, "batch seq heads dim_k"],
    key: Float[Array, "batch seq kv_heads dim_k"],
    value: Float[Array, "batch seq kv_heads dim_v"],
    g: Float[Array, "batch seq heads dim_k"] | None = None,
    g_gamma: Float[Array, "*gamma_batch heads"] | None = None,
    initial_state: Float[Array, "num_states heads dim_k dim_v"] | None = None,
    cu_seqlens: Int[Array, " num_seqs_plus_1"] | None = None,
    /,
    *,
    softmax_scale: float | None = None,
    reverse: bool = False,
    return_state: bool = False,
    platform: str | None = None,
    cfg: GLAttentionConfig | None = None,
):
    """Gated linear attention: a `[dim_k, dim_v]` state per head, decayed per key channel.

    Per batch row and head, `h_t = h_{t-1} ⊙ exp(g_t + g_gamma)[:, None] + k_t v_tᵀ` and
    `o_t = (softmax_scale · q_t)ᵀ h_t` (`ejkernel.reference.linear_attention`), so time and memory are linear
    in the sequence length. The state is float32; both gates are log decays (the factor is `exp(gate)`,
    decaying where the gate is negative). Key/value may have fewer heads than the query: query head h reads
    key/value head `h // (heads // kv_heads)`.

    With `cu_seqlens` the batch is 1 and holds `num_seqs` sequences back to back, each with its own
    recurrence and state. Bounds must rise from 0, never decreasing, to `seq` exactly: a ValueError outside
    `jit` (under it too with `EJKERNEL_CHECKS=1`); otherwise, under `jit`, each bound is clamped into
    `[previous bound, seq]`, the first to 0 and the last to `seq` (a sequence past `seq` is empty), and the
    result is that of the clamped bounds.

    Args:
        query: `[batch, seq, heads, dim_k]`, any float dtype; key and value share it.
        key: `[batch, seq, kv_heads, dim_k]`; `kv_heads` divides `heads`.
        value: `[batch, seq, kv_heads, dim_v]`.
        g: `[batch, seq, heads, dim_k]` float, the log decay of each key channel per token; None (default):
            no such decay.
        g_gamma: `[heads]`, or `[1 or batch, heads]`, float: a constant log decay per head, added to `g` at
            every token; None (default): none.
        initial_state: `[batch, heads, dim_k, dim_v]` (`[num_seqs, heads, dim_k, dim_v]` with `cu_seqlens`),
            any float dtype, the state before the first token; None (default): zeros.
        cu_seqlens: `[num_seqs + 1]` integer bounds of packed sequences, as above; None (default): each batch
            row is one sequence.
        softmax_scale: Multiplies the query; None (default): `dim_k ** -0.5`.
        reverse: Run each sequence from its last token to its first (default False); the state then enters
            at the last token and leaves after the first.
        return_state: Also return the final state (default False).
        platform: `"auto"`, `"xla"` or `"triton"`; None (default): `cfg.platform`, else auto.
        cfg: A `GLAttentionConfig` fixing platform and tiling; None (default): the executor's choice (cache,
            tuning or heuristics).

    Returns:
        `out [batch, seq, heads, dim_v]` in the query's dtype, or with `return_state` the pair
        `(out, final_state)`, `final_state` float32 and shaped like `initial_state`.

    Raises:
        TypeError: An argument of another rank, dtype kind or named size than above (one line naming it),
            query, key and value of different dtypes, or a `cfg` of another class.
        ValueError: `heads` not a multiple of `kv_heads`; `g_gamma`, `initial_state` or `cu_seqlens` of a
            wrong shape; `cu_seqlens` with `batch` > 1 or with bad bounds (rule above); a `platform` that is
            unknown, has no implementation on this device or contradicts `cfg.platform`.
        NotImplementedError: `platform="triton"` for a call it does not serve: `dim_k` or `dim_v` not a power
            of two in [16, 256], or packed decoding (fewer than `num_seqs + 1` tokens), which runs on XLA.

    Example:
        >>> import jax, numpy as np
        >>> from ejkernel.modules import gla_attention
        >>> rng = np.random.default_rng(0)
        >>> q = rng.standard_normal((2, 16, 4, 8), np.float32)
        >>> k = rng.standard_normal((2, 16, 2, 8), np.float32)  # 2 key/value heads, 2 query heads each
        >>> v = rng.standard_normal((2, 16, 2, 32), np.float32)
        >>> g = -rng.random((2, 16, 4, 8), np.float32)  # log decays in (-1, 0]
        >>> out, state = jax.jit(lambda *a: gla_attention(*a, return_state=True))(q, k, v, g)
        >>> print(out.shape, out.dtype, state.shape, state.dtype)
        (2, 16, 4, 32) float32 (2, 4, 8, 32) float32
    """
    dk, _ = check_linear_call(
        query,
        key,
        value,
        grouped=True,
        gates={"g": (g, "dim_k")},
        g_gamma=g_gamma,
        initial_state=initial_state,
        cu_seqlens=cu_seqlens,
    )
    return executor(
        GLAttention(),
        query,
        key,
        value,
        g,
        g_gamma,
        initial_state,
        cu_seqlens,
        softmax_scale=dk**-0.5 if softmax_scale is None else float(softmax_scale),
        reverse=bool(reverse),
        return_state=bool(return_state),
        platform=platform,
        cfg=cfg,
    )
