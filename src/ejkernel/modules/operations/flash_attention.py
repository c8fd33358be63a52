"""`flash_attention`: exact attention in O(sequence) memory, on the best implementation for the device.

The public function checks the arguments and normalises them into the canonical form every backend
receives (see `ejkernel.reference.flash_attention`): scale resolved, windows as `(left, right)`,
padding (`cum_seqlens_*`) and `MaskInfo` turned into segment ids plus static flags, paged K/V
gathered into dense rows.
"""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec
from jaxtyping import Array, Float, Int

from ejkernel.kernels._common.attention import canonical_sinks
from ejkernel.kernels._common.attention_call import OPTION_NAMES, AttentionCall
from ejkernel.kernels._common.bounds import padded_lengths
from ejkernel.kernels._common.checks import check_values, is_traced, require_float, require_int
from ejkernel.kernels._common.float8_attention import DESCALE_NAMES, is_float8
from ejkernel.modules.operations._attention_args import (
    attention_roles,
    check_bias,
    check_qkv,
    dense_mask_spec,
    parse_window,
)
from ejkernel.modules.operations._common import executor, typechecked
from ejkernel.ops import BwdParams, FwdParams, Invocation, Kernel, KernelConfig
from ejkernel.ops.executor import specs_by_slot
from ejkernel.ops.kernel import FORWARD, TRAIN
from ejkernel.registry import Backend, Platform, current_backend, implementations
from ejkernel.types import MaskInfo
from ejkernel.types.windows import clamp_window, intersect_windows

IMPLEMENTATIONS = implementations(
    "flash_attention",
    (Platform.CUDA, Backend.GPU, "ejkernel.kernels._cuda.flash_attention:flash_attention"),
    (Platform.PALLAS, Backend.GPU, "ejkernel.kernels._pallas.gpu.flash_attention:flash_attention"),
    (Platform.TRITON, Backend.GPU, "ejkernel.kernels._triton.flash_attention:flash_attention"),
    (Platform.XLA, Backend.ANY, "ejkernel.kernels._xla.flash_attention:flash_attention"),
    (Platform.PALLAS, Backend.TPU, "ejkernel.kernels._pallas.tpu.flash_attention:flash_attention"),
)
"""Best first: cuDNN where it serves the call, the Mosaic GPU kernels (Hopper), Triton, XLA. The TPU kernels,
checked only in Pallas' TPU interpret mode so far, come after XLA (`platform="pallas"` asks for them) until the
suite has passed on a real TPU."""

# Options only some implementations honour (by platform); others decline the call when they differ from these.
OPTION_DEFAULTS = {
    "normalize_output": True,
    "precision": jax.lax.Precision.DEFAULT,
    "logits_dtype": jnp.float32,
    "return_lse": False,
    "descales": None,  # float8 inputs: (q [H], k [Hkv], v [Hkv]) float32, passed with every float8 call
}
OPTION_PLATFORMS = {  # a platform, or platform/backend
    "normalize_output": ("xla",),
    "precision": ("xla",),
    "logits_dtype": ("xla",),
    "return_lse": ("xla", "triton"),
    "descales": ("xla", "pallas/gpu"),
}


@dataclasses.dataclass(frozen=True)
class FlashAttentionConfig(KernelConfig):
    """Tiling of the forward (`fwd_params`) and backward (`bwd_params`) kernels, and the platform.

    Given as `flash_attention(..., cfg=cfg)`, it replaces the config the executor would select (tuned,
    shipped or heuristic). A field left None is the implementation's own default; XLA tiles its backward
    like its forward when `bwd_params` is None. Values out of range are a ValueError when the config is built.

    Attributes:
        platform: Default `"auto"`. One of `"auto"`, `"xla"`, `"triton"`, `"pallas"`, `"cuda"`.
        fwd_params: Default None. `FwdParams` of the forward: `block_q` x `block_k` tiles (powers of two),
            `num_warps` and `num_stages` (GPU kernels).
        bwd_params: Default None. `BwdParams` of the backward, with the same fields.
        backend: Default `"any"`. The device kind the config is meant for (`"gpu"`, `"tpu"`, `"cpu"`); a call
            on another kind is refused (ValueError).

    Example:
        >>> from ejkernel.modules import FlashAttentionConfig
        >>> from ejkernel.ops import FwdParams
        >>> cfg = FlashAttentionConfig(platform="xla", fwd_params=FwdParams(block_q=64, block_k=64))
        >>> cfg.platform, cfg.fwd_params.block_k
        ('xla', 64)
    """


TIMED_WITHOUT = ("segment ids", "attention_mask", "logits_soft_cap", "dropout")
"""The options (`AttentionCall.used` names) no head-dim-64 route of `FlashAttention.heuristic_cfg` was timed with."""


def _canonical_call(kwargs) -> AttentionCall:
    """The call's `AttentionCall`, or one of upstream's raw keyword options passed to the executor directly (its
    scale a placeholder: the options here decide masks and routes, not values)."""
    call = kwargs.get("call")
    if call is not None:
        return call
    raw = {name: kwargs[name] for name in OPTION_NAMES if name in kwargs and name != "softmax_scale"}
    return AttentionCall(softmax_scale=1.0, **raw)


class FlashAttention(Kernel):
    """The `Kernel` the executor runs for `flash_attention` (op id `"flash_attention"`).

    It takes the canonical call `(query, key, value, bias, softmax_aux, call=AttentionCall)`, the options
    `flash_attention` resolved into one value (segment ids, `(left, right)` window, scale); call
    `flash_attention` rather than this class.
    Differentiated calls get a config of their own (autotuning times forward + backward); on GPUs the
    candidates add Triton and Mosaic GPU tilings to each implementation's defaults. Implementations other
    than XLA decline `normalize_output`, `precision` and `logits_dtype` values other than the defaults, and
    those other than XLA and Triton decline `return_lse`.
    """

    op_id = "flash_attention"
    config_type = FlashAttentionConfig

    def call_impl(self, impl, args, kwargs, cfg):
        # The public function passes these options only when they differ from the defaults.
        for name in OPTION_DEFAULTS.keys() & kwargs.keys():
            served = OPTION_PLATFORMS[name]
            if impl.platform.value not in served and f"{impl.platform.value}/{impl.backend.value}" not in served:
                where = " and ".join(served)
                what = "float8 query/key/value" if name == "descales" else f"{name}={kwargs[name]!r}"
                raise NotImplementedError(f"{what} is supported by the {where} platforms only")
        # `call=` (from `flash_attention`), or upstream's raw keyword options, which the implementations'
        # `public_defaults` turn into an `AttentionCall`.
        return impl.fn(*args, fwd_params=cfg.fwd_params, bwd_params=cfg.bwd_params, **kwargs)

    tune_argnums = (0, 1, 2)  # configs tile the backward too: autotuning times forward + backward

    def heuristic_cfg(self, inv: Invocation) -> FlashAttentionConfig:
        """On a GPU, calls off the tuned tables go first (where it declines, `auto`'s order serves the call) to the
        kernel measured ahead of cuDNN on an H200 at their kind of shape: the Mosaic GPU kernels for windowed calls;
        at head dim 128, for forwards of 1024 queries and keys or more and training calls of 2048 or fewer (the
        Mosaic GPU backward leads cuDNN's at short sequences and trails it past 4096); at head dim 64, for calls without
        bias, mask, segment ids, dropout or soft cap, the Triton forward from 1024 queries and keys, and the Mosaic
        GPU pair for causal training to 4096 and non-causal to 1024. TFLOP/s against cuDNN, non-causal / causal.

        Windowed (4096, 0) or (2048, 0), causal, H 16 (session 47, calls 2 and 5):

        | B x S | forward | forward + backward |
        |---|---|---|
        | 1 x 16384 | 536 / 503 | 485 / 481 |
        | 2 x 8192 | 525 / 489 | 474 / 465 |
        | 4 x 4096 | 468 / 431 | 424 / 402 |

        Unwindowed, D 128, H / Hkv 32 / 8 unless said (session 50, calls 1 and 2):

        | B x S | forward | forward + backward |
        |---|---|---|
        | 32 x 512 | 442 / 464, 257 / 283 | 399 / 295, 253 / 174 |
        | 8 x 1024, H 16 | 497 / 486, 353 / 330 | 432 / 388, 312 / 254 |
        | 16 x 1024 | 524 / 514, 371 / 389 | 459 / 406, 353 / 274 |
        | 4 x 2048 | 570 / 551, 448 / 440 | 492 / 469, 395 / 362 |
        | 2 x 4096, H 16 | 621 / 578, 493 / 461 | 514 / 530, 442 / 426 |
        | 4 x 4096 | 623 / 604, 543 / 521 | 518 / 527, 476 / 456 |
        | 1 x 8192, H 64 | 631 / 622, 565 / 555 | 522 / 554, 462 / 528 |

        D 64, H / Hkv 32 / 8 (session 51, call 1): Triton's forward, the Mosaic GPU forward + backward, cuDNN's both.

        | B x S | forward | forward + backward |
        |---|---|---|
        | 16 x 1024 | 417 / 384, 319 / 293 | 336 / 315, 268 / 209 |
        | 4 x 4096 | 450 / 431, 411 / 392 | 398 / 423, 384 / 349 |
        """
        if inv.platform != "auto" or current_backend() != Backend.GPU:
            return super().heuristic_cfg(inv)
        call = _canonical_call(inv.kwargs)
        used = call.used()
        # Measured with as many queries as keys, so both lengths must fit (a decode step over a long cache does not).
        lengths, head_dim = (inv.args[0].shape[1], inv.args[1].shape[1]), inv.args[0].shape[-1]
        long_forward = inv.mode == FORWARD and min(lengths) >= 1024
        training_up_to = lambda keys: inv.mode == TRAIN and max(lengths) <= keys
        if used["sliding_window"] or (head_dim == 128 and (long_forward or training_up_to(2048))):
            return FlashAttentionConfig(platform="pallas")
        # At head dim 64 only the kind of call timed: no bias, mask, segment ids, dropout or soft cap (which
        # Triton serves and cuDNN may serve too, unmeasured beside each other).
        bias = inv.args[3] if len(inv.args) > 3 else inv.kwargs.get("bias")  # (raw calls may pass q, k, v alone)
        timed_kind = bias is None and not any(used[n] for n in TIMED_WITHOUT)
        if head_dim == 64 and timed_kind and long_forward:
            return FlashAttentionConfig(platform="triton")
        if head_dim == 64 and timed_kind and training_up_to(4096 if call.causal else 1024):
            return FlashAttentionConfig(platform="pallas")
        return super().heuristic_cfg(inv)

    def axis_roles(self, args, kwargs):
        inputs, out = attention_roles(args)
        return inputs, (out, out[:3]) if kwargs.get("return_lse") else out

    def platform_cfgs(self, platform: str, inv: Invocation):
        yield FlashAttentionConfig(platform=platform)  # the implementation's own defaults
        if platform == "pallas":
            yield from _mosaic_gpu_cfgs(inv.args[0].shape[-1])
        if platform != "triton":
            return
        forward_tilings = [
            FwdParams(block_q=128, block_k=64, num_warps=4, num_stages=3),
            FwdParams(block_q=64, block_k=64, num_warps=4, num_stages=3),
        ]
        backward_tilings = [
            BwdParams(block_q=64, block_k=128, num_warps=8, num_stages=2),
            BwdParams(block_q=32, block_k=64, num_warps=4, num_stages=2),
        ]
        for fwd in forward_tilings:
            for bwd in backward_tilings:
                yield FlashAttentionConfig(platform=platform, fwd_params=fwd, bwd_params=bwd)

    def kwarg_specs(self, kwargs: dict[str, Any], in_specs) -> dict[str, Any]:
        """Segment ids follow the batch and sequence sharding of q and k; a dense mask follows both.

        Refuses specs under which each shard would silently compute something else: a sharded
        key/value sequence (every shard would see only its local keys), or a sharded query sequence
        with causal / window masks (positions would restart at 0 on every shard).
        """
        q_spec, k_spec, v_spec = (tuple(s) + (None,) * 4 for s in in_specs[:3])
        for name, spec in (("key", k_spec), ("value", v_spec)):
            if spec[1] is not None:
                raise ValueError(
                    f"flash_attention: in_specs shard the {name} sequence axis over {spec[1]!r}, so every shard "
                    "would attend only to its local keys; use ring_attention (sequence parallelism over a mesh "
                    "axis) instead, or leave the key/value sequence unsharded"
                )
        call = _canonical_call(kwargs)
        if q_spec[1] is not None and (call.causal or call.sliding_window is not None):
            raise ValueError(
                f"flash_attention: in_specs shard the query sequence axis over {q_spec[1]!r} together with a causal "
                "or sliding-window mask, which would compare shard-local positions; use ring_attention instead"
            )
        if call.dropout_seed is not None:  # masks are drawn from shard-local indices
            raise NotImplementedError(
                "flash_attention: dropout with mesh= would draw the same mask on every shard; "
                "call it without mesh= inside your own shard_map with a seed per shard"
            )
        specs = {}
        if call.segments:
            specs["q_segment_ids"] = PartitionSpec(q_spec[0], q_spec[1])
            specs["kv_segment_ids"] = PartitionSpec(k_spec[0], k_spec[1])
        if call.attention_mask is not None:
            specs["attention_mask"] = dense_mask_spec(call.attention_mask, q_spec, k_spec)
        # The call's arrays are laid out by a tree of its own shape (same statics), specs in their places.
        # float8 descales follow the heads of the query and of the keys
        descales = {}
        if kwargs.get("descales") is not None:
            q_heads, kv_heads = PartitionSpec(q_spec[2]), PartitionSpec(k_spec[2])
            descales = {"descales": (q_heads, kv_heads, kv_heads)}
        if "call" not in kwargs:
            return {**specs, **descales}
        return {**({"call": call.replace(**specs)} if specs else {}), **descales}


def _mosaic_gpu_cfgs(head_dim: int):
    """Tilings of the Mosaic GPU kernels worth timing beside their defaults (on a TPU: more tilings to time)."""
    yield FlashAttentionConfig(platform="pallas", fwd_params=FwdParams(block_k=64, num_stages=3))
    yield FlashAttentionConfig(platform="pallas", bwd_params=BwdParams(num_stages=3))
    if head_dim == 64:
        for block_k in (128, 256):  # (one of them is the default)
            yield FlashAttentionConfig(platform="pallas", fwd_params=FwdParams(block_k=block_k))
        yield FlashAttentionConfig(platform="pallas", bwd_params=BwdParams(block_k=128, block_q=128))


def _pages(block_tables, num_blocks: int, block_size: int):
    """`(tables, kv segment ids or None)`: entries outside `[0, num_blocks)` are a ValueError (eager, or
    with `EJKERNEL_CHECKS=1`); under `jit` they are clamped into the caches for the gather and their
    `block_size` keys are marked padding (-1), so they take no part."""
    traced = is_traced(block_tables)
    tables = block_tables if traced else np.asarray(block_tables)
    ok = (tables >= 0) & (tables < num_blocks)
    check_values("block_tables", tables, ok, f"[0, {num_blocks - 1}] (the blocks of the key/value caches)")
    if not traced:
        return block_tables, None
    segments = jnp.repeat(jnp.where(ok, 0, -1).astype(jnp.int32), block_size, axis=1)
    return jnp.clip(block_tables, 0, num_blocks - 1), segments


def _padding_segments(name: str, cum_seqlens, batch: int, length: int) -> jax.Array:
    """Segment ids of a padded batch: row b is valid (0) for its first cum[b+1]-cum[b] tokens (that length
    clamped into [0, length] under `jit`), else -1."""
    require_int(name, cum_seqlens)
    if cum_seqlens.shape != (batch + 1,):
        raise ValueError(f"{name} must have shape [batch + 1] = ({batch + 1},), got {cum_seqlens.shape}")
    lengths = padded_lengths(name, cum_seqlens, length)
    return jnp.where(jnp.arange(length) < lengths[:, None], 0, -1).astype(jnp.int32)


def _descale(name: str, descale, heads: int, what: str) -> jax.Array:
    """A descale factor as float32 `[heads]`: None (1), a float, a 0-d array or a `[heads]` float array."""
    if descale is None or isinstance(descale, float | int):
        return jnp.full((heads,), 1.0 if descale is None else float(descale), jnp.float32)
    require_float(name, descale)
    if descale.ndim == 0 or descale.shape == (heads,):
        return jnp.broadcast_to(jnp.asarray(descale, jnp.float32), (heads,))
    raise ValueError(f"{name} must be a scalar or a [{what}={heads}] array, got shape {tuple(descale.shape)}")


def _merge_segments(a, b):
    if a is None or b is None:
        return a if b is None else b
    return jnp.where((a < 0) | (b < 0), -1, b)


@typechecked
def flash_attention(
    query: Float[Array, "batch seq_q heads dim"],
    key: Float[Array, "_ _ kv_heads dim"],
    value: Float[Array, "_ _ kv_heads dim_v"],
    bias: Float[Array, "..."] | None = None,
    cum_seqlens_q: Int[Array, " batch_plus_1"] | None = None,
    cum_seqlens_k: Int[Array, " batch_plus_1"] | None = None,
    softmax_aux: Float[Array, "..."] | None = None,
    block_tables: Int[Array, "batch max_blocks"] | None = None,
    /,
    *,
    mask_info: MaskInfo | None = None,
    softmax_scale: float | None = None,
    dropout_prob: float = 0.0,
    causal: bool = False,
    dropout_seed: int | Array | None = None,
    sliding_window: int | tuple[int, int] | None = None,
    logits_soft_cap: float | None = None,
    normalize_output: bool = True,
    precision: Any = jax.lax.Precision.DEFAULT,
    logits_dtype: Any = jnp.float32,
    return_lse: bool = False,
    platform: str | None = None,
    cfg: FlashAttentionConfig | None = None,
    mesh: jax.sharding.Mesh | None = None,
    in_specs: Any = None,
    out_specs: Any = None,
    q_descale: float | Array | None = None,
    k_descale: float | Array | None = None,
    v_descale: float | Array | None = None,
) -> (
    Float[Array, "batch seq_q heads dim_v"]
    | tuple[Float[Array, "batch seq_q heads dim_v"], Float[Array, "batch seq_q heads"]]
):
    """Softmax attention `softmax(scale · q kᵀ [+ bias], masked) v` per head, without a `seq_q × seq_k` tensor.

    Layout `[batch, seq, heads, dim]`, as in every attention op here except `blocksparse_attention`
    (`[batch, heads, seq, dim]`). Fewer key/value heads than query heads is grouped-query attention: query
    head `h` reads key/value head `h // (heads // kv_heads)`; K/V are never repeated. A key is attended
    where every mask given allows it. The tensors are positional-only, the options keyword-only.

    Bad values of `cum_seqlens_*` (not rising from 0, a row longer than the axis) and `block_tables`
    entries outside `[0, blocks)` are a ValueError outside `jit` (under `jit` too with `EJKERNEL_CHECKS=1`,
    when the program runs). Otherwise, under `jit`, each row's length `cum[b+1] - cum[b]` is clamped into
    `[0, seq]`, and a table entry outside the caches reads no keys (its block's positions are padding).

    Args:
        query: `[batch, seq_q, heads, dim]`, float16, bfloat16 or float32 (XLA: also float64).
        key: `[batch, seq_k, kv_heads, dim]` in query's dtype, with `heads % kv_heads == 0`; with
            `block_tables`, a paged cache `[blocks, block_size, kv_heads, dim]`.
        value: `[batch, seq_k, kv_heads, dim_v]` in query's dtype (`dim_v` may differ from `dim`); with
            `block_tables`, a paged cache `[blocks, block_size, kv_heads, dim_v]`.
        bias: Default None. Float, broadcastable as `[1|batch, 1|heads, seq_q, seq_k]` (fewer dims get
            leading 1s); added to the logits after the soft cap.
        cum_seqlens_q: Default None. Int `[batch + 1]`: row `b` holds `cum[b+1] - cum[b]` real queries at
            its start and padding after them (padded rows return zeros). Padding per row, not packing.
        cum_seqlens_k: Default None. Int `[batch + 1]`: the same for the keys (after `block_tables` gathered
            them); padded keys are never attended.
        softmax_aux: Default None. Float sink logits that join the softmax denominator only (not scaled,
            capped or biased): 1-D of length `heads`, one per head; 1-D of another length, shared by all
            heads; `[heads, n]`, n per head; `[1, n]`, n shared.
        block_tables: Default None. Int `[batch, max_blocks]`: row `b`'s keys and values are the cache
            blocks `block_tables[b]` in order, so `seq_k = max_blocks * block_size`.
        mask_info: Default None. A `MaskInfo` (segment ids, a dense mask, causal / window transforms),
            combined with the rest: its segments with the padding, its window intersected with
            `sliding_window`, causal if either asks for it.
        softmax_scale: Default None, meaning `dim ** -0.5`. The logit scale (an int is taken too).
        dropout_prob: Default 0.0. Dropout rate in `[0, 1)` on the attention weights.
        causal: Default False. Keep keys `k <= q`, positions counted from the start of both sequences.
        dropout_seed: Default None, meaning seed 0 when `dropout_prob > 0` (the same mask at every call:
            pass a seed per training step). An int or an integer scalar array.
        sliding_window: Default None. Non-negative `(left, right)` keeps keys `q - left <= k <= q + right`;
            an int `w` means `(w, w)`.
        logits_soft_cap: Default None. A positive `c`: logits become `c · tanh(logits / c)`.
        normalize_output: Default True. False returns `Σ_k exp(s_qk - m_q) v_k` without dividing by the
            softmax denominator (`m_q` the row max, sinks included). XLA only.
        precision: Default `jax.lax.Precision.DEFAULT`. Matmul precision of every dot product. XLA only.
        logits_dtype: Default `jnp.float32`. Accumulation dtype of `q kᵀ` (the softmax is float32
            regardless). XLA only.
        return_lse: Default False. True also returns each query row's log-sum-exp: the natural log of its
            softmax denominator, `[batch, seq_q, heads]` float32, sinks included, -inf for a row with neither
            key nor sink; what `merge_attention_states` joins partial results with. Differentiable. The XLA
            and Triton platforms serve it (`auto` on a GPU picks Triton for such calls).
        platform: Default None, meaning `"auto"`: the best implementation on this device that accepts the
            call. One of `"auto"`, `"xla"`, `"triton"`, `"pallas"`, `"cuda"`.
        cfg: Default None (a tuned, shipped or heuristic config). A `FlashAttentionConfig` to use instead.
        mesh: Default None. A `jax.sharding.Mesh`: with `in_specs` and `out_specs` (the three or none) the
            call runs under `jax.shard_map`.
        in_specs: Default None. A `PartitionSpec` per tensor passed (or per positional slot). The key/value
            sequence must stay whole (use `ring_attention`), and so must the query sequence under `causal`
            or `sliding_window`; segment ids and a dense mask follow the query and keys. With
            `block_tables`, the gathered rows follow the query's batch and the caches' head sharding.
        out_specs: Default None. The output's `PartitionSpec`.
        q_descale: Default None (1). With float8 query/key/value only: the query stands for `query * q_descale`;
            a float, a 0-d array or a float `[heads]` array (one factor per head). Beyond upstream's surface.
        k_descale: Default None (1). The same for the key, a float or `[kv_heads]`.
        v_descale: Default None (1). The same for the value, a float or `[kv_heads]`.

    float8 (`float8_e4m3fn`, `float8_e5m2`) query/key/value attend as their dequantised values (times the
    descales) and return bfloat16; such calls are inference only (a derivative raises TypeError). On a Hopper
    GPU, `float8_e4m3fn` at head dim 64 or 128, non-causal or causal, without bias, masks, segments, dropout,
    windows, soft cap, sinks or `return_lse`, runs the Mosaic GPU float8 kernel (Q·Kᵀ and P·V in float8,
    P rounded to e4m3); every other float8 call runs the XLA path on the dequantised inputs.

    Returns:
        `[batch, seq_q, heads, dim_v]` in query's dtype (bfloat16 for float8 inputs). A query row with no key
        to attend (padding, or every key masked) is zeros and passes no gradient. With `return_lse`, the pair
        `(out, lse)`.

    Raises:
        TypeError: a rank, dtype or size the annotations refuse (one line naming the argument), query, key
            and value of different dtypes, a descale with non-float8 inputs, a derivative of a float8 call,
            a float `dropout_seed`, a `sliding_window` that is neither an int
            nor a pair, or a `cfg` that is not a `FlashAttentionConfig`.
        ValueError: `heads` not a multiple of `kv_heads`; key and value of another batch or length; a
            `dropout_prob` outside `[0, 1)`; `logits_soft_cap <= 0`; a negative window; a `bias`,
            `softmax_aux`, `cum_seqlens_*`, `mask_info` mask or descale of the wrong shape; bad `cum_seqlens_*` or
            `block_tables` values (see above); a platform that is unknown, has no implementation on this
            device or contradicts `cfg.platform`; `mesh`, `in_specs`, `out_specs` not given together, or
            specs that shard a sequence as forbidden above.
        NotImplementedError: the requested platform declines the call (an XLA-only option, a dtype or head
            dim its kernels do not take), no implementation accepts it, or dropout with `mesh`.

    Example:
        >>> import jax, numpy as np
        >>> from ejkernel.modules import flash_attention
        >>> rng = np.random.default_rng(0)
        >>> q = rng.standard_normal((2, 16, 4, 8), np.float32)  # [batch, seq, heads, dim]
        >>> kv = rng.standard_normal((2, 16, 2, 8), np.float32)  # 2 key/value heads: grouped-query
        >>> cum_q = np.array([0, 16, 26], np.int32)  # row 0 holds 16 real queries, row 1 holds 10
        >>> attend = jax.jit(lambda q, kv, cum_q: flash_attention(q, kv, kv, None, cum_q, causal=True))
        >>> out = attend(q, kv, cum_q)
        >>> out.shape, out.dtype
        ((2, 16, 4, 8), dtype('float32'))
        >>> bool((np.asarray(out)[1, 10:] == 0).all())  # row 1's padded queries
        True
    """
    check_qkv(query, key, value)
    batch, q_len, num_heads, _ = query.shape
    descales = (q_descale, k_descale, v_descale)
    if not is_float8(query.dtype):
        for name, descale in zip(DESCALE_NAMES, descales, strict=True):
            if descale is not None:
                raise TypeError(f"{name} is for float8 query/key/value, got {query.dtype}")
        descales = None
    else:
        heads = ((num_heads, "heads"), (key.shape[2], "kv_heads"), (key.shape[2], "kv_heads"))
        descales = tuple(_descale(n, d, *h) for n, d, h in zip(DESCALE_NAMES, descales, heads, strict=True))
    page_seg = None
    if block_tables is not None:
        # Paged caches: gather each row's pages into a dense [B, max_blocks * block_size, Hkv, D] sequence.
        pages, page_seg = _pages(block_tables, key.shape[0], key.shape[1])
        key = key[pages].reshape(batch, -1, *key.shape[2:])
        value = value[pages].reshape(batch, -1, *value.shape[2:])
    if key.shape[0] != batch or value.shape[:2] != key.shape[:2]:
        raise ValueError(f"key and value must be [batch={batch}, seq_k, kv_heads, dim], got {key.shape}, {value.shape}")
    kv_len = key.shape[1]
    bias = check_bias(bias, batch, num_heads, q_len, kv_len)
    softmax_aux = canonical_sinks(softmax_aux, num_heads)

    window = parse_window(sliding_window)
    q_seg = None if cum_seqlens_q is None else _padding_segments("cum_seqlens_q", cum_seqlens_q, batch, q_len)
    kv_seg = None if cum_seqlens_k is None else _padding_segments("cum_seqlens_k", cum_seqlens_k, batch, kv_len)
    kv_seg = _merge_segments(kv_seg, page_seg)
    attention_mask = None
    if mask_info is not None:
        canonical = mask_info.canonical(num_heads)
        causal = causal or canonical.causal
        window = intersect_windows(window, canonical.sliding_window)
        q_seg, kv_seg = (
            _merge_segments(q_seg, canonical.q_segment_ids),
            _merge_segments(kv_seg, canonical.kv_segment_ids),
        )
        attention_mask = canonical.attention_mask
    if (q_seg is None) != (kv_seg is None):  # padding on one side only: the other side is all valid
        q_seg = jnp.zeros((batch, q_len), jnp.int32) if q_seg is None else q_seg
        kv_seg = jnp.zeros((batch, kv_len), jnp.int32) if kv_seg is None else kv_seg

    # The one canonical call every implementation receives (checked and resolved here, once).
    call = AttentionCall.of(
        query,
        q_segment_ids=q_seg,
        kv_segment_ids=kv_seg,
        attention_mask=attention_mask,
        softmax_scale=softmax_scale,
        causal=causal,
        sliding_window=clamp_window(window, q_len + kv_len),
        logits_soft_cap=logits_soft_cap,
        dropout_prob=dropout_prob,
        dropout_seed=dropout_seed,
    )
    options: dict[str, Any] = {"call": call}
    given = {
        "normalize_output": normalize_output,
        "precision": precision,
        "logits_dtype": logits_dtype,
        "return_lse": bool(return_lse),
    }
    options.update({name: value for name, value in given.items() if value != OPTION_DEFAULTS[name]})
    if descales is not None:
        options["descales"] = descales
    if in_specs is not None:
        # The user's specs cover the tensors passed; the canonical call takes q, k, v, bias, sinks.
        slots = (query, key, value, bias, cum_seqlens_q, cum_seqlens_k, softmax_aux, block_tables)
        by_position = specs_by_slot("flash_attention", slots, in_specs, mesh)
        if block_tables is not None:
            # The pages were gathered into dense rows above: those follow the query's batch sharding and
            # keep the caches' head sharding (a sharded page or page-slot axis has no meaning there).
            q_spec = tuple(by_position[0] or ()) + (None,) * 4
            for position in (1, 2):
                cache_spec = tuple(by_position[position] or ()) + (None,) * 4
                by_position[position] = PartitionSpec(q_spec[0], None, *cache_spec[2:4])
        in_specs = tuple(by_position[i] for i in (0, 1, 2, 3, 6) if i in by_position)
    return executor(
        FlashAttention(),
        query,
        key,
        value,
        bias,
        softmax_aux,
        platform=platform,
        cfg=cfg,
        mesh=mesh,
        in_specs=in_specs,
        out_specs=out_specs,
        **options,
    )
