"""`gated_delta_rule`: the delta rule with a per-head decay (Gated DeltaNet), with packed segments and sharding.

Per token: `h ← h·exp(decay_t)`, `u_t = beta_t (v_t − hᵀ k_t)`, `h ← h + k_t u_tᵀ`, `o_t = (Dk^-½ · q_t)ᵀ h`,
with q and k L2-normalised along `Dk` by default (`ejkernel.reference.linear_attention.delta_rule_reference`).
"""

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from ejkernel.kernels._common.linear_attention import ChunkedConfig, ChunkedKernel, check_chunk_size, check_linear_call
from ejkernel.modules.operations._common import executor, typechecked
from ejkernel.ops import Invocation
from ejkernel.ops.executor import specs_by_slot


@dataclasses.dataclass(frozen=True)
class GatedDeltaRuleConfig(ChunkedConfig):
    """The tiling of the chunked form (see `ChunkedConfig`)."""


class GatedDeltaRule(ChunkedKernel):
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
    """The gated delta rule over `[batch, seq, heads, dim]` inputs; `beta` is the per-token write strength.

    `decay [B,S,H]` is a per-head log decay (the factor is `exp(decay)`), optional. `seg_ids [B,S]`
    packs sequences into a row: the state restarts from zeros where the id changes, and tokens with a
    negative id are padding (zeros out, state untouched); every integer is valid, under `jit` too.
    `initial_state [B,H,Dk,Dv]` seeds each row's first sequence. `use_chunked=False` runs the XLA
    recurrent form; a one-token call with an `initial_state` is a decode step.
    `autotune_chunk_candidates` are the chunk sizes autotuning tries.
    Returns `out [B,S,H,Dv]`, or `(out, final_state float32)` with `return_state`. With `mesh`,
    `in_specs` (one per tensor passed, or per positional slot) may shard batch and heads, never the sequence.

    Upstream 0.0.78's order, `(query, key, value, beta, decay, initial_state)`, also works (EasyDeL calls it
    so): a float `[B,H,Dk,Dv]` array sixth, with nothing seventh, is the initial state, and a sixth spec in
    `in_specs` is its spec. `use_chunked=False` runs on `xla` whatever `platform` or `cfg` say (the
    recurrent form has no other implementation).
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
