"""`gla_attention`: gated linear attention, a per-key-channel decaying state instead of a softmax over keys.

Per batch row and head: `h_t = h_{t-1} ⊙ exp(g_t + g_gamma)[:, None] + k_t v_tᵀ`, `o_t = (scale · q_t)ᵀ h_t`
(`ejkernel.reference.linear_attention`). Time and memory are linear in the sequence length.
"""

import dataclasses
from typing import ClassVar

from jaxtyping import Array, Float, Int

from ejkernel.kernels._common.linear_attention.entries import check_gla_call, resolve_scale
from ejkernel.modules.operations._common import executor, typechecked
from ejkernel.modules.operations._linear_attention import ChunkedConfig, ChunkedKernel
from ejkernel.ops import Invocation
from ejkernel.ops.config import BOOL, POSITIVE_INT, POWER_OF_TWO, KernelTiling, Rule, power_of_two_at_least
from ejkernel.ops.kernel import FORWARD
from ejkernel.registry import Backend, Platform, implementations

IMPLEMENTATIONS = implementations(
    "gla",
    (Platform.TRITON, Backend.GPU, "ejkernel.kernels._triton.linear_attention:gla_attention_triton"),
    (Platform.XLA, Backend.ANY, "ejkernel.kernels._xla.linear_attention:gla_attention"),
)


MATMUL_EDGES = ("state_k", "state_v", "block_v", "block_k", "head_block_k")
WARPS = ("state_warps", "scores_warps", "output_warps", "grads_warps", "head_scores_warps", "head_grads_warps")


@dataclasses.dataclass(frozen=True)
class GLAttentionTritonTiling(KernelTiling):
    """The Triton platform's tiling of `gla_attention` (`GLAttentionConfig.triton_tiling`); the xla platform
    does not read it. A field left None keeps the kernels' own default (in brackets); none changes the
    result beyond rounding. Tiles are clipped to the head dims (`dim_k`, `dim_v`).

    Attributes:
        state_k: Key channels of the state tile each program of the two sequential passes carries (the chunk
            states forward, their gradients backward; one program per batch row, head and state tile) [64].
        state_v: Value channels of that state tile [64].
        block_v: Value columns per program of the output kernel (forward) [128].
        block_k: Key channels per program of the gradient kernel (backward: dq, dk, dv and the gate's
            gradient; below `dim_k`, dv is summed over programs) [64].
        head_span: State heads per program of the per-head gradient kernel where heads share q and k [8].
        state_warps: Warps of the sequential passes [4].
        scores_warps: Warps of the in-chunk scores kernel (forward) [2].
        output_warps: Warps of the output kernel [4].
        grads_warps: Warps of the gradient kernel [4].
        head_block_k: `block_k` of the kernels of a gate per head (`g` None: only `g_gamma` decays) [128].
        head_scores_warps: Warps of the scores kernel of a gate per head [4].
        head_grads_warps: Warps of the gradient kernel of a gate per head [8].
        num_stages: Software-pipelining stages of every GLA kernel [2].
        state_unroll: Chunks each loop step of the sequential state passes takes (a power of two) [4].
        fuse_head_scores: With a gate per head, a call that is not differentiated makes each chunk's scores
            in the output kernel instead of writing them to memory [True].

    Raises:
        ValueError: A tile (`state_k`, `state_v`, `block_v`, `block_k`, `head_block_k`) that is not a power
            of two of at least 16, a `head_span`, `state_unroll` or warp count that is not a positive power of
            two, a `num_stages` that is not a positive int, or a `fuse_head_scores` that is not a bool; one line
            naming the field.

    Example:
        >>> from ejkernel.modules import GLAttentionConfig, GLAttentionTritonTiling
        >>> cfg = GLAttentionConfig(platform="triton", triton_tiling=GLAttentionTritonTiling(block_k=32))
        >>> cfg.to_json()
        '{"backend": "any", "platform": "triton", "triton_tiling": {"block_k": 32}, "type": "GLAttentionConfig"}'
    """

    state_k: int | None = None
    state_v: int | None = None
    block_v: int | None = None
    block_k: int | None = None
    head_span: int | None = None
    state_warps: int | None = None
    scores_warps: int | None = None
    output_warps: int | None = None
    grads_warps: int | None = None
    head_block_k: int | None = None
    head_scores_warps: int | None = None
    head_grads_warps: int | None = None
    num_stages: int | None = None
    state_unroll: int | None = None
    fuse_head_scores: bool | None = None

    RULES: ClassVar[dict[str, Rule]] = {
        **dict.fromkeys(MATMUL_EDGES, power_of_two_at_least(16)),
        **dict.fromkeys(("head_span", "state_unroll", *WARPS), POWER_OF_TWO),
        "num_stages": POSITIVE_INT,
        "fuse_head_scores": BOOL,
    }


@dataclasses.dataclass(frozen=True)
class GLAttentionConfig(ChunkedConfig):
    """How `gla_attention` runs: the fields of `ChunkedConfig` (platform, chunk size, `fwd_params`), and the
    Triton kernels' tiling; none changes the result beyond rounding.

    Attributes:
        triton_tiling: A `GLAttentionTritonTiling`: the tiles and warps of the Triton GLA kernels (each field
            says which kernel it steers); read by the Triton platform only. None (default): the kernels'
            defaults, as every config written before this field existed.

    Raises:
        ValueError: As `ChunkedConfig`; or a `triton_tiling` of another type.
    """

    triton_tiling: GLAttentionTritonTiling | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.triton_tiling is not None and not isinstance(self.triton_tiling, GLAttentionTritonTiling):
            raise ValueError(
                f"{type(self).__name__}.triton_tiling must be a GLAttentionTritonTiling, got {self.triton_tiling!r}"
            )


TRITON_FORWARD_TILINGS = (
    GLAttentionTritonTiling(state_k=32),  # twice the programs of the sequential passes (small batch x heads)
    GLAttentionTritonTiling(block_v=64),  # twice the programs of the output kernel
    GLAttentionTritonTiling(num_stages=3),
)
"""Triton tilings autotuning times beside the default on every call: the passes of the forward."""

TRITON_TRAIN_TILINGS = (
    GLAttentionTritonTiling(block_k=32),  # the gradient kernel (the heaviest: half of forward + backward)
    GLAttentionTritonTiling(grads_warps=8),
)
"""And on a differentiated call: the gradient kernel's tile and warps."""


class GLAttention(ChunkedKernel):
    """The executor's `Kernel` for `gla_attention`: op id `"gla"`, config `GLAttentionConfig`.

    Autotuning (policy `autotune`) times the default config and chunks of 32, 64 and 128 tokens, on forward
    and backward for a differentiated call (`ChunkedKernel`); on the Triton platform also a few tilings
    (`TRITON_FORWARD_TILINGS`, and `TRITON_TRAIN_TILINGS` for a differentiated call).
    """

    op_id = "gla"
    config_type = GLAttentionConfig

    def platform_cfgs(self, platform: str, inv: Invocation):
        yield from super().platform_cfgs(platform, inv)
        if platform != "triton":
            return
        train = TRITON_TRAIN_TILINGS if inv.mode != FORWARD else ()
        for tiling in (*TRITON_FORWARD_TILINGS, *train):
            yield GLAttentionConfig(platform=platform, triton_tiling=tiling)


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
    check_gla_call(query, key, value, g, g_gamma, initial_state, cu_seqlens)
    return executor(
        GLAttention(),
        query,
        key,
        value,
        g,
        g_gamma,
        initial_state,
        cu_seqlens,
        softmax_scale=resolve_scale(softmax_scale, query),
        reverse=bool(reverse),
        return_state=bool(return_state),
        platform=platform,
        cfg=cfg,
    )
