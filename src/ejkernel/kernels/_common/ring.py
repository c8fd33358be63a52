"""Ring attention over a mesh axis: the platform-independent driver around a per-step block kernel.

Every device of the ring axis holds one shard of the sequence: its queries stay put while the key /
value blocks (with their segment ids) travel once around the ring with `lax.ppermute`. At each of the
n steps a device attends its queries to the block it holds, through a `BlockKernel` (one platform's
flash attention, told the absolute positions of its queries and keys), and folds the block's
(output, log-sum-exp) into its running result with the log-sum-exp merge

    lse = log(exp(lse_a) + exp(lse_b)),   out = out_a exp(lse_a - lse) + out_b exp(lse_b - lse).

The transfer of the next block is issued before the current block is computed, so that XLA can run
both at once. Blocks that causal or window masking hide entirely are skipped, merge included: when
tracing where a block is hidden (or visible) on every device of the ring, else on the device (`lax.cond`).
With equal query and key lengths each result starts as its diagonal block's (same positions: always
visible) rather than empty. Sinks (`softmax_aux`) join once, in the final merge.

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
- "contiguous": one piece of queries and one of keys, positions [d L, (d + 1) L).
- "mirrored": the sequence is cut into 2n chunks of L / 2. Device d keeps the first half of its queries
  (chunk 2d) and swaps the second (chunk 2d + 1) with device n - 1 - d, so that it holds query chunks 2d
  and 2n - 1 - 2d: a pair mirrored about the middle, so that under a causal mask every device has the
  same work. In the forward, keys and values stay where they are, in two pieces (chunks 2d and 2d + 1):
  the ring moves them anyway, and each step's transfer then starts from local data. The backward holds
  them mirrored like the queries (the forward keeps chunk 2n - 1 - 2d as it passes by), so that its
  steps, which wait for each other's gradients, carry equal work. Inputs arrive contiguous;
  `to_mirrored` / `from_mirrored` move the queries' (and the output's) second halves with one `ppermute`
  each way. A query piece and a key piece hold the same positions (the block a causal mask cuts along
  its diagonal) at step 0 for the first pieces, and for the second pieces at step 2d + 1 - n (mod n):
  known when tracing on rings of one or two devices, else chosen on the device (`lax.cond`).
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

    A kernel may have `forward_onto(prior, q, k, v, ...)` instead of `forward` (and no `lse_unit`): `forward`'s
    arguments after a running result `prior = (out, lse)` of the same queries over other keys, returning the
    union's result with `out` in the queries' dtype. The ring then keeps its running results in that dtype and
    merges nothing itself: the kernel merges as it writes, sparing a pass over the float32 results per block.
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

    def q_offsets(self, device, size: int, n: int) -> list:
        """Absolute position of the first query of each piece (of `size`) that `device` holds (traced int32, or an
        int for an int `device`)."""
        if self.layout == "contiguous":
            return [device * size]
        return [2 * device * size, (2 * n - 1 - 2 * device) * size]

    def kv_offsets(self, device, size: int, n: int, mirrored_keys: bool = False) -> list:
        """Absolute position of the first key of each piece (of `size`) that `device` holds (as `q_offsets`): the
        forward's mirrored layout keeps the two halves of the contiguous shard, its backward mirrors them too."""
        if self.layout == "contiguous" or mirrored_keys:
            return self.q_offsets(device, size, n)
        return [2 * device * size, (2 * device + 1) * size]

    def diagonal(self, step: int, a: int, b: int, n: int, device, mirrored_keys: bool = False):
        """Whether query piece a and key piece b (of equal lengths) hold the same positions at `step`, on the
        device whose own keys were held at step 0: a bool where the layout fixes it for every device, else
        a traced bool (the forward's second pieces on rings of more than two devices)."""
        if a != b:
            return False  # the mirrored layout's pieces 0 hold even chunks, its pieces 1 odd ones
        if a == 0 or mirrored_keys:
            return step == 0
        if n <= 2:
            return step == (1 - n) % n  # step 2d + 1 - n (mod n), the same step on every device
        if n % 2 == 0 and step % 2 == 0:  # on even rings 2d + 1 - n (mod n) is odd: never at an even step
            return False
        return jnp.mod(2 * jnp.asarray(device, jnp.int32) + 1 - n - step, n) == 0

    def visible(self, q_offset, q_len: int, kv_offset, kv_len: int):
        """May any query of the piece see any key of the other by position: a traced bool, a bool for int offsets,
        None where nothing masks by position."""
        last_q, last_k = q_offset + q_len - 1, kv_offset + kv_len - 1
        conditions = []
        if self.causal:
            conditions.append(kv_offset <= last_q)
        if self.window is not None:
            left, right = self.window
            conditions += [last_k >= q_offset - left, kv_offset <= last_q + right]
        if not conditions:
            return None
        if all(isinstance(c, bool) for c in conditions):
            return all(conditions)
        return functools.reduce(jnp.logical_and, conditions)


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


def _pairs(pieces: int) -> list[tuple[int, int]]:
    """The (query piece, key piece) pairs of one step, in the order they are computed: query piece 0 first,
    whose local queries and keys need no transfer at step 0 while the swapped queries arrive. (Ordering the
    last step so that what travels home finishes first, and sending each key piece's dK / dV home as soon as
    it was done, changed nothing measurable on 2 H200s: BENCHMARKS.md, session 34.)"""
    return [(a, b) for a in range(pieces) for b in range(pieces)]


def _fold(acc, pred, update, fill, axes):
    """The accumulator after one block: `update(acc)` (the block computed and combined in) where `pred` holds
    and `acc` unchanged where it does not, so that a hidden block costs neither its kernel nor the combine. `pred`
    is a bool where tracing decides it (no `lax.cond`), else traced. A None in `acc` is nothing accumulated yet:
    `update` takes the block's part there, and where `pred` does not hold, `fill(acc)` puts the empty result in
    its place. Typed varying over `axes`."""
    typed = lambda tree: jax.tree_util.tree_map(lambda x: vary(x, axes), tree)
    update_typed = lambda acc: typed(update(acc))
    if isinstance(pred, bool):
        return update_typed(acc) if pred else typed(fill(acc))
    return lax.cond(pred, update_typed, lambda acc: typed(fill(acc)), acc)


def _block(compute, diagonal, axes):
    """`compute(diagonal=...)` as a zero-argument call; a traced `diagonal` chooses the kernel on the device."""
    if isinstance(diagonal, bool):
        return functools.partial(compute, diagonal=diagonal)
    typed = lambda tree: jax.tree_util.tree_map(lambda x: vary(x, axes), tree)
    branch = lambda diag: lambda: typed(compute(diagonal=diag))
    return lambda: lax.cond(diagonal, branch(True), branch(False))


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
    """Elementwise sums of two tuples of gradients; a None in `acc` (nothing yet) takes `new`'s."""
    return tuple(y if x is None else x + y for x, y in zip(acc, new, strict=True))


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


def _ring_setup(spec: RingSpec, mirrored_keys: bool, q, k, *pieces):
    """Ring size, this device, the axes results vary over, the ring permutation, and `diagonal(step, a, b)`:
    whether query piece a and key piece b hold the same positions at that step (`RingSpec.diagonal`)."""
    n = lax.axis_size(spec.axis_name)
    me = lax.axis_index(spec.axis_name)
    axes = varying_axes(me, *jax.tree_util.tree_leaves((q, k, pieces)))
    diagonal = lambda step, a, b: q[a].shape[1] == k[b].shape[1] and spec.diagonal(step, a, b, n, me, mirrored_keys)
    return n, me, axes, [(i, (i + 1) % n) for i in range(n)], diagonal


def _bias_block(bias, piece: int, kv_offset, kv_len: int):
    """The columns of query piece `piece`'s bias rows that a key piece at `kv_offset` holds (None: no bias)."""
    return None if bias is None else lax.dynamic_slice_in_dim(bias[piece], kv_offset, kv_len, axis=3)


def _visibility(
    spec: RingSpec,
    diag,
    step: int,
    pieces: tuple[int, int],
    sizes: tuple[int, int],
    n: int,
    offsets,
    mirrored_keys: bool = False,
):
    """Whether query piece a may see key piece b at `step` (`pieces` (a, b) of `sizes` (Lq', Lk')): a bool where it is
    the same on every device of the ring (decided when tracing: no `lax.cond`, and a block hidden everywhere is not
    traced at all), else `spec.visible`'s traced bool at this device's `offsets`."""
    if diag is True:
        return True
    (a, b), (q_len, kv_len) = pieces, sizes

    def on(device):
        q_offset = spec.q_offsets(device, q_len, n)[a]
        kv_offset = spec.kv_offsets((device - step) % n, kv_len, n, mirrored_keys)[b]
        seen = spec.visible(q_offset, q_len, kv_offset, kv_len)
        return True if seen is None else seen

    everywhere = {on(device) for device in range(n)}
    return everywhere.pop() if len(everywhere) == 1 else spec.visible(offsets[0], q_len, offsets[1], kv_len)


def _forward(kernel: BlockKernel, spec: RingSpec, q, k, v, aux, q_seg, kv_seg, bias=None):
    n, me, axes, ring, diagonal = _ring_setup(spec, False, q, k, v, q_seg, kv_seg, bias)
    q_seg = (None,) * len(q) if q_seg is None else q_seg
    kv_seg = (None,) * len(k) if kv_seg is None else kv_seg
    batch, size, num_heads, _ = q[0].shape
    dv = v[0].shape[-1]
    q_offsets = spec.q_offsets(me, size, n)
    unit = getattr(kernel, "lse_unit", None)
    onto = getattr(kernel, "forward_onto", None)

    def empty():
        out = jnp.zeros((batch, size, num_heads, dv), jnp.float32 if onto is None else q[0].dtype)
        lse = jnp.full((batch, num_heads, size), -jnp.inf, jnp.float32)
        if unit is not None:
            lse = (jnp.zeros_like(lse), lse)
        return vary(out, axes), jax.tree_util.tree_map(lambda x: vary(x, axes), lse)

    merge = lambda acc, new: new if acc is None else _merge(acc, new, unit)
    # Each starts as its first block (empty where that block is hidden); one the kernel merges onto, as empty.
    results = [None if onto is None else empty() for _ in q]
    block = kept = (k, v, kv_seg)
    for s in range(n):  # unrolled (n is small): lets XLA overlap each transfer with compute across steps
        # Issue the transfer of the next block first: it runs while this block is computed.
        following = lax.ppermute(block, spec.axis_name, ring) if s < n - 1 else None
        k_cur, v_cur, seg_cur = block
        if spec.layout == "mirrored":
            kept = _keep_mirrored(kept, block, spec.diagonal(s, 1, 1, n, me))
        k_offsets = spec.kv_offsets((me - s) % n, k_cur[0].shape[1], n)
        for a, b in _pairs(len(q)):
            diag = diagonal(s, a, b)
            offsets = (q_offsets[a], k_offsets[b])
            args = (q[a], k_cur[b], v_cur[b], q_seg[a], seg_cur[b], *offsets)
            bias_block = _bias_block(bias, a, offsets[1], k_cur[b].shape[1])
            if onto is None:
                computed = _block(functools.partial(kernel.forward, *args, bias=bias_block), diag, axes)
                update = lambda acc, computed=computed: merge(acc, computed())
            else:
                update = lambda acc, args=args, bias_block=bias_block, diag=diag: _block(
                    functools.partial(onto, acc, *args, bias=bias_block), diag, axes
                )()
            visible = _visibility(spec, diag, s, (a, b), (size, k_cur[b].shape[1]), n, offsets)
            fill = lambda acc: empty() if acc is None else acc
            results[a] = _fold(results[a], visible, update, fill, axes)
        block = following
    if aux is not None:  # sinks join the denominator once, here
        sink_lse = jax.nn.logsumexp(_sink_logits(aux, num_heads), axis=-1)[None, :, None]
        results = [_with_sinks(out, lse, sink_lse, unit) for out, lse in results]
    return tuple(out.astype(q[0].dtype) for out, _ in results), tuple(lse for _, lse in results), kept


def _keep_mirrored(kept, block, here):
    """The backward's key pieces: the mirrored layout's second key piece of this device (chunk 2n - 1 - 2d)
    passes by in the forward's ring, at the step its second pieces meet (`here`: a bool, or traced on rings
    of more than two devices). Keeping it spares the backward a transfer and balances its steps: with keys in
    halves, two devices' work at steps 0 and 1 is 2.5 and 0.5 blocks, then 1.5 and 3.5, and as the gradients'
    transfer after each step makes both wait for the slower, the steps take 6 blocks' time instead of 4."""
    if here is False:
        return kept
    take = lambda old, new: new if here is True or new is None else jnp.where(here, new, old)
    return tuple((old[0], take(old[1], new[1])) for old, new in zip(kept, block, strict=True))


def _homeward(grads, like):
    """Finished gradients for their trip home: in the input's dtype where nothing is summed after arrival (the
    same rounding, half the bytes for bf16), else float32."""
    return tuple(
        g if varying_axes(g) - varying_axes(x) else g.astype(x.dtype) for g, x in zip(grads, like, strict=True)
    )


def _home(piece: int, n: int, mirrored: bool) -> list[tuple[int, int]]:
    """Where the backward's finished dK / dV of a key piece go: device d holds the next device's block, and
    its mirrored second piece (chunk 2n - 1 - 2(d + 1)) is the second half of device n - 2 - d's shard."""
    if mirrored and piece == 1:
        return [(d, (n - 2 - d) % n) for d in range(n)]
    return [(d, (d + 1) % n) for d in range(n)]


def _send_home(grads, axis_name: str, perm):
    """`ppermute`, skipped where every device keeps its own (the mirrored second pieces of a two-device ring)."""
    return grads if all(src == dst for src, dst in perm) else lax.ppermute(grads, axis_name, perm)


def _backward(kernel: BlockKernel, spec: RingSpec, residuals, d_out):
    q, k, v, aux, q_seg, kv_seg, bias, out, lse = residuals  # keys in the layout of `_keep_mirrored`
    mirrored = spec.layout == "mirrored"
    n, me, axes, ring, diagonal = _ring_setup(spec, mirrored, q, k, v, q_seg, kv_seg, bias, out, d_out)
    q_seg = (None,) * len(q) if q_seg is None else q_seg
    kv_seg = (None,) * len(k) if kv_seg is None else kv_seg
    size, num_heads = q[0].shape[1], q[0].shape[2]
    q_offsets = spec.q_offsets(me, size, n)
    zeros = lambda x: vary(jnp.zeros(x.shape, jnp.float32), axes)

    dq = [None] * len(q)  # each starts as its first block's (zeros where that block is hidden)
    dbias = None if bias is None else [zeros(x) for x in bias]  # blocks are placed into it, each once
    arrived = None
    block = (k, v, kv_seg)
    for s in range(n):
        # Two transfers run while this step computes: the next block, issued first, and the gradients this
        # device accumulated for the block it held last step, issued at that step's end. A key piece's dK / dV
        # of this step are summed apart and added to the arrived ones once the piece is done (so that no
        # kernel waits for that transfer); after the last step they are complete and go home.
        following = lax.ppermute(block, spec.axis_name, ring) if s < n - 1 else None
        k_cur, v_cur, seg_cur = block
        step_dk, step_dv = [None] * len(k_cur), [None] * len(v_cur)
        k_offsets = spec.kv_offsets((me - s) % n, k_cur[0].shape[1], n, mirrored)
        pairs = _pairs(len(q))
        for i, (a, b) in enumerate(pairs):
            diag = diagonal(s, a, b)
            offsets = (q_offsets[a], k_offsets[b])
            compute = functools.partial(
                kernel.backward,
                *(q[a], k_cur[b], v_cur[b], q_seg[a], seg_cur[b], out[a], lse[a], d_out[a], *offsets),
                bias=_bias_block(bias, a, offsets[1], k_cur[b].shape[1]),
            )
            visible = _visibility(spec, diag, s, (a, b), (size, k_cur[b].shape[1]), n, offsets, mirrored)
            shapes = (q[a], k_cur[b], v_cur[b])
            fill = lambda acc, shapes=shapes: (
                *(zeros(x) if g is None else g for g, x in zip(acc, shapes, strict=False)),
                *acc[len(shapes) :],
            )
            grads = _block(compute, diag, axes)
            acc = (dq[a], step_dk[b], step_dv[b])
            if bias is None:
                update = lambda acc, grads=grads: _add(acc, grads()[:3])
                dq[a], step_dk[b], step_dv[b] = _fold(acc, visible, update, fill, axes)
            else:
                place = functools.partial(_place, at=offsets[1])

                def update(acc, grads=grads, place=place):
                    new = grads()
                    return (*_add(acc[:3], new[:3]), place(acc[3], new[3]))

                dq[a], step_dk[b], step_dv[b], dbias[a] = _fold((*acc, dbias[a]), visible, update, fill, axes)
            done = all(later[1] != b for later in pairs[i + 1 :])  # key piece b is done for this step
            if done and arrived is not None:
                step_dk[b], step_dv[b] = _add((step_dk[b], step_dv[b]), tuple(g[b] for g in arrived))
        # Every transfer waits for the other device to reach it, and within a step the devices' shares of the
        # blocks differ (only their totals match): a transfer scheduled between a step's blocks would make each
        # wait for the other's share so far. XLA may start a piece's transfer as soon as that piece is done (it
        # did so with 4 KV heads: forward+backward 58.8 -> 67.6 ms on 2 H200s), so the step's gradients leave
        # together, after all its blocks.
        step_dk, step_dv = lax.optimization_barrier((step_dk, step_dv))
        if s < n - 1:
            arrived = lax.ppermute((step_dk, step_dv), spec.axis_name, ring)
            block = following
    # After n steps: the complete dK / dV of the next device's pieces, sent home.
    home = [
        _send_home(_homeward(grads, (k[b], v[b])), spec.axis_name, _home(b, n, mirrored))
        for b, grads in enumerate(zip(step_dk, step_dv, strict=True))
    ]
    dk, dv = (tuple(g) for g in zip(*home, strict=True))

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


def _place(full, block, *, at):
    """`full` [..., S] with `block` [..., Sk] written at columns [at, at + Sk)."""
    return lax.dynamic_update_slice_in_dim(full, block.astype(full.dtype), at, axis=full.ndim - 1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _ring(kernel, spec, q, k, v, aux, q_seg, kv_seg, bias):
    return _forward(kernel, spec, q, k, v, aux, q_seg, kv_seg, bias)[0]


def _ring_fwd(kernel, spec, q, k, v, aux, q_seg, kv_seg, bias):
    out, lse, (k, v, kv_seg) = _forward(kernel, spec, q, k, v, aux, q_seg, kv_seg, bias)
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
        halves = lambda x: None if x is None else (x[:, : x.shape[1] // 2], x[:, x.shape[1] // 2 :])
        join = lambda pieces: from_mirrored(pieces, spec.axis_name, n)
    else:
        split = halves = lambda x: None if x is None else (x,)
        join = lambda pieces: pieces[0]
    q, q_seg = split(q), split(q_seg)
    k, v, kv_seg = halves(k), halves(v), halves(kv_seg)
    if bias is not None:  # its query axis is 2: split it there
        bias = tuple(jnp.moveaxis(piece, 1, 2) for piece in split(jnp.moveaxis(bias, 2, 1)))
    return join(ring_attention(kernel, spec, q, k, v, aux, q_seg, kv_seg, bias))
