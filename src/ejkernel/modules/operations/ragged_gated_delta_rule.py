"""`ragged_gated_delta_rule`: the gated delta rule for serving (Gated DeltaNet, Qwen3-Next), on packed requests.

Request `r` owns tokens `[query_start_loc[r], query_start_loc[r+1])` of flat `[T, H, D]` inputs and slot
`state_indices[r]` of a state pool `[S, H, Dk, Dv]`; per token `h ← h·exp(decay_t)`,
`u_t = beta_t (v_t − hᵀ k_t)`, `h ← h + k_t u_tᵀ`, `o_t = (Dk^-½ · q_t)ᵀ h`, with q and k L2-normalised
along `Dk` by default (`ejkernel.reference.ragged_gated_delta_rule`).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from ejkernel.modules.operations._common import executor
from ejkernel.ops import Invocation, Kernel, KernelConfig
from ejkernel.ops.checks import check_values, checks_enabled, is_traced


def _check_chunk_size(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive int (tokens per prefill chunk), got {value!r}")


@dataclasses.dataclass(frozen=True)
class RaggedGatedDeltaRuleConfig(KernelConfig):
    """`chunk_size`: tokens per chunk of the chunked prefill form (any positive int; it never changes results)."""

    chunk_size: int = 64

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_chunk_size(f"{type(self).__name__}.chunk_size", self.chunk_size)


class RaggedGatedDeltaRule(Kernel):
    op_id = "ragged_gated_delta_rule"
    config_type = RaggedGatedDeltaRuleConfig

    def heuristic_cfg(self, inv: Invocation) -> RaggedGatedDeltaRuleConfig:
        """The call's `chunk_size` (64 by default)."""
        return RaggedGatedDeltaRuleConfig(platform=inv.platform, chunk_size=inv.kwargs["chunk_size"])

    def platform_cfgs(self, platform: str, inv: Invocation):
        for size in (32, 64, 128):
            yield RaggedGatedDeltaRuleConfig(platform=platform, chunk_size=size)

    def busy_integers(self, args):
        """Requests of equal length filling the tokens, each on its own slot (zeros would be all empty)."""
        num_tokens, num_slots, num_requests = args[0].shape[0], args[5].shape[0], args[7].shape[0]
        bounds = np.linspace(0, num_tokens, num_requests + 1).astype(np.int32)
        return {6: jnp.asarray(bounds), 7: jnp.arange(num_requests, dtype=jnp.int32) % num_slots}

    def axis_roles(self, args, kwargs):
        """Heads split alike everywhere, and the value channels; tokens, state slots, key channels and the
        index arrays never (requests index tokens and slots globally)."""
        per_token = ("tokens", "heads")
        inputs = {0: ("query", (*per_token, "state")), 1: ("key", (*per_token, "state"))}
        inputs |= {2: ("value", (*per_token, "features")), 3: ("beta", per_token), 4: ("decay", per_token)}
        inputs |= {5: ("recurrent_state", ("slots", "heads", "state", "features"))}
        inputs |= {6: ("query_start_loc", ("tokens",)), 7: ("state_indices", ("tokens",))}
        return inputs, ((*per_token, "features"), ("slots", "heads", None, "features"))


def _check_array(name: str, x, rank: int, layout: str, floating: bool = True) -> None:
    kind, ok = ("a floating-point", jnp.floating) if floating else ("an integer", jnp.integer)
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"{name} must be an array {layout}, got {type(x).__name__}")
    if not jnp.issubdtype(x.dtype, ok):
        raise TypeError(f"{name} must be {kind} array, got dtype {x.dtype}")
    if x.ndim != rank:
        raise ValueError(f"{name} must be {layout}, got shape {tuple(x.shape)}")


def _check_shape(name: str, x, shape: tuple, layout: str) -> None:
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} must be {layout} = {tuple(shape)}, got {tuple(x.shape)}")


def _check_call(query, key, value, beta, decay, recurrent_state, query_start_loc, state_indices) -> None:
    """Shapes and dtypes, then the values of `query_start_loc` and `state_indices` (`check_values`)."""
    required = {"recurrent_state": recurrent_state, "query_start_loc": query_start_loc, "state_indices": state_indices}
    for name, x in required.items():
        if x is None:
            raise ValueError(f"{name} is required, got None")
    _check_array("query", query, 3, "[tokens, heads, dim_k]")
    num_tokens, num_heads, dk = query.shape
    _check_array("key", key, 3, "[tokens, heads, dim_k]")
    _check_shape("key", key, query.shape, "[tokens, heads, dim_k]")
    _check_array("value", value, 3, "[tokens, heads, dim_v]")
    _check_shape("value", value, (num_tokens, num_heads, value.shape[2]), "[tokens, heads, dim_v]")
    for name, x in (("beta", beta), ("decay", decay)):
        if x is not None:
            _check_array(name, x, 2, "[tokens, heads]")
            _check_shape(name, x, (num_tokens, num_heads), "[tokens, heads]")
    _check_array("recurrent_state", recurrent_state, 4, "[slots, heads, dim_k, dim_v]")
    state_shape = (recurrent_state.shape[0], num_heads, dk, value.shape[2])
    _check_shape("recurrent_state", recurrent_state, state_shape, "[slots, heads, dim_k, dim_v]")
    _check_array("query_start_loc", query_start_loc, 1, "[num_requests + 1]", floating=False)
    _check_array("state_indices", state_indices, 1, "[num_requests]", floating=False)
    if query_start_loc.shape[0] < 1:
        raise ValueError("query_start_loc must be [num_requests + 1], got shape (0,)")
    num_requests = query_start_loc.shape[0] - 1
    _check_shape("state_indices", state_indices, (num_requests,), "[num_requests] (len(query_start_loc) - 1)")
    traced = is_traced(query_start_loc, state_indices)
    if traced and not checks_enabled():
        return
    xp = jnp if traced else np
    bounds, slots = xp.asarray(query_start_loc), xp.asarray(state_indices)
    lower = xp.concatenate([xp.zeros((1,), bounds.dtype), bounds[:-1]])
    expected = f"[query_start_loc[i - 1], {num_tokens}] (the bounds rise without decreasing within the tokens)"
    rising = (bounds >= lower) & (bounds <= num_tokens)
    check_values("query_start_loc", bounds, rising, expected)
    busy = bounds[1:] > bounds[:-1]
    num_slots = recurrent_state.shape[0]
    valid = ~busy | ((slots >= 0) & (slots < num_slots)) | ~xp.all(rising)  # one error, as eagerly
    check_values("state_indices", slots, valid, f"[0, {num_slots}) (the slots of recurrent_state)")


def ragged_gated_delta_rule(
    query: Float[Array, "tokens heads dim_k"],
    key: Float[Array, "tokens heads dim_k"],
    value: Float[Array, "tokens heads dim_v"],
    beta: Float[Array, "tokens heads"],
    decay: Float[Array, "tokens heads"] | None = None,
    recurrent_state: Float[Array, "slots heads dim_k dim_v"] | None = None,
    query_start_loc: Int[Array, " num_requests_plus_1"] | None = None,
    state_indices: Int[Array, " num_requests"] | None = None,
    *,
    chunk_size: int = 64,
    use_qk_l2norm: bool = True,
    platform: str | None = None,
    cfg: RaggedGatedDeltaRuleConfig | None = None,
    mesh: jax.sharding.Mesh | None = None,
    in_specs=None,
    out_specs=None,
) -> tuple[Float[Array, "tokens heads dim_v"], Float[Array, "slots heads dim_k dim_v"]]:
    """The gated delta rule over packed requests, each continuing from its own slot of a state pool.

    Request `r` runs over tokens `[query_start_loc[r], query_start_loc[r+1])` (the offsets need not start
    at 0) from `recurrent_state[state_indices[r]]`, and its final state is written back there. Tokens of
    no request output zeros; slots of no non-empty request (empty requests included) are returned
    unchanged; of non-empty requests sharing a slot, the first writes it. `decay [T,H]` is a per-head
    log decay (None: no decay). Returns `(out [T,H,Dv] in query.dtype, new_state in recurrent_state.dtype)`.

    All math is float32. Requests of at most one token take a decode path, others the chunked form, with
    `chunk_size` tokens per chunk (a knob; `cfg.chunk_size` wins when `cfg` is given; `platform`
    overrides `cfg.platform`). Runs under `jit` with traced `query_start_loc` / `state_indices`: a bad
    value raises a ValueError outside `jit` (under `jit` too with `EJKERNEL_CHECKS=1`); otherwise under
    `jit` the bounds are clamped to `[0, T]` and made non-decreasing (a running max), and a non-empty
    request whose slot is outside `[0, S)` is dropped (its tokens give zeros, no slot is written).
    Meant for inference; `jax.grad` through it runs and differentiates the plain JAX computation. With
    `mesh`, `in_specs` (one per tensor passed, or per positional slot) may split heads and value
    channels, never tokens, slots or the index arrays.
    """
    _check_call(query, key, value, beta, decay, recurrent_state, query_start_loc, state_indices)
    _check_chunk_size("chunk_size", chunk_size)
    if platform is not None and isinstance(cfg, RaggedGatedDeltaRuleConfig):
        cfg = dataclasses.replace(cfg, platform=platform)
    return executor(
        RaggedGatedDeltaRule(),
        query,
        key,
        value,
        beta,
        decay,
        recurrent_state,
        query_start_loc,
        state_indices,
        chunk_size=chunk_size,
        use_qk_l2norm=bool(use_qk_l2norm),
        platform=platform,
        cfg=cfg,
        mesh=mesh,
        in_specs=in_specs,
        out_specs=out_specs,
    )
