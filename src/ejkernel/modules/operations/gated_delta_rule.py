"""`gated_delta_rule`: the delta rule with a per-head decay (Gated DeltaNet), with packed segments and sharding.

Per token: `h ← h·exp(decay_t)`, `u_t = beta_t (v_t − hᵀ k_t)`, `h ← h + k_t u_tᵀ`, `o_t = (Dk^-½ · q_t)ᵀ h`,
with q and k L2-normalised along `Dk` by default (`ejkernel.reference.linear_attention.delta_rule_reference`).
"""

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from ejkernel.kernels._common.linear_attention.checks import check_chunk_size, check_linear_call
from ejkernel.modules.operations._common import executor, typechecked
from ejkernel.modules.operations._linear_attention import ChunkedConfig, ChunkedKernel
from ejkernel.ops import Invocation
from ejkernel.ops.executor import specs_by_slot
from ejkernel.registry import Backend, Platform, implementations

IMPLEMENTATIONS = implementations(
    "gated_delta_rule",
    (Platform.TRITON, Backend.GPU, "ejkernel.kernels._triton.linear_attention:gated_delta_rule_triton"),
    (Platform.XLA, Backend.ANY, "ejkernel.kernels._xla.linear_attention:gated_delta_rule"),
)


@dataclasses.dataclass(frozen=True)
class GatedDeltaRuleConfig(ChunkedConfig):
    """How `gated_delta_rule` runs: the fields of `ChunkedConfig` (platform, chunk size, Triton
    tiling); none changes the result beyond rounding."""


class GatedDeltaRule(ChunkedKernel):
    """The executor's `Kernel` for `gated_delta_rule`: op id `"gated_delta_rule"`, config `GatedDeltaRuleConfig`.

    Autotuning (policy `autotune`) times the default config and the call's `autotune_chunk_candidates` (else
    chunks of 32, 64 and 128 tokens), on forward and backward for a differentiated call.
    """

    op_id = "gated_delta_rule"
    config_type = GatedDeltaRuleConfig

    def axis_roles(self, args, kwargs):
        """Batch and heads split alike, and the value channels; the key channels (the state's products)
        never. The sequence is the op's own check."""
        per_token = ("batch", None, "heads")
        inputs = {0: ("query", (*per_token, "state")), 1: ("key", (*per_token, "state"))}
        inputs |= {2: ("value", (*per_token, "features")), 3: ("beta", per_token), 4: ("decay", per_token)}
        inputs |= {5: ("seg_ids", ("batch", None)), 6: ("initial_state", ("batch", "heads", "state", "features"))}
        out = (*per_token, "features")
        return inputs, (out, ("batch", "heads", None, "features")) if kwargs.get("return_state") else out

    def chunk_sizes(self, inv: Invocation) -> tuple[int, ...]:
        return inv.kwargs["autotune_chunk_candidates"] or super().chunk_sizes(inv)


@typechecked
def gated_delta_rule(
    query: Float[Array, "batch seq heads dim_k"],
    key: Float[Array, "batch seq heads dim_k"],
    value: Float[Array, "batch seq heads dim_v"],
    beta: Float[Array, "batch seq heads"],
    decay: Float[Array, "batch seq heads"] | None = None,
    seg_ids: Int[Array, "batch seq"] | Float[Array, "batch heads dim_k dim_v"] | None = None,
    initial_state: Float[Array, "batch heads dim_k dim_v"] | None = None,
    /,
    *,
    autotune_chunk_candidates: tuple[int, ...] | list[int] | None = None,
    use_qk_l2norm: bool = True,
    use_chunked: bool = True,
    return_state: bool = False,
    platform: str | None = None,
    cfg: GatedDeltaRuleConfig | None = None,
    mesh: jax.sharding.Mesh | None = None,
    in_specs=None,
    out_specs=None,
):
    """Gated DeltaNet: the delta rule with a per-head decay, with packed segments and sharding.

    Per batch row and head, with a float32 `[dim_k, dim_v]` state `h`, each token does `h ← h · exp(decay_t)`,
    `u_t = beta_t (v_t − hᵀ k_t)`, `h ← h + k_t u_tᵀ`, `o_t = (dim_k^-½ · q_t)ᵀ h`
    (`ejkernel.reference.linear_attention.delta_rule_reference`). With `use_qk_l2norm`, q and k are first
    divided by `sqrt(Σ x² + 1e-6)` along `dim_k`, in float32. A one-token call with an `initial_state` is a
    decode step.

    `seg_ids` packs sequences into a row: the state restarts from zeros at a token whose id differs from that
    of the row's previous non-padding token, and tokens with a negative id are padding (zero output, state
    untouched). Every integer is valid, under `jit` too.

    Upstream 0.0.78's order, `(query, key, value, beta, decay, initial_state)`, also works (EasyDeL calls it
    so): a float `[batch, heads, dim_k, dim_v]` array sixth, with nothing seventh, is the initial state, and a
    sixth spec in `in_specs` is its spec.

    Args:
        query: `[batch, seq, heads, dim_k]`, any float dtype; key and value share it.
        key: `[batch, seq, heads, dim_k]` (as many heads as the query).
        value: `[batch, seq, heads, dim_v]`.
        beta: `[batch, seq, heads]` float, the write strength of each token.
        decay: `[batch, seq, heads]` float, a log decay per head and token (the factor is `exp(decay)`);
            None (default): none.
        seg_ids: `[batch, seq]` integer segment ids, as above; None (default): each row is one sequence.
        initial_state: `[batch, heads, dim_k, dim_v]`, any float dtype, the state before each row's first
            sequence (later ones start from zeros); None (default): zeros.
        autotune_chunk_candidates: Tuple or list of chunk sizes (positive powers of two) for autotuning to
            try; None (default): 32, 64 and 128. It never changes the result.
        use_qk_l2norm: L2-normalise q and k as above (default True).
        use_chunked: True (default): the chunked form; False: the recurrent form (token by token), on `xla`
            whatever `platform` or `cfg` say (it has no other implementation).
        return_state: Also return the final state (default False).
        platform: `"auto"`, `"xla"` or `"triton"`; None (default): `cfg.platform`, else auto.
        cfg: A `GatedDeltaRuleConfig` fixing platform and tiling; None (default): the executor's choice
            (cache, tuning or heuristics).
        mesh: A `jax.sharding.Mesh` to run the op on under `shard_map`; None (default): no sharding. Needs
            `in_specs` and `out_specs`.
        in_specs: A `PartitionSpec` per tensor passed, or per positional slot (None where nothing is passed).
            They may shard the batch, the heads and the value channels; never the sequence or `dim_k`.
        out_specs: The output's spec, or `(out, state)` specs with `return_state`, laid out as the inputs.

    Returns:
        `out [batch, seq, heads, dim_v]` in the query's dtype, or with `return_state` the pair
        `(out, final_state)`, `final_state` float32 `[batch, heads, dim_k, dim_v]`: each row's state after
        its last token.

    Raises:
        TypeError: An argument of another rank, dtype kind or named size than above (one line naming it),
            query, key and value of different dtypes, a float sixth argument beside an `initial_state`, or
            a `cfg` of another class.
        ValueError: An `autotune_chunk_candidates` entry that is not a positive power of two; `in_specs` that
            shard the sequence or split any other axis the op computes across, or specs that disagree with
            each other or with `out_specs`; only some of `mesh`, `in_specs`, `out_specs`; a `platform` that
            is unknown, has no implementation on this device or contradicts `cfg.platform`.
        NotImplementedError: `platform="triton"` with `dim_k` or `dim_v` not a power of two in [16, 256].

    Example:
        >>> import jax, numpy as np
        >>> from ejkernel.modules import gated_delta_rule
        >>> rng = np.random.default_rng(0)
        >>> q, k, v = rng.standard_normal((3, 1, 6, 2, 16), np.float32)
        >>> beta = rng.random((1, 6, 2), np.float32)
        >>> decay = -rng.random((1, 6, 2), np.float32)
        >>> seg_ids = np.array([[0, 0, 0, 1, 1, -1]])  # two sequences, then a padding token
        >>> attend = lambda *a: gated_delta_rule(*a, return_state=True)
        >>> out, state = jax.jit(attend)(q, k, v, beta, decay, seg_ids)
        >>> print(out.shape, out.dtype, state.shape, state.dtype)
        (1, 6, 2, 16) float32 (1, 2, 16, 16) float32
        >>> bool((out[0, 5] == 0).all())  # the padding token
        True
    """
    if seg_ids is not None and jnp.issubdtype(seg_ids.dtype, jnp.floating):
        if initial_state is not None:
            raise TypeError(
                "gated_delta_rule: the sixth argument is seg_ids (integer [B, S]) or, with nothing seventh, the "
                f"initial state (float [B, H, Dk, Dv]); got a float array {tuple(seg_ids.shape)} and an initial_state"
            )
        seg_ids, initial_state = None, seg_ids
        if in_specs is not None and len(in_specs) >= 6:
            in_specs = (*in_specs[:5], None, *in_specs[5:])
    if not use_chunked:
        platform, cfg = "xla", None if cfg is None else dataclasses.replace(cfg, platform="xla")
    check_linear_call(
        query,
        key,
        value,
        grouped=False,
        gates={"beta": (beta, "head"), "decay": (decay, "head")},
        initial_state=initial_state,
        seg_ids=seg_ids,
    )
    if autotune_chunk_candidates is not None:
        autotune_chunk_candidates = tuple(autotune_chunk_candidates)
        for size in autotune_chunk_candidates:
            check_chunk_size("autotune_chunk_candidates", size)
    tensors = (query, key, value, beta, decay, seg_ids, initial_state)
    by_slot = {} if in_specs is None else specs_by_slot("gated_delta_rule", tensors, in_specs, mesh)
    if any(tuple(spec or ())[1:2] not in ((), (None,)) for slot, spec in by_slot.items() if slot < 6):  # per token
        raise ValueError(
            f"gated_delta_rule runs a recurrence along the sequence: in_specs must not shard axis 1, got {in_specs}"
        )
    return executor(
        GatedDeltaRule(),
        *tensors,
        autotune_chunk_candidates=autotune_chunk_candidates,
        use_qk_l2norm=bool(use_qk_l2norm),
        use_chunked=bool(use_chunked),
        return_state=bool(return_state),
        platform=platform,
        cfg=cfg,
        mesh=mesh,
        in_specs=in_specs,
        out_specs=out_specs,
    )
