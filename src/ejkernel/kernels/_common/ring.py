"""Ring attention over a mesh axis: the platform-independent driver around a per-step block kernel.

Every device of the ring axis holds one shard of the sequence: its queries stay put while the key /
value blocks (with their segment ids) travel once around the ring with `lax.ppermute`. At each of the
n steps a device attends its queries to the block it holds, through a `BlockKernel` (one platform's
flash attention, told the absolute positions of its queries and keys), and folds the block's
(output, log-sum-exp) into its running result with the log-sum-exp merge

    lse = log(exp(lse_a) + exp(lse_b)),   out = out_a exp(lse_a - lse) + out_b exp(lse_b - lse).

The transfer of the next block is issued before the current block is computed, so that XLA can run
both at once. Blocks that causal or window masking hide entirely are skipped (`lax.cond`). Sinks
(`softmax_aux`) join once, in the final merge.

The backward rings too. With the global output O and log-sum-exp L of the forward, the gradient of
one block is the flash-attention backward of that block with P = exp(S - L) and
delta = rowsum(dO * O): dQ accumulates where the queries live; dK and dV accumulate in buffers that
travel one step behind their key/value block and are sent home after the n-th step.

Layouts (n devices, device d, local lengths Lq / Lk):
- "contiguous": device d holds positions [d L, (d + 1) L).
- "zigzag": the sequence is cut into 2n chunks of L / 2 and device d holds chunks d and 2n - 1 - d,
  so that under a causal mask every device has the same amount of work. Inputs arrive contiguous;
  `to_zigzag` / `from_zigzag` move the chunks between the two layouts with two `ppermute`s.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Protocol

import jax
import jax.numpy as jnp
from jax import lax

from ejkernel.kernels._common.vma import sum_to_vma, vary, varying_axes
from ejkernel.types.mask_info import clamp_window

LAYOUTS = ("contiguous", "zigzag")


class BlockKernel(Protocol):
    """One step's attention of a query block to a key/value block (hashable: it keys the custom VJP).

    Positions: query row i sits at `q_offset + i`, key j at `kv_offset + j` (int32 scalars, traced);
    the kernel applies its causal / window mask to those absolute positions, and segment ids as given.
    """

    def forward(self, q, k, v, q_seg, kv_seg, q_offset, kv_offset):
        """(out [B, Sq, H, Dv] float32, lse [B, H, Sq] float32, -inf for a row with nothing allowed)."""
        ...

    def backward(self, q, k, v, q_seg, kv_seg, out, lse, d_out, q_offset, kv_offset):
        """(dq, dk, dv) in float32 for P = exp(S - lse), delta = rowsum(d_out * out): `out` and `lse`
        are the global results of the whole ring, not this block's."""
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

    def chunks(self, length: int) -> list[tuple[int, int]]:
        """Static (start, size) of each contiguous piece of a device's local sequence."""
        if self.layout == "contiguous":
            return [(0, length)]
        half = length // 2
        return [(0, half), (half, half)]

    def offsets(self, device, length: int, n: int) -> list:
        """Absolute position of the first element of each piece held by `device` (traced int32)."""
        device = jnp.asarray(device, jnp.int32)
        if self.layout == "contiguous":
            return [device * length]
        half = length // 2
        return [device * half, (2 * n - 1 - device) * half]

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


def _zigzag_home(chunk: int, n: int) -> int:
    """The device that holds global chunk `chunk` (of 2n) in the zig-zag layout."""
    return chunk if chunk < n else 2 * n - 1 - chunk


def to_zigzag(x, axis_name: str, n: int):
    """[B, L, ...] contiguous shards (device d: chunks 2d, 2d + 1) -> zig-zag (chunks d, 2n - 1 - d)."""
    if x is None or n == 1:
        return x
    half = x.shape[1] // 2
    first, second = x[:, :half], x[:, half:]
    # Chunk 2m goes from device m to its zig-zag home, and so does chunk 2m + 1: two permutations.
    from_even = lax.ppermute(first, axis_name, [(m, _zigzag_home(2 * m, n)) for m in range(n)])
    from_odd = lax.ppermute(second, axis_name, [(m, _zigzag_home(2 * m + 1, n)) for m in range(n)])
    # Device d needs chunks d and 2n - 1 - d; one is even, the other odd; chunk d comes first.
    even_device = lax.axis_index(axis_name) % 2 == 0
    return jnp.where(
        even_device, jnp.concatenate([from_even, from_odd], axis=1), jnp.concatenate([from_odd, from_even], axis=1)
    )


def from_zigzag(x, axis_name: str, n: int):
    """The inverse of `to_zigzag`."""
    if x is None or n == 1:
        return x
    half = x.shape[1] // 2
    first, second = x[:, :half], x[:, half:]
    even_device = lax.axis_index(axis_name) % 2 == 0
    even_chunk = jnp.where(even_device, first, second)
    odd_chunk = jnp.where(even_device, second, first)
    home_even = lax.ppermute(even_chunk, axis_name, [(_zigzag_home(2 * m, n), m) for m in range(n)])
    home_odd = lax.ppermute(odd_chunk, axis_name, [(_zigzag_home(2 * m + 1, n), m) for m in range(n)])
    return jnp.concatenate([home_even, home_odd], axis=1)


# ---- the ring --------------------------------------------------------------------------------------


def _pieces(x, chunks, axis: int = 1):
    if x is None:
        return [None] * len(chunks)
    return [lax.slice_in_dim(x, start, start + size, axis=axis) for start, size in chunks]


def _join(parts, axis: int = 1):
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=axis)


def _when(pred, compute, skip, axes, *operands):
    """`compute(*operands)`, or `skip(*operands)` where `pred` is False; both typed varying over `axes`."""
    run = lambda *ops: jax.tree_util.tree_map(lambda x: vary(x, axes), compute(*ops))
    if pred is None:
        return run(*operands)
    rest = lambda *ops: jax.tree_util.tree_map(lambda x: vary(x, axes), skip(*ops))
    return lax.cond(pred, run, rest, *operands)


def _merge(out, lse, out_b, lse_b):
    """Log-sum-exp merge of two partial softmax results (out [B, S, H, D] f32, lse [B, H, S] f32)."""
    top = jnp.maximum(lse, lse_b)
    top = jnp.where(top == -jnp.inf, 0.0, top)
    w, w_b = jnp.exp(lse - top), jnp.exp(lse_b - top)
    total = w + w_b
    nonempty = total > 0.0
    inv = jnp.where(nonempty, 1.0 / jnp.where(nonempty, total, 1.0), 0.0)
    scale = lambda x: jnp.swapaxes(x * inv, 1, 2)[..., None]
    merged_lse = jnp.where(nonempty, top + jnp.log(jnp.where(nonempty, total, 1.0)), -jnp.inf)
    return out * scale(w) + out_b * scale(w_b), merged_lse


def _sink_logits(aux, num_heads: int):
    """[H, n] float32: [aux[h]] per head when len(aux) == H, else every head shares all of aux."""
    aux = aux.astype(jnp.float32)
    if aux.shape[0] == num_heads:
        return aux[:, None]
    return jnp.broadcast_to(aux, (num_heads, aux.shape[0]))


def _ring_setup(spec: RingSpec, *arrays):
    n = lax.axis_size(spec.axis_name)
    me = lax.axis_index(spec.axis_name)
    return n, me, varying_axes(me, *arrays), [(i, (i + 1) % n) for i in range(n)]


def _forward(kernel: BlockKernel, spec: RingSpec, q, k, v, aux, q_seg, kv_seg):
    n, me, axes, ring = _ring_setup(spec, q, k, v, q_seg, kv_seg)
    batch, q_len, num_heads, _ = q.shape
    k_len, dv = k.shape[1], v.shape[-1]
    q_chunks, k_chunks = spec.chunks(q_len), spec.chunks(k_len)
    q_parts, q_seg_parts = _pieces(q, q_chunks), _pieces(q_seg, q_chunks)
    q_offsets = spec.offsets(me, q_len, n)

    def empty(size):
        out = jnp.zeros((batch, size, num_heads, dv), jnp.float32)
        return vary(out, axes), vary(jnp.full((batch, num_heads, size), -jnp.inf, jnp.float32), axes)

    def step(s, carry):
        block, results = carry
        # Issue the transfer of the next block first: it runs while this block is computed.
        following = lax.ppermute(block, spec.axis_name, ring)
        k_cur, v_cur, seg_cur = block
        k_offsets = spec.offsets((me - s) % n, k_len, n)
        k_parts, v_parts, seg_parts = (_pieces(x, k_chunks) for x in (k_cur, v_cur, seg_cur))
        merged = []
        for a, (_, q_size) in enumerate(q_chunks):
            out, lse = results[a]
            for b, (_, k_size) in enumerate(k_chunks):
                out_b, lse_b = _when(
                    spec.visible(q_offsets[a], q_size, k_offsets[b], k_size),
                    kernel.forward,
                    lambda *_, size=q_size: empty(size),
                    axes,
                    q_parts[a],
                    k_parts[b],
                    v_parts[b],
                    q_seg_parts[a],
                    seg_parts[b],
                    q_offsets[a],
                    k_offsets[b],
                )
                out, lse = _merge(out, lse, out_b, lse_b)
            merged.append((out, lse))
        return following, merged

    init = ((k, v, kv_seg), [empty(size) for _, size in q_chunks])
    # Unrolled (n is small): lets XLA overlap each transfer with compute across steps.
    _, results = lax.fori_loop(0, n, step, init, unroll=True)
    out = _join([o for o, _ in results], axis=1)
    lse = _join([lse for _, lse in results], axis=2)
    if aux is not None:  # sinks join the denominator once, here
        sink_lse = jax.nn.logsumexp(_sink_logits(aux, num_heads), axis=-1)[None, :, None]
        total = jnp.logaddexp(lse, sink_lse)
        out = out * jnp.swapaxes(jnp.exp(lse - total), 1, 2)[..., None]
        lse = total
    return out.astype(q.dtype), lse


def _backward(kernel: BlockKernel, spec: RingSpec, residuals, d_out):
    q, k, v, aux, q_seg, kv_seg, out, lse = residuals
    n, me, axes, ring = _ring_setup(spec, q, k, v, q_seg, kv_seg, out, d_out)
    q_len, num_heads = q.shape[1], q.shape[2]
    k_len = k.shape[1]
    q_chunks, k_chunks = spec.chunks(q_len), spec.chunks(k_len)
    q_parts, q_seg_parts, out_parts, do_parts = (_pieces(x, q_chunks) for x in (q, q_seg, out, d_out))
    lse_parts = _pieces(lse, q_chunks, axis=2)
    q_offsets = spec.offsets(me, q_len, n)
    zeros = lambda x: vary(jnp.zeros(x.shape, jnp.float32), axes)

    def step(s, carry):
        block, pending, dq_parts = carry
        # Both transfers start before this step's compute: the next block, and the gradients the previous
        # device accumulated for the block held now (sent at the start of a step, not at the end of the
        # last one, so that they too travel while this step computes).
        following = lax.ppermute(block, spec.axis_name, ring)
        dk_acc, dv_acc = lax.ppermute(pending, spec.axis_name, ring)
        k_cur, v_cur, seg_cur = block
        k_offsets = spec.offsets((me - s) % n, k_len, n)
        k_parts, v_parts, seg_parts = (_pieces(x, k_chunks) for x in (k_cur, v_cur, seg_cur))
        dk_parts = [zeros(x) for x in k_parts]
        dv_parts = [zeros(x) for x in v_parts]
        dq_parts = list(dq_parts)
        for a, (_, q_size) in enumerate(q_chunks):
            for b, (_, k_size) in enumerate(k_chunks):
                dq, dk, dv = _when(
                    spec.visible(q_offsets[a], q_size, k_offsets[b], k_size),
                    kernel.backward,
                    lambda q_, k_, v_, *_: (zeros(q_), zeros(k_), zeros(v_)),
                    axes,
                    q_parts[a],
                    k_parts[b],
                    v_parts[b],
                    q_seg_parts[a],
                    seg_parts[b],
                    out_parts[a],
                    lse_parts[a],
                    do_parts[a],
                    q_offsets[a],
                    k_offsets[b],
                )
                dq_parts[a] = dq_parts[a] + dq
                dk_parts[b] = dk_parts[b] + dk
                dv_parts[b] = dv_parts[b] + dv
        return following, (dk_acc + _join(dk_parts), dv_acc + _join(dv_parts)), dq_parts

    init = ((k, v, kv_seg), (zeros(k), zeros(v)), [zeros(x) for x in q_parts])
    _, pending, dq_parts = lax.fori_loop(0, n, step, init, unroll=True)
    # After n steps a device holds the complete dK / dV of the block of the next device: send it home.
    dk, dv = lax.ppermute(pending, spec.axis_name, ring)
    dq = _join(dq_parts)

    d_aux = None
    if aux is not None:
        # Sinks only add to the denominator: d aux_n = -sum_i exp(aux_n - lse_i) delta_i.
        delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)  # [B, Sq, H]
        sinks = _sink_logits(aux, num_heads)  # [H, n_sinks]
        p_sink = jnp.exp(sinks[None, :, None, :] - lse[..., None])  # [B, H, Sq, n_sinks]
        d_sinks = -jnp.sum(p_sink * jnp.swapaxes(delta, 1, 2)[..., None], axis=(0, 2))  # [H, n_sinks]
        d_aux = d_sinks[:, 0] if aux.shape[0] == num_heads else jnp.sum(d_sinks, axis=0)
        d_aux = sum_to_vma(d_aux, aux).astype(aux.dtype)
    # Summed over the mesh axes an input is replicated on (no-ops for the usual sharded q, k, v).
    grads = (sum_to_vma(g.astype(x.dtype), x) for g, x in ((dq, q), (dk, k), (dv, v)))
    return *grads, d_aux


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _ring(kernel, spec, q, k, v, aux, q_seg, kv_seg):
    return _forward(kernel, spec, q, k, v, aux, q_seg, kv_seg)[0]


def _ring_fwd(kernel, spec, q, k, v, aux, q_seg, kv_seg):
    out, lse = _forward(kernel, spec, q, k, v, aux, q_seg, kv_seg)
    return out, (q, k, v, aux, q_seg, kv_seg, out, lse)


def _ring_bwd(kernel, spec, residuals, d_out):
    dq, dk, dv, d_aux = _backward(kernel, spec, residuals, d_out)
    return dq, dk, dv, d_aux, None, None


_ring.defvjp(_ring_fwd, _ring_bwd)


def ring_attention(kernel: BlockKernel, spec: RingSpec, q, k, v, aux=None, q_seg=None, kv_seg=None):
    """Attention of the local query shard to the whole ring's keys, inside `shard_map` over `spec.axis_name`.

    Shapes (local shards): q [B, Lq, H, D], k [B, Lk, Hkv, D], v [B, Lk, Hkv, Dv], aux 1-D sink logits,
    q_seg [B, Lq] / kv_seg [B, Lk] int segment ids (both or neither), laid out as `spec.layout` says.
    Returns [B, Lq, H, Dv] in q.dtype. Differentiable in q, k, v and aux.
    """
    return _ring(kernel, spec, q, k, v, aux, q_seg, kv_seg)


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
    if layout == "zigzag" and (q_len % 2 or k_len % 2):
        raise ValueError(f"the zig-zag layout needs even local lengths, got {q_len} and {k_len}")


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


def run_ring(kernel: BlockKernel, spec: RingSpec, n: int, q, k, v, aux=None, q_seg=None, kv_seg=None):
    """`ring_attention` on contiguous shards, moving them to and from `spec.layout` around the ring."""
    if spec.layout == "zigzag":
        q, k, v, q_seg, kv_seg = (to_zigzag(x, spec.axis_name, n) for x in (q, k, v, q_seg, kv_seg))
    out = ring_attention(kernel, spec, q, k, v, aux, q_seg, kv_seg)
    return from_zigzag(out, spec.axis_name, n) if spec.layout == "zigzag" else out
