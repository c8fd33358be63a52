"""Ring attention over a mesh axis: the platform-independent driver around a per-step block kernel.

Every device of the ring axis holds one shard of the sequence: its queries stay put while the key /
value blocks (with their segment ids) travel once around the ring with `lax.ppermute`. At each of the
n steps a device attends its queries to the block it holds, through a `BlockKernel` (one platform's
flash attention, told the absolute positions of its queries and keys), and folds the block's
(output, log-sum-exp) into its running result with the log-sum-exp merge

    lse = log(exp(lse_a) + exp(lse_b)),   out = out_a exp(lse_a - lse) + out_b exp(lse_b - lse).

The transfer of the next block is issued before the current block is computed, so that XLA can run
both at once. Blocks that causal or window masking hide entirely are skipped, merge included
(`lax.cond`). With equal query and key lengths each result starts as its diagonal block's (same
positions: always visible) rather than empty. Sinks (`softmax_aux`) join once, in the final merge.

The backward rings too. With the global output O and log-sum-exp L of the forward, the gradient of
one block is the flash-attention backward of that block with P = exp(S - L) and
delta = rowsum(dO * O): dQ accumulates where the queries live; dK and dV accumulate in buffers that
travel one step behind their key/value block and are sent home after the n-th step.

Layouts (n devices, device d, local lengths Lq / Lk). A device's shard is held as a tuple of pieces,
kept apart through the ring (and travelling as tuples): work on local pieces need not wait for a
transfer, and only the caller's output is joined.

An additive bias stays put too: each query piece holds its rows of it for every key in global order
`[1|B, 1|H, Lq', S]`, and each step slices the columns of the key piece it holds (by the piece's
absolute position); the backward places each block's gradient back at those columns.
- "contiguous": one piece, positions [d L, (d + 1) L).
- "mirrored": the sequence is cut into 2n chunks of L / 2; device d keeps its first half (chunk 2d) and
  swaps its second (chunk 2d + 1) with device n - 1 - d, so that it holds chunks 2d and 2n - 1 - 2d.
  Every device then holds a pair {i, 2n - 1 - i} mirrored about the middle, and under a causal mask
  every device has the same work at every step. Inputs arrive contiguous; `to_mirrored` /
  `from_mirrored` move the second halves with one `ppermute` each way.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Protocol

import jax
import jax.numpy as jnp
from jax import lax

from ejkernel.kernels._common.attention_states import merge_states
from ejkernel.kernels._common.vma import sum_to_vma, vary, varying_axes
from ejkernel.types.windows import clamp_window

LAYOUTS = ("contiguous", "mirrored")


class BlockKernel(Protocol):
    """One step's attention of a query piece to a key/value piece (hashable: it keys the custom VJP).

    Positions: query row i sits at `q_offset + i`, key j at `kv_offset + j` (int32 scalars, traced);
    the kernel applies its causal / window mask to those absolute positions, and segment ids as given.
    `diagonal` (static) says the two pieces hold the same positions (step 0, a piece with itself): the
    block a causal mask cuts along its diagonal. Otherwise no key shares a position with a query.

    A kernel with a float attribute `lse_unit` gives and takes each log-sum-exp as a pair (offset, rest)
    worth `lse_unit * offset + rest`, -inf where rest is: the offset a logit of the row in the kernel's
    own units, exact, and the rest small. One float rounds a log-sum-exp to its ulp (~0.004 at 4e4),
    and every weight the backward recomputes from it would be off by that much; the pair keeps them
    exact at any logit size. The merges below keep the pair.
    """

    def forward(self, q, k, v, q_seg, kv_seg, q_offset, kv_offset, diagonal: bool, bias=None):
        """(out [B, Sq, H, Dv] float32, lse [B, H, Sq] float32, -inf for a row with nothing allowed).
        `bias` is this block's `[1|B, 1|H, Sq, Sk]` additive bias, or None."""
        ...

    def backward(self, q, k, v, q_seg, kv_seg, out, lse, d_out, q_offset, kv_offset, diagonal: bool, bias=None):
        """(dq, dk, dv, dbias) in float32 for P = exp(S - lse), delta = rowsum(d_out * out): `out` and
        `lse` are the global results of the whole ring, not this block's; dbias is None without bias."""
        ...


@dataclasses.dataclass(frozen=True)
class RingSpec:
    """Static description of one ring: the mesh axis, the layout and the positional masking."""

    axis_name: str
    layout: str
    causal: bool
    window: tuple[int, int] | None

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")

    def offsets(self, device, size: int, n: int) -> list:
        """Absolute position of the first element of each piece (of `size`) held by `device` (traced int32)."""
        device = jnp.asarray(device, jnp.int32)
        if self.layout == "contiguous":
            return [device * size]
        return [2 * device * size, (2 * n - 1 - 2 * device) * size]

    def visible(self, q_offset, q_len: int, kv_offset, kv_len: int):
        """Traced bool: may any query of the piece see any key of the other by position (None: always)."""
        last_q, last_k = q_offset + q_len - 1, kv_offset + kv_len - 1
        conditions = []
        if self.causal:
            conditions.append(kv_offset <= last_q)
        if self.window is not None:
            left, right = self.window
            conditions += [last_k >= q_offset - left, kv_offset <= last_q + right]
        return functools.reduce(jnp.logical_and, conditions) if conditions else None


# ---- layouts ---------------------------------------------------------------------------------------


def _mirror(n: int) -> list[tuple[int, int]]:
    """Device d <-> device n - 1 - d (its own inverse; for odd n the middle device keeps its half)."""
    return [(d, n - 1 - d) for d in range(n)]


def to_mirrored(x, axis_name: str, n: int):
    """[B, L, ...] contiguous shard (device d: chunks 2d, 2d + 1 of 2n) -> the mirrored pieces (chunk 2d,
    chunk 2n - 1 - 2d): the first half stays, the second is swapped with device n - 1 - d."""
    if x is None:
        return None
    half = x.shape[1] // 2
    return x[:, :half], lax.ppermute(x[:, half:], axis_name, _mirror(n))


def from_mirrored(pieces, axis_name: str, n: int):
    """The inverse of `to_mirrored`: the contiguous shard [B, L, ...]."""
    first, second = pieces
    return jnp.concatenate([first, lax.ppermute(second, axis_name, _mirror(n))], axis=1)


# ---- the ring --------------------------------------------------------------------------------------


def _pairs(step: int, pieces: int) -> list[tuple[int, int]]:
    """The (query piece, key piece) pairs of one step, in the order they are computed: at step 0 the
    diagonal pairs first, piece 0's first (local data: no transfer to wait for; they start every
    result), else in order. (Starting the last step with query piece 1, whose result travels home,
    made forward+backward 11% slower on 2 H200s: the order is a schedule hint that XLA follows.)"""
    pairs = [(a, b) for a in range(pieces) for b in range(pieces)]
    return sorted(pairs, key=lambda pair: pair[0] != pair[1]) if step == 0 else pairs


def _fold(acc, pred, block, combine, axes):
    """The accumulator after one block: `block()` itself when `acc` is None (the first block, visible),
    else `combine(acc, block())` where `pred` holds (None: always) and `acc` unchanged where it does not,
    so that a hidden block costs neither its kernel nor the combine. Typed varying over `axes`."""
    typed = lambda tree: jax.tree_util.tree_map(lambda x: vary(x, axes), tree)
    if acc is None:
        return typed(block())
    update = lambda acc: typed(combine(acc, block()))
    return update(acc) if pred is None else lax.cond(pred, update, typed, acc)


def _merge(acc, new, unit=None):
    """Log-sum-exp merge of two partial softmax results, each (out [B, S, H, D] f32, lse [B, H, S] f32);
    with a `unit`, each lse is a pair (offset, rest) (see `BlockKernel`), merged onto the larger offset."""
    (out, lse), (out_b, lse_b) = acc, new
    if unit is not None:
        (offset, rest), (offset_b, rest_b) = lse, lse_b
        # A row with nothing allowed has no offset: it must not win the max.
        top = jnp.maximum(
            jnp.where(rest == -jnp.inf, -jnp.inf, offset), jnp.where(rest_b == -jnp.inf, -jnp.inf, offset_b)
        )
        top = jnp.where(top == -jnp.inf, 0.0, top)
        # Offsets near each other subtract exactly: both rests move onto the common offset without rounding.
        out, rest = _merge((out, unit * (offset - top) + rest), (out_b, unit * (offset_b - top) + rest_b))
        return out, (top, rest)
    rows = lambda x: jnp.swapaxes(x, 1, 2)  # [B, H, S] <-> [B, S, H], the rows of out [B, S, H, D]
    out, merged_lse = merge_states(out, rows(lse), out_b, rows(lse_b))
    return out, rows(merged_lse)


def _add(acc, new):
    return tuple(x + y for x, y in zip(acc, new, strict=True))


def _sink_logits(aux, num_heads: int):
    """[H, n] float32: [aux[h]] per head when len(aux) == H, else every head shares all of aux."""
    aux = aux.astype(jnp.float32)
    if aux.shape[0] == num_heads:
        return aux[:, None]
    return jnp.broadcast_to(aux, (num_heads, aux.shape[0]))


def _with_sinks(out, lse, sink_lse, unit=None):
    """One piece's (out, lse) with the sinks joined to its denominator."""
    if unit is not None:  # onto the rest, relative to the row's offset
        offset, rest = lse
        out, rest = _with_sinks(out, rest, sink_lse - unit * offset)
        return out, (offset, rest)
    total = jnp.logaddexp(lse, sink_lse)
    return out * jnp.swapaxes(jnp.exp(lse - total), 1, 2)[..., None], total


def _sink_grad(sinks, out, lse, d_out, unit=None):
    """[H, n_sinks] from one piece's rows: sinks only add to the denominator, so
    d sink_m = -sum_i exp(sink_m - lse_i) delta_i."""
    delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)  # [B, Sq, H]
    if unit is None:
        p_sink = jnp.exp(sinks[None, :, None, :] - lse[..., None])  # [B, H, Sq, n_sinks]
    else:
        offset, rest = lse
        p_sink = jnp.exp((sinks[None, :, None, :] - unit * offset[..., None]) - rest[..., None])
    return -jnp.sum(p_sink * jnp.swapaxes(delta, 1, 2)[..., None], axis=(0, 2))


def _ring_setup(spec: RingSpec, q, k, *pieces):
    """Ring size, this device, the axes results vary over, the ring permutation, and `diagonal(step, a, b)`:
    whether query piece a and key piece b hold the same positions at that step."""
    n = lax.axis_size(spec.axis_name)
    me = lax.axis_index(spec.axis_name)
    axes = varying_axes(me, *jax.tree_util.tree_leaves((q, k, pieces)))
    diagonal = lambda step, a, b: step == 0 and a == b and q[a].shape[1] == k[b].shape[1]
    return n, me, axes, [(i, (i + 1) % n) for i in range(n)], diagonal


def _bias_block(bias, piece: int, kv_offset, kv_len: int):
    """The columns of query piece `piece`'s bias rows that a key piece at `kv_offset` holds (None: no bias)."""
    return None if bias is None else lax.dynamic_slice_in_dim(bias[piece], kv_offset, kv_len, axis=3)


def _forward(kernel: BlockKernel, spec: RingSpec, q, k, v, aux, q_seg, kv_seg, bias=None):
    n, me, axes, ring, diagonal = _ring_setup(spec, q, k, v, q_seg, kv_seg, bias)
    q_seg = (None,) * len(q) if q_seg is None else q_seg
    kv_seg = (None,) * len(k) if kv_seg is None else kv_seg
    batch, size, num_heads, _ = q[0].shape
    dv = v[0].shape[-1]
    q_offsets = spec.offsets(me, size, n)
    unit = getattr(kernel, "lse_unit", None)

    def empty():
        out = jnp.zeros((batch, size, num_heads, dv), jnp.float32)
        lse = jnp.full((batch, num_heads, size), -jnp.inf, jnp.float32)
        if unit is not None:
            lse = (jnp.zeros_like(lse), lse)
        return vary(out, axes), jax.tree_util.tree_map(lambda x: vary(x, axes), lse)

    # Each result starts as its diagonal block's (None until then); unequal lengths have none: empty.
    results = [None if diagonal(0, a, a) else empty() for a in range(len(q))]
    block = (k, v, kv_seg)
    for s in range(n):  # unrolled (n is small): lets XLA overlap each transfer with compute across steps
        # Issue the transfer of the next block first: it runs while this block is computed.
        following = lax.ppermute(block, spec.axis_name, ring) if s < n - 1 else None
        k_cur, v_cur, seg_cur = block
        k_offsets = spec.offsets((me - s) % n, k_cur[0].shape[1], n)
        for a, b in _pairs(s, len(q)):
            diag = diagonal(s, a, b)
            offsets = (q_offsets[a], k_offsets[b])
            compute = functools.partial(
                kernel.forward,
                *(q[a], k_cur[b], v_cur[b], q_seg[a], seg_cur[b], *offsets),
                diagonal=diag,
                bias=_bias_block(bias, a, offsets[1], k_cur[b].shape[1]),
            )
            visible = None if diag else spec.visible(offsets[0], size, offsets[1], k_cur[b].shape[1])
            results[a] = _fold(results[a], visible, compute, functools.partial(_merge, unit=unit), axes)
        block = following
    if aux is not None:  # sinks join the denominator once, here
        sink_lse = jax.nn.logsumexp(_sink_logits(aux, num_heads), axis=-1)[None, :, None]
        results = [_with_sinks(out, lse, sink_lse, unit) for out, lse in results]
    return tuple(out.astype(q[0].dtype) for out, _ in results), tuple(lse for _, lse in results)


def _backward(kernel: BlockKernel, spec: RingSpec, residuals, d_out):
    q, k, v, aux, q_seg, kv_seg, bias, out, lse = residuals
    n, me, axes, ring, diagonal = _ring_setup(spec, q, k, v, q_seg, kv_seg, bias, out, d_out)
    q_seg = (None,) * len(q) if q_seg is None else q_seg
    kv_seg = (None,) * len(k) if kv_seg is None else kv_seg
    size, num_heads = q[0].shape[1], q[0].shape[2]
    q_offsets = spec.offsets(me, size, n)
    zeros = lambda x: vary(jnp.zeros(x.shape, jnp.float32), axes)

    # dQ starts as its diagonal block's (None until then); unequal lengths have none: zeros.
    dq = [None if diagonal(0, a, a) else zeros(x) for a, x in enumerate(q)]
    dbias = None if bias is None else [zeros(x) for x in bias]  # blocks are placed into it, each once
    dk = dv = None
    block = (k, v, kv_seg)
    for s in range(n):
        # Both transfers start before this step's compute: the next block, and the gradients the previous
        # device accumulated for the block held now (sent at the start of a step, not at the end of the
        # last one, so that they too travel while this step computes). This step's dK / dV are summed
        # apart and added to the arrived ones last, so that no kernel waits for that transfer.
        following = lax.ppermute(block, spec.axis_name, ring) if s < n - 1 else None
        arrived = lax.ppermute((dk, dv), spec.axis_name, ring) if s > 0 else None
        k_cur, v_cur, seg_cur = block
        step_dk = [None if diagonal(s, b, b) else zeros(x) for b, x in enumerate(k_cur)]
        step_dv = [None if diagonal(s, b, b) else zeros(x) for b, x in enumerate(v_cur)]
        k_offsets = spec.offsets((me - s) % n, k_cur[0].shape[1], n)
        for a, b in _pairs(s, len(q)):
            diag = diagonal(s, a, b)
            offsets = (q_offsets[a], k_offsets[b])
            grads = functools.partial(
                kernel.backward,
                *(q[a], k_cur[b], v_cur[b], q_seg[a], seg_cur[b], out[a], lse[a], d_out[a], *offsets),
                diagonal=diag,
                bias=_bias_block(bias, a, offsets[1], k_cur[b].shape[1]),
            )
            visible = None if diag else spec.visible(offsets[0], size, offsets[1], k_cur[b].shape[1])
            if bias is None:
                acc = None if diag else (dq[a], step_dk[b], step_dv[b])
                dq[a], step_dk[b], step_dv[b] = _fold(acc, visible, lambda g=grads: g()[:3], _add, axes)
                continue
            place = functools.partial(_place, at=offsets[1])
            if diag:  # the first block of this query piece: its dbias starts as zeros with the block placed
                compute, acc = functools.partial(_placed_first, grads, dbias[a], place), None
            else:
                compute, acc = grads, (dq[a], step_dk[b], step_dv[b], dbias[a])
            combine = lambda acc, new, place=place: (*_add(acc[:3], new[:3]), place(acc[3], new[3]))
            dq[a], step_dk[b], step_dv[b], dbias[a] = _fold(acc, visible, compute, combine, axes)
        block = following
        if arrived is None:
            dk, dv = step_dk, step_dv
        else:
            dk, dv = (_add(old, new) for old, new in zip(arrived, (step_dk, step_dv), strict=True))
    # After n steps a device holds the complete dK / dV of the block of the next device: send it home, in the
    # input's dtype where nothing is summed after arrival (the same rounding, half the bytes for bf16).
    homeward = lambda gs, xs: tuple(
        g if varying_axes(g) - varying_axes(x) else g.astype(x.dtype) for g, x in zip(gs, xs, strict=True)
    )
    dk, dv = lax.ppermute((homeward(dk, k), homeward(dv, v)), spec.axis_name, ring)

    d_aux = None
    if aux is not None:
        sinks = _sink_logits(aux, num_heads)  # [H, n_sinks]
        unit = getattr(kernel, "lse_unit", None)
        d_sinks = sum(_sink_grad(sinks, *piece, unit) for piece in zip(out, lse, d_out, strict=True))
        d_aux = d_sinks[:, 0] if aux.shape[0] == num_heads else jnp.sum(d_sinks, axis=0)
        d_aux = sum_to_vma(d_aux, aux).astype(aux.dtype)
    # Summed over the mesh axes an input is replicated on (no-ops for the usual sharded q, k, v).
    pairs = [(dq, q), (dk, k), (dv, v)] + ([] if bias is None else [(dbias, bias)])
    grads = [tuple(sum_to_vma(g.astype(x.dtype), x) for g, x in zip(gs, xs, strict=True)) for gs, xs in pairs]
    return *grads[:3], d_aux, grads[3] if bias is not None else None


def _placed_first(grads, zeros, place):
    """A diagonal block's (dq, dk, dv) and its bias gradient placed into the piece's zero dbias."""
    dq, dk, dv, dbias = grads()
    return dq, dk, dv, place(zeros, dbias)


def _place(full, block, *, at):
    """`full` [..., S] with `block` [..., Sk] written at columns [at, at + Sk)."""
    return lax.dynamic_update_slice_in_dim(full, block.astype(full.dtype), at, axis=full.ndim - 1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _ring(kernel, spec, q, k, v, aux, q_seg, kv_seg, bias):
    return _forward(kernel, spec, q, k, v, aux, q_seg, kv_seg, bias)[0]


def _ring_fwd(kernel, spec, q, k, v, aux, q_seg, kv_seg, bias):
    out, lse = _forward(kernel, spec, q, k, v, aux, q_seg, kv_seg, bias)
    return out, (q, k, v, aux, q_seg, kv_seg, bias, out, lse)


def _ring_bwd(kernel, spec, residuals, d_out):
    dq, dk, dv, d_aux, dbias = _backward(kernel, spec, residuals, d_out)
    return dq, dk, dv, d_aux, None, None, dbias


_ring.defvjp(_ring_fwd, _ring_bwd)


def ring_attention(kernel: BlockKernel, spec: RingSpec, q, k, v, aux=None, q_seg=None, kv_seg=None, bias=None):
    """Attention of the local query shard to the whole ring's keys, inside `shard_map` over `spec.axis_name`.

    q, k, v, q_seg, kv_seg, bias are tuples of the pieces `spec.layout` holds (one for "contiguous",
    two for "mirrored"), each piece q [B, Lq', H, D], k [B, Lk', Hkv, D], v [B, Lk', Hkv, Dv], q_seg
    [B, Lq'] / kv_seg [B, Lk'] int segment ids (both or neither), bias [1|B, 1|H, Lq', S] (the piece's
    query rows, every key of the ring); aux 1-D sink logits. Returns the output pieces [B, Lq', H, Dv]
    in q.dtype. Differentiable in q, k, v, aux and bias.
    """
    return _ring(kernel, spec, q, k, v, aux, q_seg, kv_seg, bias)


# ---- what every platform's entry point shares -------------------------------------------------------


def bound_axis_size(axis_name: str) -> int:
    """Size of a bound mesh axis; ValueError naming `axis_name` when it is not bound here."""
    try:
        return lax.axis_size(axis_name)
    except NameError as err:
        raise ValueError(
            f"ring_attention: axis_name={axis_name!r} is not bound here: call it inside jax.shard_map over that "
            "mesh axis, or pass mesh=/in_specs=/out_specs= (or use `with jax.set_mesh(mesh)`)"
        ) from err


def check_local_bias(bias, query, key, n: int) -> None:
    """A local bias holds this device's query rows against every key of the ring: `[1|B, 1|H, Lq, n Lk]`."""
    if bias is None:
        return
    batch, q_len, heads, _ = query.shape
    total = n * key.shape[1]
    if (
        bias.ndim != 4
        or bias.shape[0] not in (1, batch)
        or bias.shape[1] not in (1, heads)
        or bias.shape[2:]
        != (
            q_len,
            total,
        )
    ):
        raise ValueError(
            f"bias must be this device's rows against every key of the ring, [1|{batch}, 1|{heads}, {q_len}, "
            f"{total}], got {bias.shape}"
        )


def check_local_inputs(query, key, value, softmax_aux, q_seg, kv_seg, layout: str) -> None:
    """Shapes of the local shards an implementation receives (ValueError naming what is wrong)."""
    if query.ndim != 4 or key.ndim != 4 or value.ndim != 4:
        raise ValueError(f"query, key, value must be [batch, seq, heads, dim], got {query.shape}, {key.shape}")
    batch, q_len, num_heads, head_dim = query.shape
    k_len, num_kv_heads = key.shape[1], key.shape[2]
    if key.shape[0] != batch or key.shape[3] != head_dim or value.shape[:3] != key.shape[:3]:
        raise ValueError(f"incompatible shapes: query {query.shape}, key {key.shape}, value {value.shape}")
    if num_heads % num_kv_heads:
        raise ValueError(f"query heads ({num_heads}) must be a multiple of key/value heads ({num_kv_heads})")
    if (q_seg is None) != (kv_seg is None):
        raise ValueError("q_segment_ids and kv_segment_ids must be given together")
    if q_seg is not None and (q_seg.shape != (batch, q_len) or kv_seg.shape != (batch, k_len)):
        raise ValueError(f"segment ids must be the local [B, Lq] and [B, Lk], got {q_seg.shape} and {kv_seg.shape}")
    if softmax_aux is not None and softmax_aux.ndim != 1:
        raise ValueError(f"softmax_aux must be 1-D, got shape {softmax_aux.shape}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if layout == "mirrored" and (q_len % 2 or k_len % 2):
        raise ValueError(f"the mirrored layout needs even local lengths, got {q_len} and {k_len}")


def ring_window(sliding_window, causal: bool, total_len: int) -> tuple[int, int] | None:
    """The window as the ring applies it: sides clamped to the whole length, None when it masks nothing."""
    if sliding_window is None:
        return None
    left, right = clamp_window((int(sliding_window[0]), int(sliding_window[1])), total_len)
    if causal:
        right = 0
    if left == total_len and (causal or right == total_len):
        return None
    return left, right


def run_ring(kernel: BlockKernel, spec: RingSpec, n: int, q, k, v, aux=None, q_seg=None, kv_seg=None, bias=None):
    """`ring_attention` on contiguous shards: they enter as the pieces of `spec.layout`, the output leaves joined.

    `bias` is `[1|B, 1|H, Lq, S]`: the local query rows against every key of the ring."""
    if spec.layout == "mirrored":
        split = lambda x: to_mirrored(x, spec.axis_name, n)
        join = lambda pieces: from_mirrored(pieces, spec.axis_name, n)
    else:
        split = lambda x: None if x is None else (x,)
        join = lambda pieces: pieces[0]
    q, k, v, q_seg, kv_seg = (split(x) for x in (q, k, v, q_seg, kv_seg))
    if bias is not None:  # its query axis is 2: split it there
        bias = tuple(jnp.moveaxis(piece, 1, 2) for piece in split(jnp.moveaxis(bias, 2, 1)))
    return join(ring_attention(kernel, spec, q, k, v, aux, q_seg, kv_seg, bias))
