"""What the flash attention implementations share.

Argument checks of the canonical contract, padding helpers, the bookkeeping of which optional
operands a call has, the custom-VJP wiring of a padded `forward` / `backward` pair, and the one
piece of kernel math every forward ends with (`join_sink`). Kept in one place so the Pallas-Triton,
Mosaic GPU, Pallas TPU and XLA implementations refuse the same calls with the same words; each
implementation takes the call's options as one `AttentionCall` (`attention_call.py`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math

import jax
import jax.numpy as jnp

from ejkernel.kernels._common.attention_call import OPTION_NAMES, AttentionCall
from ejkernel.types.windows import window_pair

LOG2E = math.log2(math.e)  # exp(x) == exp2(x · LOG2E): the kernels' logits are in base 2
LN2 = math.log(2.0)  # base-2 log-sum-exp back to natural units

# ---- argument checks ----


def check_broadcastable(name, x, batch, heads, q_len, kv_len, *, seq_broadcast: bool = True):
    """`x` is `[1|B, 1|H, Sq, Sk]`; with `seq_broadcast` its last two axes may also be 1."""
    if x.ndim != 4 or x.shape[0] not in (1, batch) or x.shape[1] not in (1, heads):
        raise ValueError(f"{name} must be [1|{batch}, 1|{heads}, {q_len}, {kv_len}], got {x.shape}")
    if seq_broadcast:
        if x.shape[2] not in (1, q_len) or x.shape[3] not in (1, kv_len):
            raise ValueError(f"{name} must end in [Sq, Sk] = [{q_len}, {kv_len}] (or 1s), got {x.shape}")
    elif x.shape[2:] != (q_len, kv_len):
        raise ValueError(f"{name} must end in [Sq, Sk] = [{q_len}, {kv_len}], got {x.shape}")


def check_segments(q_segment_ids, kv_segment_ids, batch, q_len, kv_len):
    """Segment ids come both or neither, as `[B, Sq]` and `[B, Sk]`."""
    if (q_segment_ids is None) != (kv_segment_ids is None):
        raise ValueError("q_segment_ids and kv_segment_ids must be given together")
    if q_segment_ids is not None and (q_segment_ids.shape != (batch, q_len) or kv_segment_ids.shape != (batch, kv_len)):
        raise ValueError(f"segment ids must be [B, Sq] and [B, Sk], got {q_segment_ids.shape}, {kv_segment_ids.shape}")


def decline(who: str, used: dict[str, bool]) -> None:
    """NotImplementedError naming every option of the call that implementation `who` does not serve."""
    names = [name for name, is_used in used.items() if is_used]
    if names:
        raise NotImplementedError(f"{who} does not support {', '.join(names)}")


def decline_call(who: str, call: AttentionCall, *, serves: tuple[str, ...] = (), **operands: bool) -> None:
    """`decline` naming the operands given (`bias=True`, ...) and every feature of `call` (`AttentionCall.used`)
    that implementation `who` does not list in `serves`."""
    decline(who, {**operands, **{name: used for name, used in call.used().items() if name not in serves}})


def check_dropout(dropout_prob, dropout_seed):
    """A rate in [0, 1), and a seed whenever the rate is positive."""
    if not 0.0 <= dropout_prob < 1.0:
        raise ValueError(f"dropout_prob must be in [0, 1), got {dropout_prob}")
    if dropout_prob > 0.0 and dropout_seed is None:
        raise ValueError("dropout_prob > 0 needs a dropout_seed")
    check_seed(dropout_seed)


def check_seed(dropout_seed) -> None:
    """A dropout seed is an integer (a float would be cast silently)."""
    if dropout_seed is not None and not jnp.issubdtype(jnp.result_type(dropout_seed), jnp.integer):
        raise TypeError(f"dropout_seed must be an integer, got dtype {jnp.result_type(dropout_seed)}")


def _dtype_names(dtypes) -> str:
    return "/".join(jnp.dtype(d).name for d in dtypes)


def check_qkv(query, key, value, *, who: str, dtypes, max_head_dim: int):
    """Checks what a kernel implementation `who` takes of query/key/value; returns their sizes.

    Returns `(batch, q_len, kv_len, num_heads, num_kv_heads, head_dim, value_dim)`. Shape errors are
    ValueError; what the kernels merely cannot serve (dtype, head dim) is NotImplementedError, so
    automatic dispatch can fall back.
    """
    for name, x in (("query", query), ("key", key), ("value", value)):
        if getattr(x, "ndim", None) != 4:
            raise ValueError(f"{name} must be [batch, seq, heads, dim], got shape {getattr(x, 'shape', None)}")
        if jnp.dtype(x.dtype) not in dtypes:
            raise NotImplementedError(f"{who} takes {_dtype_names(dtypes)}, got {name} {x.dtype}")
    if not (query.dtype == key.dtype == value.dtype):
        raise NotImplementedError(
            f"{who} needs one dtype for query/key/value, got {query.dtype}/{key.dtype}/{value.dtype}"
        )
    batch, q_len, num_heads, head_dim = query.shape
    kv_len, num_kv_heads, value_dim = key.shape[1], key.shape[2], value.shape[3]
    if key.shape[0] != batch or value.shape[:3] != key.shape[:3] or key.shape[3] != head_dim:
        raise ValueError(f"incompatible shapes: query {query.shape}, key {key.shape}, value {value.shape}")
    if num_kv_heads == 0 or num_heads % num_kv_heads:
        raise ValueError(f"query heads ({num_heads}) must be a multiple of key/value heads ({num_kv_heads})")
    if max(head_dim, value_dim) > max_head_dim:
        raise NotImplementedError(f"{who} supports head dims up to {max_head_dim}, got {head_dim}/{value_dim}")
    return batch, q_len, kv_len, num_heads, num_kv_heads, head_dim, value_dim


def check_options(
    batch,
    num_heads,
    q_len,
    kv_len,
    *,
    who: str,
    dtypes,
    sink_dtypes=None,
    seq_broadcast: bool = True,
    bias,
    softmax_aux,
    call: AttentionCall,
):
    """Checks the optional operands and the options (`call`) of the canonical contract for kernel
    implementation `who`.

    `dtypes` are the bias dtypes taken; `sink_dtypes` those of the sinks (None: any float).
    `seq_broadcast` lets bias / mask broadcast over their query and key axes too.
    """
    check_segments(call.q_segment_ids, call.kv_segment_ids, batch, q_len, kv_len)
    if bias is not None:
        check_broadcastable("bias", bias, batch, num_heads, q_len, kv_len, seq_broadcast=seq_broadcast)
        if jnp.dtype(bias.dtype) not in dtypes:
            raise NotImplementedError(f"{who} takes a {_dtype_names(dtypes)} bias, got {bias.dtype}")
    if call.attention_mask is not None:
        check_broadcastable(
            "attention_mask", call.attention_mask, batch, num_heads, q_len, kv_len, seq_broadcast=seq_broadcast
        )
    if softmax_aux is not None:
        if softmax_aux.ndim != 1 or softmax_aux.shape[0] == 0:
            raise ValueError(f"softmax_aux must be a non-empty 1-D array, got shape {softmax_aux.shape}")
        if sink_dtypes is None:
            float_sinks = jnp.issubdtype(softmax_aux.dtype, jnp.floating)
        else:
            float_sinks = jnp.dtype(softmax_aux.dtype) in sink_dtypes
        if not float_sinks:
            raise NotImplementedError(f"{who} takes float sinks, got {softmax_aux.dtype}")
    check_call(call)


def check_call(call: AttentionCall) -> None:
    """What `AttentionCall.of` guarantees, checked again for a call built field by field."""
    check_dropout(call.dropout_prob, call.dropout_seed)
    if call.logits_soft_cap is not None and not call.logits_soft_cap > 0:
        raise ValueError(f"logits_soft_cap must be positive, got {call.logits_soft_cap}")


def bounded_soft_cap(soft_cap: float | None, dtype, kv_len: int) -> bool:
    """Whether a soft-capped forward may take 2^logit with no running max (offset 0, no rescaling).

    Soft-capped logits lie within ±c, c = |cap|·log2(e) in base 2. With c + log2(kv_len) < 100 no
    term underflows float32 (each is at least 2^-c) and a row's sums stay under 2^100, which leaves
    2^28 for |v| in P·V. P is rounded to the input dtype for P·V: bfloat16 holds 2^±c, float16 does not.
    """
    if soft_cap is None or jnp.dtype(dtype) != jnp.bfloat16:
        return False
    return abs(soft_cap) * LOG2E + math.log2(kv_len) < 100


# A forward may also try offset 0 on unbounded logits and check afterwards: the result is exact while
# every row's sum of weights l lies within ZERO_OFFSET_SUMS. Its largest weight is then at least
# 2^-80 / kv_len >= 2^-102, so what float32 flushes to zero (< 2^-126) is under 2^-24 of it, and no
# weight nears overflow (2^28 of room is left for |v| in P·V; an overflow there shows as a non-finite
# accumulator). A row outside the range, or with no allowed key, is redone with a running max.
ZERO_OFFSET_SUMS = (2.0**-80, 2.0**100)


def checked_zero_offset(dtype, kv_len: int) -> bool:
    """Whether a forward of this dtype and key length may try offset 0 and check its row sums.

    P is rounded to the input dtype for P·V: bfloat16 and float32 hold 2^±100, float16 does not.
    """
    return jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32)) and kv_len <= 2**22


def canonical_sinks(softmax_aux, num_heads: int, name: str = "softmax_aux"):
    """Sinks as every kernel takes them, 1-D: as given (length H: one per head, else shared by all
    heads); `[H, n]` (n sinks per head) -> each head's log-sum-exp of its n, which is all a softmax
    denominator sees of them; `[1, n]` -> n sinks shared by all heads."""
    if softmax_aux is not None and softmax_aux.size == 0:
        raise ValueError(f"{name} must hold at least one sink logit, got shape {softmax_aux.shape}")
    if softmax_aux is None or softmax_aux.ndim == 1:
        return softmax_aux
    if softmax_aux.ndim == 2 and softmax_aux.shape[0] == 1:
        return softmax_aux[0]
    if softmax_aux.ndim == 2 and softmax_aux.shape[0] == num_heads:
        return jax.nn.logsumexp(softmax_aux.astype(jnp.float32), axis=-1).astype(softmax_aux.dtype)
    raise ValueError(f"{name} must be [sinks], [heads={num_heads}, sinks] or [1, sinks], got shape {softmax_aux.shape}")


def public_defaults(impl, *, sinks_first: bool = False):
    """An attention implementation callable as users call it: `kernel_registry.get(...)(q, k, v, causal=True)`.

    `impl` takes the canonical call `(query, key, value, bias, softmax_aux, call)`, or with `sinks_first`
    `(query, key, value, softmax_aux, bias, call)` (ring attention's order). Called with the contract's
    keyword options instead of `call` (upstream's form), the wrapper builds the `AttentionCall` from them
    (`AttentionCall.of`: default scale, int window as a pair, default dropout seed); several sinks per head
    are folded to one (`canonical_sinks`). Other keywords (tilings, an implementation's extras) pass through.
    """

    def canonical(query, softmax_aux, call, kwargs):
        options = {name: kwargs.pop(name) for name in OPTION_NAMES if name in kwargs}
        if call is None:
            call = AttentionCall.of(query, **options)
        elif options:
            raise TypeError(f"pass either call= or its options, not both (got {', '.join(options)})")
        if softmax_aux is not None:
            softmax_aux = canonical_sinks(softmax_aux, query.shape[2])
        return softmax_aux, call

    if sinks_first:

        @functools.wraps(impl)
        def wrapped_sinks_first(query, key, value, softmax_aux=None, bias=None, call=None, **kwargs):
            softmax_aux, call = canonical(query, softmax_aux, call, kwargs)
            return impl(query, key, value, softmax_aux, bias, call, **kwargs)

        return wrapped_sinks_first

    @functools.wraps(impl)
    def wrapped(query, key, value, bias=None, softmax_aux=None, call=None, **kwargs):
        softmax_aux, call = canonical(query, softmax_aux, call, kwargs)
        return impl(query, key, value, bias, softmax_aux, call, **kwargs)

    return wrapped


def keyword_defaults(impl):
    """`attention`'s implementation callable as users call it: fills the default `softmax_scale` (1/sqrt(head
    dim)), an int `sliding_window` w as (w, w), and several sinks per head folded to one."""
    signature = inspect.signature(impl)

    @functools.wraps(impl)
    def wrapped(*args, **kwargs):
        bound = signature.bind_partial(*args, **kwargs)
        given = bound.arguments
        if given.get("softmax_scale") is None:
            given["softmax_scale"] = given["query"].shape[-1] ** -0.5
        if given.get("sliding_window") is not None:
            given["sliding_window"] = window_pair(given["sliding_window"], "sliding_window")
        if given.get("softmax_aux") is not None:
            given["softmax_aux"] = canonical_sinks(given["softmax_aux"], given["query"].shape[2])
        return impl(*bound.args, **bound.kwargs)

    return wrapped


# ---- operand preparation (plain jnp outside the kernels) ----


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def pad_axes(x, widths: dict[int, int], value=0):
    """Pads axis `a` of `x` by `widths[a]` at the end; None and zero widths pass through uncopied."""
    if x is None or not any(widths.values()):
        return x
    return jnp.pad(x, [(0, widths.get(axis, 0)) for axis in range(x.ndim)], constant_values=value)


def fold_sinks(softmax_aux, num_heads: int):
    """Sink logits -> one float32 logit per head: only each head's log-sum-exp of its sinks matters."""
    if softmax_aux is None:
        return None
    aux = softmax_aux.astype(jnp.float32)
    return aux if aux.shape[0] == num_heads else jnp.broadcast_to(jax.nn.logsumexp(aux), (num_heads,))


def sum_to_bias_shape(dbias, bias):
    """The dense `[B, H, Sq, Sk]` dS -> the gradient of a bias broadcast over batch and/or heads."""
    if bias.shape[0] == 1:
        dbias = jnp.sum(dbias, axis=0, keepdims=True)
    if bias.shape[1] == 1:
        dbias = jnp.sum(dbias, axis=1, keepdims=True)
    return dbias.astype(bias.dtype)


# ---- kernel math ----


def join_sink(m, denom, sink, exp):
    """Joins a sink logit to softmax rows of running max `m` and denominator `denom` (units of `exp`).

    A sink is one more softmax column without a value: it raises the denominator only. Returns the
    new max, the weight that rescales what the rows accumulated, and the new denominator. A max of
    -inf (no allowed key and a -inf sink) shifts by 0, so no inf - inf appears.
    """
    m_all = jnp.maximum(m, sink)
    shift = jnp.where(m_all == -jnp.inf, 0.0, m_all)
    weight = exp(m - shift)
    return shift, weight, denom * weight + exp(sink - shift)


# ---- kernel bookkeeping ----


@dataclasses.dataclass(frozen=True)
class Operands:
    """Which optional operands a call has, and how the broadcast ones are laid out (hashable, static)."""

    bias: bool = False
    bias_batch: bool = False  # bias has a batch axis of size B (else 1, broadcast)
    bias_heads: bool = False  # bias has a head axis of size H (else 1, broadcast)
    mask: bool = False
    mask_batch: bool = False
    mask_heads: bool = False
    segments: bool = False
    sinks: bool = False
    dropout: bool = False

    @staticmethod
    def of(bias, sinks, q_segment_ids, mask, seed) -> Operands:
        return Operands(
            bias=bias is not None,
            bias_batch=bias is not None and bias.shape[0] != 1,
            bias_heads=bias is not None and bias.shape[1] != 1,
            mask=mask is not None,
            mask_batch=mask is not None and mask.shape[0] != 1,
            mask_heads=mask is not None and mask.shape[1] != 1,
            segments=q_segment_ids is not None,
            sinks=sinks is not None,
            dropout=seed is not None,
        )


class RefReader:
    """Pops kernel refs in order; `read(False)` yields None for an operand the call does not have."""

    def __init__(self, refs):
        self._refs = list(refs)

    def __call__(self, present: bool = True):
        return self._refs.pop(0) if present else None

    def rest(self):
        return self._refs


def attention_vjp(forward, backward):
    """The differentiable core `(st, q, k, v, bias, sinks, q_seg, kv_seg, mask, seed) -> out`.

    `forward(st, *operands) -> (out, lse)` and `backward(st, residuals, do) -> (dq, dk, dv, dbias,
    dsinks)` are a kernel implementation's padded forward and backward; the residuals are the
    operands followed by `out, lse`. Segment ids, mask and seed get no gradient.
    """

    @functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
    def _attention(st, q, k, v, bias, sinks, q_seg, kv_seg, mask, seed):
        return forward(st, q, k, v, bias, sinks, q_seg, kv_seg, mask, seed)[0]

    def _attention_fwd(st, q, k, v, bias, sinks, q_seg, kv_seg, mask, seed):
        out, lse = forward(st, q, k, v, bias, sinks, q_seg, kv_seg, mask, seed)
        return out, (q, k, v, bias, sinks, q_seg, kv_seg, mask, seed, out, lse)

    def _attention_bwd(st, residuals, do):
        dq, dk, dv, dbias, dsinks = backward(st, residuals, do)
        return dq, dk, dv, dbias, dsinks, None, None, None, None

    _attention.defvjp(_attention_fwd, _attention_bwd)
    return _attention


def attention_lse_vjp(forward, backward, natural_lse):
    """`attention_vjp`'s core returning `(out, lse)` too: `natural_lse(st, operands, lse) -> [B, H, Sq]` turns the
    kernel's residual into the natural log of each row's softmax denominator (sinks included, -inf for a row
    with neither key nor sink), and `backward(st, residuals, do, dlse)` takes that lse's cotangent as well."""

    @functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
    def _attention(st, *operands):
        out, lse = forward(st, *operands)
        return out, natural_lse(st, operands, lse)

    def _attention_fwd(st, *operands):
        out, lse = forward(st, *operands)
        return (out, natural_lse(st, operands, lse)), (*operands, out, lse)

    def _attention_bwd(st, residuals, cotangents):
        dq, dk, dv, dbias, dsinks = backward(st, residuals, *cotangents)
        return dq, dk, dv, dbias, dsinks, None, None, None, None

    _attention.defvjp(_attention_fwd, _attention_bwd)
    return _attention
