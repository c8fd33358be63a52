"""`flash_mla`: multi-head latent attention over a compressed key/value cache, in the weight-absorbed form."""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec
from jaxtyping import Array, Float, Int, Shaped

from ejkernel.kernels._common.mla import canonical_call
from ejkernel.modules.operations._attention_args import check_bias, parse_window
from ejkernel.modules.operations._common import executor, typechecked
from ejkernel.ops import FwdParams, Invocation, Kernel, KernelConfig
from ejkernel.ops.axis_roles import sink_roles
from ejkernel.registry import Backend, Platform, implementations

IMPLEMENTATIONS = implementations(
    "flash_mla",
    (Platform.TRITON, Backend.GPU, "ejkernel.kernels._triton.flash_mla:flash_mla_triton"),
    (Platform.XLA, Backend.ANY, "ejkernel.kernels._xla.flash_mla:flash_mla_xla"),
)


@dataclasses.dataclass(frozen=True)
class FlashMLAConfig(KernelConfig):
    """Tiling of the attention over latent rows: `fwd_params` / `bwd_params` (`block_q` query rows,
    `block_k` latent rows per step, `num_warps`, `num_stages`), and `num_splits`, the pieces a kernel
    splits the context into when few queries leave the GPU idle (None: the kernel's choice).

    Values out of range are a ValueError when the config is built.

    Attributes:
        platform: Default `"auto"`. `"auto"`, `"xla"` or `"triton"` (the platforms with an implementation).
        fwd_params: Default None. `FwdParams` of the forward, as above.
        bwd_params: Default None. `BwdParams` of the backward.
        backend: Default `"any"`. The device kind the config is meant for (`"gpu"`, `"tpu"`, `"cpu"`); a call
            on another kind is refused (ValueError).
        num_splits: Default None. A positive int.

    Example:
        >>> from ejkernel.modules import FlashMLAConfig
        >>> FlashMLAConfig(platform="triton", num_splits=1).num_splits
        1
    """

    num_splits: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_splits is not None and (
            not isinstance(self.num_splits, int) or isinstance(self.num_splits, bool) or self.num_splits <= 0
        ):
            raise ValueError(f"FlashMLAConfig.num_splits must be a positive integer, got {self.num_splits!r}")


class FlashMLA(Kernel):
    """The `Kernel` the executor runs for `flash_mla` (op id `"flash_mla"`).

    It takes `(query, key_value, w_kc, w_vc, b_q, b_k, cu_seqlens)` with the options `flash_mla` resolved
    (shared sinks folded into one logit); call `flash_mla` rather than this class. Triton (GPU) is tried
    before XLA, its candidates over `block_q`, `block_k`, warps and `num_splits`.
    """

    op_id = "flash_mla"
    config_type = FlashMLAConfig

    def axis_roles(self, args, kwargs):
        """Batch and heads (of the query and of both weights) split alike; sequences, the latent rank and
        head dims never. Array options follow the query's batch and heads (`kwarg_specs`)."""
        query, _, _, _, b_q = args[:5]
        heads = query.shape[2]
        inputs = {0: ("query", ("batch", "seq", "heads", "dim")), 1: ("key_value", ("batch", "seq", "dim"))}
        inputs |= {2: ("w_kc", ("dim", "heads", "dim")), 3: ("w_vc", ("dim", "heads", "dim"))}
        b_q_roles = ("batch", "seq", "dim") if b_q is None or b_q.ndim == 3 else ("batch", "seq", "heads", "dim")
        inputs |= {4: ("b_q", b_q_roles), 5: ("b_k", ("batch", "seq", "dim")), 6: ("cu_seqlens", ("tokens",))}
        sinks = kwargs.get("softmax_aux")
        if sinks is not None:
            inputs["softmax_aux"] = ("softmax_aux", sink_roles(sinks, heads))
        for name in ("bias", "attention_mask"):
            if kwargs.get(name) is not None:
                x = kwargs[name]
                batched = "batch" if x.shape[0] > 1 else None
                inputs[name] = (name, (batched, "heads" if x.ndim == 4 and x.shape[1] > 1 else None))
        return inputs, ("batch", None, "heads", None)

    def kwarg_specs(self, kwargs, in_specs):
        """Sinks of more than one logit (one per head: `flash_mla` folds a shared list into one logit) follow
        the query heads' split; a bias or mask per batch row or head follows the query's batch and heads
        (shared ones stay whole)."""
        if kwargs.get("dropout_prob") and not kwargs.get("deterministic", True):  # masks from shard-local indices
            raise NotImplementedError(
                "flash_mla: dropout with mesh= would draw the same mask on every shard; "
                "call it without mesh= inside your own shard_map with a key per shard"
            )
        specs = super().kwarg_specs(kwargs, in_specs)
        batch, _, heads = (tuple(in_specs[0]) + (None,) * 3)[:3]
        sinks = kwargs.get("softmax_aux")
        if sinks is not None and sinks.shape[0] > 1:
            specs["softmax_aux"] = PartitionSpec(heads)
        for name in ("bias", "attention_mask"):
            x = kwargs.get(name)
            if x is not None:
                per_head = heads if x.ndim == 4 and x.shape[1] > 1 else None
                specs[name] = PartitionSpec(batch if x.shape[0] > 1 else None, per_head)
        return specs

    def platform_cfgs(self, platform: str, inv: Invocation):
        yield FlashMLAConfig(platform=platform)  # the implementation's own defaults
        if platform != "triton":
            return
        for block_q, block_k, warps in ((16, 64, 4), (32, 32, 4), (64, 32, 8)):
            for splits in (None, 1):
                yield FlashMLAConfig(
                    platform=platform,
                    fwd_params=FwdParams(block_q=block_q, block_k=block_k, num_warps=warps, num_stages=2),
                    num_splits=splits,
                )


@typechecked
def flash_mla(
    query: Float[Array, "batch seq_q heads q_dim"],
    key_value: Float[Array, "batch seq_k rank"],
    w_kc: Float[Array, "rank kv_heads d_nope"],
    w_vc: Float[Array, "rank kv_heads d_v"],
    b_q: Float[Array, "batch seq_q ..."] | None = None,
    b_k: Float[Array, "batch seq_k d_rope"] | None = None,
    cu_seqlens: Int[Array, " n_plus_1"] | None = None,
    /,
    *,
    softmax_scale: float | None = None,
    causal: bool = False,
    attention_mask: Shaped[Array, "..."] | None = None,
    bias: Float[Array, "..."] | None = None,
    softmax_aux: Float[Array, " sinks"] | None = None,
    logits_soft_cap: float | None = None,
    deterministic: bool = True,
    dropout_rng: jax.Array | None = None,
    dropout_prob: float = 0.0,
    sliding_window: int | tuple[int, int] | None = None,
    softmax_dtype: Any = None,
    platform: str | None = None,
    cfg: FlashMLAConfig | None = None,
    mesh: jax.sharding.Mesh | None = None,
    in_specs: Any = None,
    out_specs: Any = None,
) -> Float[Array, "batch seq_q heads d_v"]:
    """Attention whose keys and values are decompressed from one latent row per token, without decompressing.

    `key_value [batch, seq_k, rank]` holds the latent rows; key/value head `g` decompresses them with
    `w_kc[:, g] [rank, d_nope]` and `w_vc[:, g] [rank, d_v]`, and query head `h` reads head
    `h // (heads // kv_heads)`. Layout `[batch, seq, heads, dim]` for the query and output, as in
    `flash_attention`. RoPE mode by which of `b_q`, `b_k` are given: neither (query `[.., d_nope]`); only
    `b_k` (query `[.., d_nope + d_rope]`, its last `d_rope` dims meet `b_k`); both (decoupled: query
    `[.., d_nope]` and `b_q`, meeting `b_k`). The tensors are positional-only, the options keyword-only.

    Bad `cu_seqlens` bounds (not rising from 0, past `seq`) are a ValueError outside `jit` (under `jit` too
    with `EJKERNEL_CHECKS=1`); otherwise, under `jit`, each bound is clamped into `[previous bound, seq]`
    (the first to 0), so a sequence past the end is empty.

    Args:
        query: `[batch, seq_q, heads, d_nope]` (`[.., d_nope + d_rope]` with `b_k` alone), float (Triton:
            float16, bfloat16 or float32).
        key_value: `[batch, seq_k, rank]` latent rows in query's dtype (as are `w_kc`, `w_vc`, `b_q`, `b_k`).
        w_kc: `[rank, kv_heads, d_nope]`: each key/value head's key decompression; `heads % kv_heads == 0`.
        w_vc: `[rank, kv_heads, d_v]`: each key/value head's value decompression.
        b_q: Default None. `[batch, seq_q, d_rope]` for every head, or `[batch, seq_q, heads, d_rope]`: the
            query's RoPE part (decoupled mode); needs `b_k`.
        b_k: Default None. `[batch, seq_k, d_rope]`: the keys' RoPE part, shared by all heads.
        cu_seqlens: Default None. Int `[N + 1]`: N sequences packed along the sequence axis of every batch
            row (needs `seq_q == seq_k`); positions past the last bound are padding, with zero output.
        softmax_scale: Default None, meaning `(d_nope + d_rope) ** -0.5`.
        causal: Default False. Keep keys `k <= q`, top-left aligned: for decoding one token against its
            whole context, leave it False.
        attention_mask: Default None. Bool or int (nonzero = attend), `[1|batch, 1|heads, seq_q, seq_k]`.
        bias: Default None. Float, broadcastable as `[1|batch, 1|heads, seq_q, seq_k]` (fewer dims get
            leading 1s); added to the logits after the soft cap.
        softmax_aux: Default None. Float 1-D sink logits in the denominator only: length `heads`, one per
            head; another length, shared by all heads (folded into one logit).
        logits_soft_cap: Default None. A positive `c`: logits become `c · tanh(logits / c)`.
        deterministic: Default True. True turns dropout off whatever `dropout_prob` says.
        dropout_rng: Default None. A `jax.random` key, needed for dropout.
        dropout_prob: Default 0.0. Rate in `[0, 1)`, applied with `deterministic=False`.
        sliding_window: Default None. Non-negative `(left, right)` keeps keys `q - left <= k <= q + right`;
            an int `w` means `(w, w)`.
        softmax_dtype: Default None. None or a float dtype; the softmax runs in float32 whatever it says.
        platform: Default None, meaning `"auto"`: Triton on GPUs where it accepts the call (no bias, dense
            mask, dropout or float64; latent rank up to 1024), else XLA. One of `"auto"`, `"xla"`, `"triton"`.
        cfg: Default None (a tuned, shipped or heuristic config). A `FlashMLAConfig`.
        mesh: Default None. A `jax.sharding.Mesh`: with `in_specs` and `out_specs` (the three or none) the
            call runs under `jax.shard_map`.
        in_specs: Default None. A `PartitionSpec` per tensor passed (or per positional slot): shard batch, or
            heads with `w_kc`/`w_vc` sharded on their head axis alike; sinks and a bias or mask per batch row
            or head follow that split. Sequences, the latent rank and head dims are never split.
        out_specs: Default None. The output's `PartitionSpec`.

    Returns:
        `[batch, seq_q, heads, d_v]` in query's dtype.

    Raises:
        TypeError: a rank, dtype or size the annotations refuse (one line naming the argument), tensors of
            different dtypes, a float `attention_mask`, a `softmax_dtype` that is not a float dtype, or a
            `sliding_window` that is neither an int nor a pair.
        ValueError: `heads` not a multiple of `kv_heads`; `b_q` without `b_k`; a query last dim that does not
            fit the RoPE mode; a `b_q` or `b_k` of the wrong shape; `cu_seqlens` with `seq_q != seq_k` or bad
            bounds (see above); an `attention_mask` or `bias` of the wrong shape; an empty `softmax_aux`; a
            `dropout_prob` outside `[0, 1)`; dropout with `deterministic=False` but no `dropout_rng`;
            `logits_soft_cap <= 0`; a negative window; a platform that is unknown or has no implementation
            on this device; `mesh`, `in_specs`, `out_specs` not given together.
        NotImplementedError: a requested platform that declines the call (Triton: see `platform`), or
            dropout with `mesh`.

    Example:
        >>> import jax, numpy as np
        >>> from ejkernel.modules import flash_mla
        >>> rng = np.random.default_rng(0)
        >>> q = rng.standard_normal((2, 1, 4, 16), np.float32)  # one decode step, [batch, seq_q, heads, d_nope]
        >>> latents = rng.standard_normal((2, 32, 64), np.float32)  # [batch, seq_k, rank]
        >>> w_kc = rng.standard_normal((64, 1, 16), np.float32)  # [rank, kv_heads, d_nope]
        >>> w_vc = rng.standard_normal((64, 1, 8), np.float32)  # [rank, kv_heads, d_v]
        >>> out = jax.jit(flash_mla)(q, latents, w_kc, w_vc)
        >>> out.shape, out.dtype
        ((2, 1, 4, 8), dtype('float32'))
    """
    batch, q_len, heads, _ = query.shape
    bias = check_bias(bias, batch, heads, q_len, key_value.shape[1])
    options = dict(
        softmax_scale=softmax_scale,
        causal=bool(causal),
        attention_mask=attention_mask,
        bias=bias,
        softmax_aux=softmax_aux,
        logits_soft_cap=None if logits_soft_cap is None else float(logits_soft_cap),
        deterministic=bool(deterministic),
        dropout_rng=dropout_rng,
        dropout_prob=float(dropout_prob),
        sliding_window=parse_window(sliding_window),
        softmax_dtype=softmax_dtype,
    )
    call = canonical_call(query, key_value, w_kc, w_vc, b_q, b_k, cu_seqlens, **options)  # checks everything
    options["softmax_scale"] = call.attention.softmax_scale
    if softmax_aux is not None and softmax_aux.shape[0] not in (1, heads):
        # A shared list reaches each denominator only through its log-sum-exp: one shared logit, so that
        # under `mesh=` sinks are either per head (split with the heads) or one logit (replicated).
        options["softmax_aux"] = jax.nn.logsumexp(softmax_aux.astype(jnp.float32))[None].astype(softmax_aux.dtype)
    return executor(
        FlashMLA(),
        *(query, key_value, w_kc, w_vc, b_q, b_k, cu_seqlens),
        platform=platform,
        cfg=cfg,
        mesh=mesh,
        in_specs=in_specs,
        out_specs=out_specs,
        **options,
    )
