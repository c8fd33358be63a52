"""`ring_attention`: exact attention over a sequence sharded across the devices of one mesh axis.

Three ways to call it:
- inside your own `jax.shard_map` where `axis_name` is bound: `query`/`key`/`value` are the local
  sequence shards in contiguous order (device i holds positions [i L, (i + 1) L)) and the ring runs
  over that axis directly;
- with `mesh=`, `in_specs=`, `out_specs=` and global arrays: the sequence axis is sharded over
  `axis_name` (the specs' sequence entries may name it or be None), the rest as the specs say;
- under `with jax.set_mesh(mesh)` (or the older `with mesh:`) and global arrays: the same, with the
  sequence sharded over `axis_name` and batch / heads as the inputs' shardings say (else replicated).
In the last two, causal calls use the load-balanced mirrored layout: the sequence is cut into 2n chunks,
device i keeps the first half of its queries (chunk 2i) and swaps the second with device n - 1 - i, so it
computes the queries of chunks 2i and 2n - 1 - 2i, a pair mirrored about the middle: every device does the
same work. Keys and values stay in place (the ring moves them anyway). The arrays are sharded contiguously
and the query halves are exchanged inside the sharded computation (one `ppermute` each way), rather than by
permuting the global arrays: a gather across a sharded axis is refused on meshes of explicit axes, and
point-to-point transfers move each chunk once. The output comes back in the original order. `axis_name=None`
means "sp".

Implementations, in the order `auto` tries them: Mosaic GPU (Hopper; causal or full attention only; cuDNN's
backward per step), cuDNN (GPU; the same calls), Pallas-Triton (GPU; no sliding window or bias) and XLA (every
device; every feature above). Each runs the same ring (`ejkernel.kernels._common.ring`) around its flash
attention.
"""

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec
from jaxtyping import Array, Float

from ejkernel.kernels._common.attention import canonical_sinks
from ejkernel.kernels._common.attention_call import RingCall
from ejkernel.modules.operations._attention_args import attention_roles, check_bias, check_qkv, parse_window
from ejkernel.modules.operations._common import executor, typechecked
from ejkernel.modules.operations.flash_attention import FlashAttentionConfig, flash_attention
from ejkernel.ops import BwdParams, FwdParams, Invocation, Kernel, KernelConfig
from ejkernel.ops.executor import specs_by_slot
from ejkernel.registry import Backend, Platform, implementations
from ejkernel.types import MaskInfo
from ejkernel.types.windows import intersect_windows

IMPLEMENTATIONS = implementations(
    "ring_attention",
    (Platform.PALLAS, Backend.GPU, "ejkernel.kernels._pallas.gpu.ring_attention:ring_attention"),
    (Platform.CUDA, Backend.GPU, "ejkernel.kernels._cuda.ring_attention:ring_attention"),
    (Platform.TRITON, Backend.GPU, "ejkernel.kernels._triton.ring_attention:ring_attention"),
    (Platform.XLA, Backend.ANY, "ejkernel.kernels._xla.ring_attention:ring_attention"),
)
"""Best first: the Mosaic GPU steps on Hopper, merging each step into the running result in the kernel, with cuDNN's
backward; elsewhere cuDNN's steps for the same calls. On 2 H200s at S=65536 (causal, 16 heads, D 128) the Mosaic GPU
ring ran the forward 6% faster than the cuDNN ring (16.4 against 17.4 ms) and forward+backward 2% faster (59.8
against 61.2 ms; BENCHMARKS.md, session 37). Both ahead of the Triton ring."""

DEFAULT_AXIS = "sp"


@dataclasses.dataclass(frozen=True)
class RingAttentionConfig(KernelConfig):
    """Tiling of the per-step block computation (`fwd_params`, `bwd_params`: block_q, block_k) and the platform.

    Ring calls are not autotuned (timing a ring needs its mesh axis bound): without `cfg` the per-step
    kernel's defaults apply. `ring_attention`'s `chunk_size` fills the block sizes this config leaves None.
    Values out of range are a ValueError when the config is built.

    Attributes:
        platform: Default `"auto"`. `"auto"`, `"xla"`, `"triton"`, `"cuda"` or `"pallas"` (Mosaic GPU forward
            steps on Hopper, cuDNN's backward).
        fwd_params: Default None. `FwdParams` of each step's forward (`block_q`, `block_k`, `num_warps`,
            `num_stages`); cuDNN ignores it.
        bwd_params: Default None. `BwdParams` of each step's backward (Triton and XLA; cuDNN's backward, which
            the cuDNN and Mosaic GPU rings run, ignores it).
        backend: Default `"any"`. The device kind the config is meant for (`"gpu"`, `"tpu"`, `"cpu"`); a call
            on another kind is refused (ValueError).

    Example:
        >>> from ejkernel.modules import RingAttentionConfig
        >>> from ejkernel.ops import FwdParams
        >>> RingAttentionConfig(platform="xla", fwd_params=FwdParams(block_q=128, block_k=128)).platform
        'xla'
    """


class RingAttention(Kernel):
    """The `Kernel` the executor runs for `ring_attention` (op id `"ring_attention"`).

    It takes the local shards `(query, key, value, softmax_aux, bias)` with the options `ring_attention`
    resolved into one `call=` (a `RingCall`), the ring's `axis_name` bound; call `ring_attention` rather
    than this class. Not autotuned (`candidate_cfgs` is empty). Implementations: Mosaic GPU (`"pallas"`,
    Hopper), cuDNN (`"cuda"`, GPU), Triton (GPU) and XLA, tried in that order on `"auto"`; each runs the same
    ring around its own flash attention.
    """

    op_id = "ring_attention"
    config_type = RingAttentionConfig

    def axis_roles(self, args, kwargs):
        """Attention's (`attention_roles`): batch, heads and query rows alike, the output laid out as the
        query; the key/value sequence (split over the ring) is the op's own."""
        return attention_roles(args, bias_at=4, sinks_at=3)

    def call_impl(self, impl, args, kwargs, cfg):
        kwargs = dict(kwargs)
        fwd, bwd = _tiles(cfg, kwargs.pop("chunk_size", None))
        return impl.fn(*args, fwd_params=fwd, bwd_params=bwd, **kwargs)

    def candidate_cfgs(self, inv: Invocation):
        # Not autotuned: timing a ring needs its mesh axis bound, which a tuning run outside the
        # caller's shard_map does not have. Heuristics (the per-step kernel's defaults) or cfg= apply.
        return ()

    def kwarg_specs(self, kwargs: dict[str, Any], in_specs) -> dict[str, Any]:
        """Segment ids follow the batch and sequence sharding of the query and of the keys."""
        q_spec, k_spec = (_entries(s) for s in in_specs[:2])
        call = kwargs.get("call")
        segments = call.segments if call is not None else kwargs.get("q_segment_ids") is not None
        if not segments:
            return {}
        specs = {
            "q_segment_ids": PartitionSpec(q_spec[0], q_spec[1]),
            "kv_segment_ids": PartitionSpec(k_spec[0], k_spec[1]),
        }
        # `call=` (from `ring_attention`): its arrays are laid out by a tree of its own shape, specs in their
        # places; upstream's raw keyword options (passed to the executor directly) by name.
        return specs if call is None else {"call": call.replace(**specs)}


def _tiles(cfg: RingAttentionConfig, chunk: int | None) -> tuple:
    """(fwd_params, bwd_params) of the per-step attention: `chunk_size` fills the block sizes `cfg` leaves open."""
    fwd, bwd = cfg.fwd_params, cfg.bwd_params
    if chunk is None:
        return fwd, bwd
    if bwd is None and fwd is not None:  # the backward tiles like the forward unless told otherwise
        bwd = BwdParams(**fwd.to_dict())
    return _with_blocks(fwd, FwdParams, chunk), _with_blocks(bwd, BwdParams, chunk)


def _with_blocks(params, kind, block: int):
    fields = params.to_dict() if params is not None else {}
    for name in ("block_q", "block_k"):
        if fields.get(name) is None:
            fields[name] = block
    return kind(**fields)


def _entries(spec) -> tuple:
    spec = () if spec is None else tuple(spec)
    return spec + (None,) * (4 - len(spec))


def _names(entry) -> tuple:
    """Mesh axis names of one PartitionSpec entry (None, a name, or a tuple of names)."""
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, tuple | list) else (entry,)


def _axis_bound(axis_name: str) -> bool:
    try:
        jax.lax.axis_size(axis_name)
    except NameError:
        return False
    return True


def _legacy_mesh():
    """The mesh of the deprecated `with mesh:` context (API.md names it), or None."""
    try:
        from jax._src.mesh import thread_resources  # what `with mesh:` sets; JAX deprecates the public alias
    except ImportError:
        return None
    mesh = thread_resources.env.physical_mesh
    return None if mesh.empty else mesh


def _context_mesh():
    """The mesh of `with jax.set_mesh(...)` (concrete when one is set, else abstract) or of `with mesh:`."""
    abstract = jax.sharding.get_abstract_mesh()
    if abstract.empty:
        return _legacy_mesh()
    try:
        concrete = jax.sharding.get_mesh()
    except ValueError:  # under jit only the abstract mesh is known; shard_map takes it
        return abstract
    return concrete if not concrete.empty else abstract


def _input_spec(x) -> tuple:
    """The PartitionSpec entries an input already carries in its type (explicit mesh axes), else Nones."""
    try:
        spec = jax.typeof(x).sharding.spec
    except (AttributeError, TypeError):
        spec = ()
    return _entries(spec)


def _context_specs(mesh, axis_name: str, query, key) -> tuple[list, PartitionSpec]:
    """Specs for global arrays under a context mesh: the sequence over `axis_name`; batch and heads as
    the query's sharding says (explicit mesh axes), heads only where the key/value heads divide too."""
    batch, _, heads, _ = (None if axis_name in _names(e) else e for e in _input_spec(query))
    if heads is not None and key.shape[2] % math.prod(mesh.shape[a] for a in _names(heads)):
        heads = None
    spec = PartitionSpec(batch, axis_name, heads, None)
    return [spec] * 3, spec


def _sequence_specs(axis_name: str, specs: list, out_spec, num_heads: int, aux) -> tuple[list, Any]:
    """Put `axis_name` on the sequence entry of every spec, after checking that nothing contradicts it."""
    fixed = []
    for name, spec in zip(("query", "key", "value"), specs[:3], strict=True):
        entries = list(_entries(spec))
        if entries[1] is not None and _names(entries[1]) != (axis_name,):
            raise ValueError(
                f"ring_attention: in_specs shard the {name} sequence over {entries[1]!r}; ring_attention shards "
                f"the sequence over axis_name={axis_name!r} (use None or {axis_name!r} there)"
            )
        for dim in (0, 2, 3):
            if axis_name in _names(entries[dim]):
                raise ValueError(
                    f"ring_attention: in_specs use axis_name={axis_name!r} on dimension {dim} of {name}; it is the "
                    "sequence axis of the ring and may shard dimension 1 only"
                )
        entries[1] = axis_name
        fixed.append(PartitionSpec(*entries))
    q = _entries(fixed[0])  # (batch and heads split alike: the executor's axis-role check)
    if aux is not None:
        aux_spec = specs[3] if len(specs) > 3 and specs[3] is not None else PartitionSpec()
        if aux.shape[0] == num_heads and q[2] is not None:
            aux_spec = PartitionSpec(q[2])  # one sink per head: shard them with the heads
        fixed.append(aux_spec)
    out = list(_entries(out_spec))
    if out[1] is not None and _names(out[1]) != (axis_name,):
        raise ValueError(f"ring_attention: out_specs shard the sequence over {out[1]!r}, not axis_name={axis_name!r}")
    out[1] = axis_name
    return fixed, PartitionSpec(*out)


@typechecked
def ring_attention(
    query: Float[Array, "batch seq_q heads dim"],
    key: Float[Array, "batch seq_k kv_heads dim"],
    value: Float[Array, "batch seq_k kv_heads dim_v"],
    softmax_aux: Float[Array, "..."] | None = None,
    bias: Float[Array, "..."] | None = None,
    /,
    *,
    mask_info: MaskInfo | None = None,
    mask_builder: Callable | None = None,
    sliding_window: int | tuple[int, int] | None = None,
    chunk_size: int | None = None,
    causal: bool = False,
    logits_soft_cap: float | None = None,
    softmax_scale: float | None = None,
    axis_name: str | None = None,
    fused_backward: bool = False,
    platform: str | None = None,
    cfg: RingAttentionConfig | None = None,
    mesh: jax.sharding.Mesh | None = None,
    in_specs: Any = None,
    out_specs: Any = None,
) -> Float[Array, "batch seq_q heads dim_v"]:
    """Softmax attention over a sequence sharded along the mesh axis `axis_name` (default `"sp"`).

    Computes exactly `flash_attention` of the whole (unsharded) sequence, in the same `[batch, seq, heads,
    dim]` layout (grouped-query attention when `kv_heads < heads`; K/V never repeated). Key/value blocks
    travel around the ring with `ppermute` while the current block is computed; the backward rings too.
    The tensors are positional-only, the options keyword-only. Three ways to call it:

    - inside your own `jax.shard_map` where `axis_name` is bound: the arrays are the local sequence shards
      in contiguous order (device i holds positions `[i L, (i + 1) L)`), and so is the output;
    - with `mesh=`, `in_specs=`, `out_specs=` and global arrays: the sequence axis is sharded over
      `axis_name` (the specs' sequence entries may name it or be None), the rest as the specs say;
    - under `with jax.set_mesh(mesh)` (or the older `with mesh:`) and global arrays: the same, with batch and
      heads sharded as the inputs' shardings say (else replicated).

    In the last two, a causal call uses the load-balanced mirrored layout (the sequence cut into `2n`
    chunks, device i computes the queries of chunks `2i` and `2n - 1 - 2i`), and the output comes back in the original
    order. With no `axis_name` bound and no mesh (given, or in context with that axis; with
    `axis_name=None`, an `"sp"` axis), there is no ring: the call is `flash_attention` of the whole sequence
    on this device, with every feature of `flash_attention` (dense masks included).

    Args:
        query: `[batch, seq_q, heads, dim]`, float16, bfloat16 or float32.
        key: `[batch, seq_k, kv_heads, dim]` in query's dtype, with `heads % kv_heads == 0`.
        value: `[batch, seq_k, kv_heads, dim_v]` in query's dtype.
        softmax_aux: Default None. Float sink logits in the softmax denominator only: 1-D of length `heads`,
            one per head; other lengths, shared by all heads; `[heads, n]`, n per head. Before `bias` here,
            unlike `flash_attention`.
        bias: Default None. Float, additive, broadcastable as `[1|batch, 1|heads, seq_q, seq_k]`; each device
            keeps its query rows and applies the columns of the key block it holds. Inside your own
            `shard_map`, pass this device's query rows against every key of the ring,
            `[1|batch, 1|heads, seq_q, n * seq_k]` (n: the size of `axis_name`).
        mask_info: Default None. A `MaskInfo`: segment ids (`MaskInfo.from_segments`) and causal / window
            transforms apply exactly. A dense mask (`from_attention_mask`, chunked or token-type masks) rides
            on the bias with a mesh; inside your own `shard_map` it is NotImplementedError.
        mask_builder: Default None. Not supported (NotImplementedError when given).
        sliding_window: Default None. `(left, right)` keeps keys `q - left <= k <= q + right`; an int `w`
            means `(w, w)`.
        chunk_size: Default None. A positive power of two: the tile size of the per-step block computation,
            filling the block sizes `cfg` leaves open (without a ring, only together with `cfg`).
        causal: Default False. Keep keys `k <= q`, global positions from the start of both sequences.
        logits_soft_cap: Default None. A positive `c`: logits become `c · tanh(logits / c)`.
        softmax_scale: Default None, meaning `dim ** -0.5`.
        axis_name: Default None, meaning `"sp"`. The mesh axis the sequence is sharded over.
        fused_backward: Default False. True is not supported (NotImplementedError).
        platform: Default None, meaning `"auto"`: Mosaic GPU (`"pallas"`, Hopper: our forward per step, cuDNN's
            backward; head dim 64 or 128), cuDNN (`"cuda"`, GPU: causal or full attention in bfloat16 or
            float16, no window, soft cap, segment ids or bias), Triton (GPU: no window or bias) or XLA (every
            device and feature), the first that accepts the call.
        cfg: Default None (the per-step kernel's defaults). A `RingAttentionConfig`.
        mesh: Default None. A `jax.sharding.Mesh` with an `axis_name` axis; needs `in_specs` and `out_specs`.
        in_specs: Default None. A `PartitionSpec` per tensor passed (or per positional slot), in the
            `[batch, seq, heads, dim]` layout; `axis_name` may appear on the sequence entry only. The op lays
            out the bias itself (query rows over `axis_name`); one-per-head sinks follow the heads.
        out_specs: Default None. The output's `PartitionSpec`; its sequence entry becomes `axis_name`.

    Returns:
        `[batch, seq_q, heads, dim_v]` in query's dtype, in the original sequence order (inside your own
        `shard_map`, this device's shard). A query row with no key to attend is zeros.

    Raises:
        TypeError: a rank, dtype or size the annotations refuse (one line naming the argument; key and value
            share query's batch), query, key and value of different dtypes, or a `sliding_window` that is
            neither an int nor a pair.
        ValueError: `heads` not a multiple of `kv_heads`; key and value of different lengths; a `chunk_size`
            that is not a positive power of two; `logits_soft_cap <= 0`; a negative window; a `bias` or
            `softmax_aux` of the wrong shape; `mesh`, `in_specs`, `out_specs` not given together;
            `axis_name` not an axis of the mesh (or neither bound nor in the context mesh); specs that shard
            the sequence over another axis or put `axis_name` elsewhere; with a mesh, sequence lengths not
            divisible by the axis size (twice it when causal); a platform that is unknown or has no
            implementation on this device.
        NotImplementedError: `mask_builder`, `fused_backward=True`, a dense mask inside your own `shard_map`,
            or a requested platform that declines the call.

    Example:
        >>> import jax, numpy as np
        >>> from jax.sharding import PartitionSpec as P
        >>> from ejkernel.modules import ring_attention
        >>> mesh = jax.make_mesh((1,), ("sp",))  # (n,) over n devices
        >>> spec = P(None, "sp")  # [batch, seq, heads, dim], the sequence over "sp"
        >>> rng = np.random.default_rng(0)
        >>> q = rng.standard_normal((1, 16, 4, 8), np.float32)
        >>> kv = rng.standard_normal((1, 16, 2, 8), np.float32)
        >>> out = ring_attention(q, kv, kv, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec)
        >>> out.shape, bool(np.isfinite(out).all())
        ((1, 16, 4, 8), True)
    """
    check_qkv(query, key, value)
    batch, q_len, num_heads, head_dim = query.shape
    kv_len = key.shape[1]
    if key.shape[0] != batch or value.shape[:2] != key.shape[:2]:
        raise ValueError(f"key and value must be [batch={batch}, seq_k, kv_heads, dim], got {key.shape}, {value.shape}")
    declined = [
        name
        for name, used in (("mask_builder", mask_builder is not None), ("fused_backward=True", fused_backward))
        if used
    ]
    if declined:
        raise NotImplementedError(f"ring_attention does not support {', '.join(declined)}")
    if chunk_size is not None and (
        not isinstance(chunk_size, int)
        or isinstance(chunk_size, bool)
        or chunk_size <= 0
        or chunk_size & (chunk_size - 1)
    ):
        raise ValueError(f"chunk_size must be a positive power of two, got {chunk_size!r}")
    if logits_soft_cap is not None and not logits_soft_cap > 0:
        raise ValueError(f"logits_soft_cap must be positive, got {logits_soft_cap}")
    softmax_aux = canonical_sinks(softmax_aux, num_heads)
    if softmax_scale is None:
        softmax_scale = head_dim**-0.5
    axis = DEFAULT_AXIS if axis_name is None else axis_name
    # Inside the caller's own shard_map a bias holds the local query rows against every key of the ring.
    ring_keys = kv_len * jax.lax.axis_size(axis) if mesh is None and _axis_bound(axis) else kv_len
    bias = check_bias(bias, batch, num_heads, q_len, ring_keys)

    if (mesh is None) != (in_specs is None) or (mesh is None) != (out_specs is None):
        given = [n for n, v in (("mesh", mesh), ("in_specs", in_specs), ("out_specs", out_specs)) if v is not None]
        raise ValueError(f"ring_attention: mesh, in_specs and out_specs go together; got only {', '.join(given)}")

    specs = None
    if mesh is None and not _axis_bound(axis):  # global arrays under `with jax.set_mesh(mesh)`
        mesh = _context_mesh()
        if mesh is None or (axis_name is None and axis not in mesh.axis_names):
            # No ring to run over: the whole sequence is here, and ring attention is flash attention.
            fwd, bwd = _tiles(cfg or RingAttentionConfig(), chunk_size)
            single = FlashAttentionConfig(platform=cfg.platform, fwd_params=fwd, bwd_params=bwd) if cfg else None
            return flash_attention(
                query,
                key,
                value,
                bias,
                None,
                None,
                softmax_aux,
                mask_info=mask_info,
                softmax_scale=float(softmax_scale),
                causal=causal,
                sliding_window=sliding_window,
                logits_soft_cap=logits_soft_cap,
                platform=platform,
                cfg=single,
            )
        if axis not in mesh.axis_names:
            raise ValueError(
                f"ring_attention: axis_name={axis!r} is not bound here (not inside jax.shard_map over it) and the "
                f"context mesh has axes {tuple(mesh.axis_names)}: name one of them, or pass mesh=/in_specs=/out_specs="
            )
        in_specs, out_specs = _context_specs(mesh, axis, query, key)
    elif mesh is not None:
        if axis not in mesh.axis_names:
            what = "axis_name=None means 'sp', which" if axis_name is None else f"axis_name={axis!r}"
            raise ValueError(f"ring_attention: {what} is not an axis of the mesh (axes: {tuple(mesh.axis_names)})")
        by_slot = specs_by_slot("ring_attention", (query, key, value, softmax_aux, bias), in_specs, mesh)
        in_specs = [by_slot[i] for i in sorted(by_slot)]
    window = parse_window(sliding_window)
    q_seg = kv_seg = dense_mask = None
    if mask_info is not None:
        canonical = mask_info.canonical(num_heads)
        causal = causal or canonical.causal
        window = intersect_windows(window, canonical.sliding_window)
        q_seg, kv_seg, dense_mask = canonical.q_segment_ids, canonical.kv_segment_ids, canonical.attention_mask
    if dense_mask is not None:
        if mesh is None:
            raise NotImplementedError(
                "ring_attention inside your own shard_map does not support a dense attention mask in mask_info "
                "(from_attention_mask, chunked or token-type masks); use segment ids (MaskInfo.from_segments) "
                "with causal / sliding_window, or call it with mesh= and global arrays"
            )
        mask_bias, seen = _dense_mask_as_bias(dense_mask, q_seg, kv_seg, causal, window, q_len, kv_len)
        bias = mask_bias if bias is None else bias + mask_bias

    if mesh is not None:  # shard the sequence over `axis` ourselves
        specs, out_specs = _sequence_specs(axis, list(in_specs), out_specs, num_heads, softmax_aux)
        if bias is not None:  # the rows of the local queries, against every key
            q = _entries(specs[0])
            specs.append(PartitionSpec(q[0] if bias.shape[0] > 1 else None, q[2] if bias.shape[1] > 1 else None, axis))
        n = mesh.shape[axis]
        parts = 2 * n if causal else n
        why = f"the {n} devices of mesh axis {axis!r}"
        if causal:
            why = f"2 x {why} (load-balanced causal layout)"
        for name, length in (("query", q_len), ("key/value", kv_len)):
            if length % parts:
                raise ValueError(f"ring_attention: {name} sequence length {length} must be divisible by {parts}, {why}")

    # The one canonical call every implementation receives (checked and resolved here, once).
    call = RingCall.of(
        query,
        q_segment_ids=q_seg,
        kv_segment_ids=kv_seg,
        softmax_scale=softmax_scale,
        causal=causal,
        sliding_window=window,
        logits_soft_cap=logits_soft_cap,
    )
    options = dict(
        call=call,
        axis_name=axis,
        layout="mirrored" if specs is not None and causal else "contiguous",
        chunk_size=chunk_size,
    )
    out = executor(
        RingAttention(),
        query,
        key,
        value,
        softmax_aux,
        bias,
        platform=platform,
        cfg=cfg,
        mesh=mesh,
        in_specs=None if specs is None else tuple(specs),
        out_specs=out_specs,
        **options,
    )
    return out if dense_mask is None else out * seen.astype(out.dtype)


MASKED_BIAS = -1e9  # exp(MASKED_BIAS + any float32 logit - row max) is exactly 0


def _dense_mask_as_bias(mask, q_seg, kv_seg, causal: bool, window, q_len: int, kv_len: int):
    """A dense `[B|1, H|1, Sq, Sk]` mask as an additive bias (0 where it attends, `MASKED_BIAS` where not,
    constant: no gradient), and `[B|1, Sq, H|1, 1]` booleans: whether a query row sees any key under every
    rule of the call. The ring's kernels apply causal, window and segments exactly; rows whose only
    keys left are the mask's get the bias's uniform weights, so the output is multiplied by the second
    (zeros there, and no gradient from them, as `flash_attention` gives)."""
    bias = jax.lax.stop_gradient(jnp.where(mask, 0.0, MASKED_BIAS).astype(jnp.float32))
    i, j = jnp.arange(q_len)[:, None], jnp.arange(kv_len)[None, :]
    allowed = jnp.asarray(mask, bool)
    if causal:
        allowed = allowed & (j <= i)
    if window is not None:
        allowed = allowed & (j >= i - window[0]) & (j <= i + window[1])
    if q_seg is not None:
        qs, ks = q_seg[:, None, :, None], kv_seg[:, None, None, :]
        allowed = allowed & (qs >= 0) & (ks >= 0) & (qs == ks)
    return bias, jnp.any(allowed, axis=-1).transpose(0, 2, 1)[..., None]
