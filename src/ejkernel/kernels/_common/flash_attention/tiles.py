"""Tile machinery shared by the forward and backward passes of the XLA flash attention.

Both passes walk [block_q, block_k] tiles of the score matrix. `FlashPass` pads every input to block
multiples once per pass and knows how to compute one tile of scores (scaled, soft-capped, biased),
which entries of the tile may be attended, the tile's dropout mask, and which key blocks a query
block can see (and vice versa) under causal / sliding-window masking, so that fully masked tiles
are never visited.

Layouts inside a pass (G = query heads per key/value head):
    q   [B, Sqp, Hkv, G, D]      k  [B, Skp, Hkv, D]      v  [B, Skp, Hkv, Dv]
    scores / probabilities of a tile  [B, Hkv, G, block_q, block_k]
    per-row statistics (lse, ...)     [B, Hkv, G, Sqp]
    bias / mask                       [Bb, Hb1, Hb2, Sqp, Skp]  with (Hb1, Hb2) = (Hkv, G) or (1, 1)

Positions. Causal and sliding-window masks compare absolute positions `q_offset + i` and
`kv_offset + j` (int32 scalars, traced or not; both 0 by default): ring attention computes one
block of a longer sequence at a time and tells the tiles where its queries and keys sit.
Padding, dropout and segment ids stay in the block's own local indices.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
from jax import lax

from ejkernel.kernels._common.vma import varying_axes
from ejkernel.reference.dropout import dropout_keep

# Default tiles, and the most elements a [B, H, block_q, block_k] float32 score tile may hold before
# the default blocks are halved. Measured on an H200 (B=1, S=32k, H=16, D=128, bf16): the forward
# gains up to 1024 x 2048 and its temporaries are gone before the backward runs; the backward keeps
# several tiles alive at once, so it stops at 1024 x 1024 (peak of forward + backward 1.3 GiB).
DEFAULT_FWD_BLOCKS = (1024, 2048)
DEFAULT_BWD_BLOCKS = (1024, 1024)
FWD_TILE_BUDGET = 1 << 25
BWD_TILE_BUDGET = 1 << 24
MIN_DEFAULT_BLOCK = 64
# Windows are clamped to this reach when positions carry offsets (absolute positions stay below it).
OFFSET_WINDOW_REACH = 1 << 30


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
    """Static (hashable) options of one attention call; the custom VJP's non-differentiable part."""

    softmax_scale: float
    causal: bool
    sliding_window: tuple[int, int] | None
    logits_soft_cap: float | None
    dropout_prob: float
    normalize_output: bool
    precision: Any
    logits_dtype: Any
    fwd_blocks: tuple[int | None, int | None]
    bwd_blocks: tuple[int | None, int | None]


def resolve_blocks(
    blocks: tuple[int | None, int | None], backward: bool, batch_heads: int, q_len: int, k_len: int
) -> tuple[int, int]:
    """Block sizes of a pass: the requested ones, else defaults that shrink with batch * heads so
    that one score tile stays within the budget; both clamped to the sequence lengths."""
    defaults = DEFAULT_BWD_BLOCKS if backward else DEFAULT_FWD_BLOCKS
    budget = BWD_TILE_BUDGET if backward else FWD_TILE_BUDGET
    auto_q, auto_k = blocks[0] is None, blocks[1] is None
    block_q = min(defaults[0] if auto_q else blocks[0], q_len)
    block_k = min(defaults[1] if auto_k else blocks[1], k_len)
    while batch_heads * block_q * block_k > budget:
        can_q = auto_q and block_q > MIN_DEFAULT_BLOCK
        can_k = auto_k and block_k > MIN_DEFAULT_BLOCK
        if can_k and (block_k >= block_q or not can_q):
            block_k //= 2
        elif can_q:
            block_q //= 2
        else:
            break
    return block_q, block_k


def _pad_axis(x, axis: int, new_len: int, value):
    extra = new_len - x.shape[axis]
    if extra == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths, constant_values=value)


def _split_heads(x, num_kv_heads: int, group: int):
    """[Bx, Hx, Sq, Sk] with Hx in {1, H} -> [Bx, Hkv, G, Sq, Sk] or [Bx, 1, 1, Sq, Sk]."""
    if x.shape[1] == 1:
        return x[:, :, None]
    return x.reshape(x.shape[0], num_kv_heads, group, *x.shape[2:])


def sum_to_shape(x, shape):
    """Sum a broadcast result back down to `shape` (same rank, dims of 1 where broadcast)."""
    axes = tuple(i for i, (have, want) in enumerate(zip(x.shape, shape, strict=True)) if want == 1 and have != 1)
    return jnp.sum(x, axis=axes, keepdims=True) if axes else x


class FlashPass:
    """Padded inputs of one pass and the per-tile computations both passes share."""

    def __init__(
        self,
        spec: AttentionSpec,
        backward: bool,
        q,
        k,
        v,
        bias,
        q_seg,
        kv_seg,
        mask,
        seed,
        q_offset=None,
        kv_offset=None,
    ):
        self.spec = spec
        self.has_offsets = q_offset is not None or kv_offset is not None
        self.q_offset = jnp.int32(0) if q_offset is None else jnp.asarray(q_offset, jnp.int32)
        self.kv_offset = jnp.int32(0) if kv_offset is None else jnp.asarray(kv_offset, jnp.int32)
        # Every loop carry is made varying over the mesh axes the inputs vary over (inside shard_map).
        self.vma = varying_axes(q, k, v, bias, q_seg, kv_seg, mask, seed, q_offset, kv_offset)
        self.batch, self.q_len, self.num_heads, self.head_dim = q.shape
        self.k_len, self.num_kv_heads = k.shape[1], k.shape[2]
        self.group = self.num_heads // self.num_kv_heads
        blocks = spec.bwd_blocks if backward else spec.fwd_blocks
        self.block_q, self.block_k = resolve_blocks(
            blocks, backward, self.batch * self.num_heads, self.q_len, self.k_len
        )
        self.num_q_blocks = -(-self.q_len // self.block_q)
        self.num_k_blocks = -(-self.k_len // self.block_k)
        self.q_pad = self.num_q_blocks * self.block_q
        self.k_pad = self.num_k_blocks * self.block_k

        self.q = self.pad_q(q.reshape(self.batch, self.q_len, self.num_kv_heads, self.group, self.head_dim))
        self.k = _pad_axis(k, 1, self.k_pad, 0)
        self.v = _pad_axis(v, 1, self.k_pad, 0)
        self.bias = None
        if bias is not None:
            bias = _split_heads(bias, self.num_kv_heads, self.group)
            self.bias = _pad_axis(_pad_axis(bias, 3, self.q_pad, 0), 4, self.k_pad, 0)
        self.mask = None
        if mask is not None:
            mask = _split_heads(mask, self.num_kv_heads, self.group)
            self.mask = _pad_axis(_pad_axis(mask, 3, self.q_pad, False), 4, self.k_pad, False)
        self.q_seg = self.kv_seg = None
        if q_seg is not None:
            self.q_seg = _pad_axis(q_seg.astype(jnp.int32), 1, self.q_pad, -1)
            self.kv_seg = _pad_axis(kv_seg.astype(jnp.int32), 1, self.k_pad, -1)
        self.seed = seed
        # Absolute index b * H + h of every (batch, head) of a tile, for the dropout hash.
        b = jnp.arange(self.batch, dtype=jnp.int32)[:, None, None, None, None]
        hkv = jnp.arange(self.num_kv_heads, dtype=jnp.int32)[None, :, None, None, None]
        g = jnp.arange(self.group, dtype=jnp.int32)[None, None, :, None, None]
        self.batch_head = b * self.num_heads + hkv * self.group + g

        window = spec.sliding_window
        if window is not None:  # clamp so that block-range arithmetic stays well inside int32
            reach = OFFSET_WINDOW_REACH if self.has_offsets else self.q_pad + self.k_pad
            window = tuple(max(-reach, min(reach, int(w))) for w in window)
        self.window = window

    # ---- padding and slicing -------------------------------------------------------------------
    def pad_q(self, x, value=0):
        """Pad axis 1 (query positions) of a [B, Sq, ...] array to the block multiple."""
        return _pad_axis(x, 1, self.q_pad, value)

    def pad_rows(self, x, value):
        """Pad the last axis (query positions) of a per-row [B, Hkv, G, Sq] array."""
        return _pad_axis(x, x.ndim - 1, self.q_pad, value)

    def q_block(self, x, q0):
        return lax.dynamic_slice_in_dim(x, q0, self.block_q, axis=1)

    def k_block(self, x, k0):
        return lax.dynamic_slice_in_dim(x, k0, self.block_k, axis=1)

    def row_block(self, x, q0):
        return lax.dynamic_slice_in_dim(x, q0, self.block_q, axis=x.ndim - 1)

    def _tile_of(self, x, q0, k0):
        zero = jnp.int32(0)  # one index dtype: loop indices and Python ints are int64 under x64
        starts = (zero, zero, zero, jnp.asarray(q0, jnp.int32), jnp.asarray(k0, jnp.int32))
        return lax.dynamic_slice(x, starts, (*x.shape[:3], self.block_q, self.block_k))

    # ---- one tile ------------------------------------------------------------------------------
    def scores(self, q_blk, k_blk, q0, k0):
        """Scaled, soft-capped, biased scores of a tile (float32) and tanh(s/cap) for the backward."""
        spec = self.spec
        s = jnp.einsum(
            "bqhgd,bkhd->bhgqk", q_blk, k_blk, precision=spec.precision, preferred_element_type=spec.logits_dtype
        )
        s = s.astype(jnp.float32) * jnp.float32(spec.softmax_scale)
        tanh = None
        if spec.logits_soft_cap is not None:
            cap = jnp.float32(spec.logits_soft_cap)
            tanh = jnp.tanh(s / cap)
            s = cap * tanh
        if self.bias is not None:
            s = s + self._tile_of(self.bias, q0, k0).astype(jnp.float32)
        return s, tanh

    def allowed(self, q0, k0):
        """Boolean tile (broadcastable to [B, Hkv, G, bq, bk]) of entries that may be attended, or None."""
        spec = self.spec
        q_pos = q0 + jnp.arange(self.block_q, dtype=jnp.int32)[:, None]
        k_pos = k0 + jnp.arange(self.block_k, dtype=jnp.int32)[None, :]
        if self.has_offsets:  # absolute positions for causal / window, local ones for padding below
            q_abs, k_abs = q_pos + self.q_offset, k_pos + self.kv_offset
        else:
            q_abs, k_abs = q_pos, k_pos
        result = None

        def both(a, b):
            return b if a is None else a & b

        if spec.causal:
            result = both(result, k_abs <= q_abs)
        if self.window is not None:
            left, right = self.window
            result = both(result, (k_abs >= q_abs - left) & (k_abs <= q_abs + right))
        if self.q_seg is not None:
            qs = lax.dynamic_slice_in_dim(self.q_seg, q0, self.block_q, axis=1)[:, None, None, :, None]
            ks = lax.dynamic_slice_in_dim(self.kv_seg, k0, self.block_k, axis=1)[:, None, None, None, :]
            result = both(result, (qs == ks) & (qs >= 0) & (ks >= 0))  # padded keys carry id -1
        elif self.k_pad != self.k_len:
            result = both(result, k_pos < self.k_len)
        if self.mask is not None:
            result = both(result, self._tile_of(self.mask, q0, k0))
        return result

    def dropout_scale(self, q0, k0):
        """keep / (1 - rate) for a tile, float32 [B, Hkv, G, bq, bk]."""
        rate = self.spec.dropout_prob
        q_pos = q0 + jnp.arange(self.block_q, dtype=jnp.int32)[:, None]
        k_pos = k0 + jnp.arange(self.block_k, dtype=jnp.int32)[None, :]
        keep = dropout_keep(self.seed, self.batch_head, q_pos, k_pos, rate)
        return jnp.where(keep, jnp.float32(1.0 / (1.0 - rate)), jnp.float32(0.0))

    # ---- which tiles can hold an allowed entry -------------------------------------------------
    def k_block_range(self, qb):
        """[lo, hi) of key blocks that query block `qb` may see (static when nothing restricts it)."""
        if not self.spec.causal and self.window is None:
            return 0, self.num_k_blocks
        bq, bk = self.block_q, self.block_k
        # Rows in absolute positions, columns relative to this block's keys (local = absolute - kv_offset).
        shift = self.q_offset - self.kv_offset if self.has_offsets else 0
        first_row, last_row = qb * bq + shift, qb * bq + bq - 1 + shift
        lo, hi_col = jnp.int32(0), jnp.int32(self.k_pad - 1)  # hi_col: last column that may be allowed
        if self.spec.causal:
            hi_col = jnp.minimum(hi_col, last_row)
        if self.window is not None:
            left, right = self.window
            lo = jnp.maximum(lo, jnp.floor_divide(first_row - left, bk))
            hi_col = jnp.minimum(hi_col, last_row + right)
        hi = jnp.clip(jnp.floor_divide(hi_col, bk) + 1, 0, self.num_k_blocks)
        return jnp.clip(lo, 0, self.num_k_blocks), hi

    def q_block_range(self, kb):
        """[lo, hi) of query blocks that may see key block `kb`."""
        if not self.spec.causal and self.window is None:
            return 0, self.num_q_blocks
        bq, bk = self.block_q, self.block_k
        # Columns in this block's query coordinates (local row = absolute row - q_offset).
        shift = self.kv_offset - self.q_offset if self.has_offsets else 0
        first_col, last_col = kb * bk + shift, kb * bk + bk - 1 + shift
        lo_row, hi = jnp.int32(0), jnp.int32(self.num_q_blocks)
        if self.spec.causal:
            lo_row = jnp.maximum(lo_row, first_col)
        if self.window is not None:
            left, right = self.window
            lo_row = jnp.maximum(lo_row, first_col - right)
            hi = jnp.minimum(hi, jnp.floor_divide(last_col + left, bq) + 1)
        lo = jnp.floor_divide(lo_row, bq)
        return jnp.clip(lo, 0, self.num_q_blocks), jnp.clip(hi, 0, self.num_q_blocks)


def sink_logits(aux, num_kv_heads: int, group: int):
    """Sink logits per head as float32 [Hkv, G, n]: [aux[h]] when len(aux) == H, else all of aux."""
    aux = aux.astype(jnp.float32)
    num_heads = num_kv_heads * group
    if aux.shape[0] == num_heads:
        return aux.reshape(num_kv_heads, group, 1)
    return jnp.broadcast_to(aux, (num_kv_heads, group, aux.shape[0]))


def to_rows(x, num_kv_heads: int, group: int):
    """[B, Sq, H] -> [B, Hkv, G, Sq]."""
    b, s, _ = x.shape
    return jnp.moveaxis(x.reshape(b, s, num_kv_heads, group), 1, 3)


def from_rows(x):
    """[B, Hkv, G, Sq] -> [B, H, Sq]."""
    b, hkv, g, s = x.shape
    return x.reshape(b, hkv * g, s)
