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

from ejkernel.kernels._common.checks import check_values, checks_enabled, is_traced
from ejkernel.modules.operations._common import executor
from ejkernel.ops import FwdParams, Invocation, Kernel, KernelConfig
from ejkernel.registry import Backend, Platform, implementations

IMPLEMENTATIONS = implementations(
    "ragged_gated_delta_rule",
    (
        Platform.PALLAS,
        Backend.GPU,
        "ejkernel.kernels._pallas.gpu.ragged_gated_delta_rule:ragged_gated_delta_rule_mosaic_gpu",
    ),
    (
        Platform.TRITON,
        Backend.GPU,
        "ejkernel.kernels._triton.ragged_gated_delta_rule:ragged_gated_delta_rule_triton",
    ),
    (Platform.XLA, Backend.ANY, "ejkernel.kernels._xla.ragged_gated_delta_rule:ragged_gated_delta_rule_xla"),
)


def _check_chunk_size(name: str, value) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
        raise ValueError(f"{name} must be a positive int (tokens per prefill chunk) or None, got {value!r}")


@dataclasses.dataclass(frozen=True)
class RaggedGatedDeltaRuleConfig(KernelConfig):
    """How `ragged_gated_delta_rule` runs; no field changes the result beyond rounding.

    Attributes:
        chunk_size: Tokens per chunk of the chunked (prefill) form, any positive int (default 64, upstream's;
            Triton rounds it up to a power of two in [16, 32]: a larger chunk runs as 32, its fastest); None: the
            implementation's own (64 on XLA, 32 on Triton). A config given to the call always wins over the call's
            `chunk_size`.
        platform: `"auto"` (default), `"pallas"` (Mosaic GPU, Hopper: the decode step; prefill on Triton's
            kernels), `"triton"` (GPU) or `"xla"`.
        fwd_params: Triton only: `block_d`, the decode kernel's value columns per program (default 64), and
            `num_warps` (default 4); other fields are not read.
        bwd_params: Not read by this op.
        backend: `"any"` (default), `"gpu"`, `"tpu"` or `"cpu"`: the device kind the config is meant for; a
            call on another kind refuses it.

    Raises:
        ValueError: `chunk_size` is not a positive int or None, or `platform` or `backend` is unknown.
    """

    chunk_size: int | None = 64

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_chunk_size(f"{type(self).__name__}.chunk_size", self.chunk_size)


class RaggedGatedDeltaRule(Kernel):
    """The executor's `Kernel` for `ragged_gated_delta_rule`: config `RaggedGatedDeltaRuleConfig`.

    Without a measured config the call's `chunk_size` is used; autotuning (policy `autotune`) times chunks
    of 32, 64 and 128 tokens (16 and 32 on Triton and Mosaic GPU, whose prefill runs Triton's), and on Triton the
    decode kernel's 32, 64 or 128 value columns per program.
    """

    op_id = "ragged_gated_delta_rule"
    config_type = RaggedGatedDeltaRuleConfig

    def heuristic_cfg(self, inv: Invocation) -> RaggedGatedDeltaRuleConfig:
        """The call's `chunk_size` (None by default: the implementation's own)."""
        return RaggedGatedDeltaRuleConfig(platform=inv.platform, chunk_size=inv.kwargs["chunk_size"])

    def platform_cfgs(self, platform: str, inv: Invocation):
        columns = (32, 64, 128) if platform == "triton" else (None,)
        on_triton = platform in ("triton", "pallas")  # Mosaic GPU's prefill runs Triton's chunks: none above 32
        for size in (16, 32) if on_triton else (32, 64, 128):
            for block in columns:
                params = None if block is None else FwdParams(block_d=block)
                yield RaggedGatedDeltaRuleConfig(platform=platform, chunk_size=size, fwd_params=params)

    def busy_integers(self, args):
        """Requests of equal length filling the tokens, each on its own slot (zeros would be all empty)."""
        num_tokens, num_slots, num_requests = args[0].shape[0], args[5].shape[0], args[7].shape[0]
        slots = {7: jnp.arange(num_requests, dtype=jnp.int32) % num_slots}
        if args[6] is None:  # a decode batch: one token a request
            return slots
        bounds = np.linspace(0, num_tokens, num_requests + 1).astype(np.int32)
        return {6: jnp.asarray(bounds)} | slots

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
    required = {"beta": beta, "recurrent_state": recurrent_state, "state_indices": state_indices}
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
    if query_start_loc is None:  # a decode batch: token i is request i
        layout = "[tokens] (without query_start_loc, one token a request)"
        _check_array("state_indices", state_indices, 1, layout, floating=False)
        _check_shape("state_indices", state_indices, (num_tokens,), layout)
    else:
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
    slots, num_slots = xp.asarray(state_indices), recurrent_state.shape[0]
    valid = (slots >= 0) & (slots < num_slots)  # every slot of a decode batch; those of non-empty requests
    if query_start_loc is not None:
        bounds = xp.asarray(query_start_loc)
        lower = xp.concatenate([xp.zeros((1,), bounds.dtype), bounds[:-1]])
        expected = f"[query_start_loc[i - 1], {num_tokens}] (the bounds rise without decreasing within the tokens)"
        rising = (bounds >= lower) & (bounds <= num_tokens)
        check_values("query_start_loc", bounds, rising, expected)
        valid = valid | (bounds[1:] <= bounds[:-1]) | ~xp.all(rising)  # one error, as eagerly
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
    chunk_size: int | None = None,
    use_qk_l2norm: bool = True,
    platform: str | None = None,
    cfg: RaggedGatedDeltaRuleConfig | None = None,
    mesh: jax.sharding.Mesh | None = None,
    in_specs=None,
    out_specs=None,
) -> tuple[Float[Array, "tokens heads dim_v"], Float[Array, "slots heads dim_k dim_v"]]:
    """The gated delta rule for serving: packed requests, each continuing from its slot of a state pool.

    Request `r` runs over tokens `[query_start_loc[r], query_start_loc[r+1])` of the flat inputs, from state
    `recurrent_state[state_indices[r]]`, and its final state is written back there (Gated DeltaNet,
    Qwen3-Next). Per token, with the state `h` in float32: `h ← h · exp(decay_t)`,
    `u_t = beta_t (v_t − hᵀ k_t)`, `h ← h + k_t u_tᵀ`, `o_t = (dim_k^-½ · q_t)ᵀ h`, q and k first divided by
    `sqrt(Σ x² + 1e-6)` along `dim_k` with `use_qk_l2norm` (`ejkernel.reference.ragged_gated_delta_rule`).
    The state, the decode step and the solves are float32; on Triton (a GPU's first choice) the prefill's
    matmuls take bfloat16/float16 inputs as they come (float32 accumulation), as `gated_delta_rule` does.

    The offsets need not start at 0. Tokens of no request output zeros; slots of no non-empty request
    (empty requests included) come back unchanged; of non-empty requests sharing a slot, each reads the
    slot's old state and the first writes it. A call whose requests all have at most one token takes a
    decode path (one step each), any other call the chunked form for every request; both give the same
    result. Runs under `jit` with traced `query_start_loc` and `state_indices`: a bad value is a ValueError
    outside `jit` (under it too with `EJKERNEL_CHECKS=1`); otherwise, under `jit`, the bounds are clamped
    into `[0, tokens]` and made non-decreasing (a running max), and a non-empty request whose slot is
    outside `[0, slots)` is dropped (its tokens give zeros, no slot is written). Without `query_start_loc` the
    call is a decode batch: token `i` is request `i` on slot `state_indices[i]`, as `arange(tokens + 1)` bounds
    would give, known without looking at values, so the decode path runs alone (a serving engine's decode step;
    with bounds, telling the paths apart costs a `lax.cond`, whose predicate XLA reads on the host: 25 us of a
    363 us step on an H200). On a GPU (Mosaic GPU on Hopper, else Triton) the decode step updates the pool in
    place: under `jit` with `recurrent_state` donated, no copy of the pool is made. Meant for inference;
    `jax.grad` through it runs and differentiates the plain JAX computation (on every platform).

    Args:
        query: `[tokens, heads, dim_k]` float.
        key: `[tokens, heads, dim_k]` float.
        value: `[tokens, heads, dim_v]` float.
        beta: `[tokens, heads]` float, required: the write strength of each token.
        decay: `[tokens, heads]` float, a log decay per head and token (the factor is `exp(decay)`); None
            (default): no decay.
        recurrent_state: `[slots, heads, dim_k, dim_v]` float, required: the state pool.
        query_start_loc: `[num_requests + 1]` integer: the requests' token bounds, rising without decreasing,
            each in `[0, tokens]`; None (upstream requires it): a decode batch, one token a request.
        state_indices: `[num_requests]` integer, required: each request's slot, in `[0, slots)` for a
            non-empty request (an empty request's may be anything); `[tokens]` without `query_start_loc`.
        chunk_size: Tokens per chunk of the chunked form, any positive int; None (default): the
            implementation's own, 64 on XLA and 32 on Triton, which runs no larger chunk (upstream's default is
            64: on an H200, Triton's prefill of 8 × 2048 tokens took 0.97 ms at 32 against 1.79 at 64 in session
            57); a `cfg` given wins (its `chunk_size`); never changes the result beyond rounding.
        use_qk_l2norm: L2-normalise q and k as above (default True).
        platform: `"auto"`, `"pallas"` (Mosaic GPU, Hopper: the decode step; prefill on Triton's kernels),
            `"triton"` or `"xla"`; None (default): `cfg.platform`, else auto. It overrides
            `cfg.platform` rather than having to agree with it.
        cfg: A `RaggedGatedDeltaRuleConfig`; None (default): the executor's choice (cache, tuning, else the
            call's `chunk_size`).
        mesh: A `jax.sharding.Mesh` to run the op on under `shard_map`; None (default): no sharding. Needs
            `in_specs` and `out_specs`.
        in_specs: A `PartitionSpec` per tensor passed, or per positional slot. They may split the heads and
            the value channels, never the tokens, the slots, `dim_k` or the index arrays.
        out_specs: `(out, new_state)` specs, laid out as the inputs.

    Returns:
        tuple: `(out, new_state)`, with `out [tokens, heads, dim_v]` in the query's dtype and `new_state`,
        the pool after the writes, in `recurrent_state`'s dtype.

    Raises:
        TypeError: An argument that is not an array or of the wrong dtype kind, or a `cfg` of another class.
        ValueError: A required argument that is None; an array of a wrong rank or shape; a bad
            `query_start_loc` or `state_indices` value (rule above); `chunk_size` not a positive int or None;
            sharding specs that split what the op computes across or disagree; a `platform` that is unknown or
            has no implementation on this device.

    Example:
        >>> import jax, jax.numpy as jnp, numpy as np
        >>> from ejkernel.modules import ragged_gated_delta_rule
        >>> rng = np.random.default_rng(0)
        >>> q, k = rng.standard_normal((2, 5, 2, 8), np.float32)
        >>> v = rng.standard_normal((5, 2, 4), np.float32)
        >>> beta = rng.random((5, 2), np.float32)
        >>> pool = jnp.zeros((3, 2, 8, 4))  # 3 slots
        >>> query_start_loc = np.array([0, 4, 5])  # request 0: tokens 0-3, request 1: token 4
        >>> state_indices = np.array([2, 0])
        >>> run = jax.jit(ragged_gated_delta_rule)
        >>> out, new_pool = run(q, k, v, beta, None, pool, query_start_loc, state_indices)
        >>> print(out.shape, new_pool.shape, new_pool.dtype)
        (5, 2, 4) (3, 2, 8, 4) float32
        >>> bool((new_pool[1] == pool[1]).all())  # slot 1 serves no request
        True
    """
    tensors = (query, key, value, beta, decay, recurrent_state, query_start_loc, state_indices)
    query, key, value, beta, decay, recurrent_state, query_start_loc, state_indices = (
        jnp.asarray(x) if isinstance(x, np.ndarray) else x
        for x in tensors  # NumPy taken as jax.numpy takes it
    )
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
