"""What a Mosaic GPU flash attention call fixes at trace time, and which tiles each block of rows needs.

Plain `jnp`/`lax`: importable (and testable) without loading Mosaic GPU, which the kernel modules
(`_parts`, `_fwd`, `_bwd`) do only when a kernel is traced.
"""

from __future__ import annotations

import dataclasses
import functools
import operator

import jax.numpy as jnp
from jax import lax

from ejkernel.kernels._common.attention import LOG2E, round_up

ROWS = 64  # rows per compute warpgroup: the M of one wgmma
COMPUTE_WGS = 2
CTA_ROWS = COMPUTE_WGS * ROWS  # query rows per forward / dQ CTA, key rows per dK/dV CTA


@dataclasses.dataclass(frozen=True)
class MosaicGpuFlashStatic:
    """What is fixed at trace time (hashable: it keys the custom VJP)."""

    softmax_scale: float
    soft_cap: float | None  # logits become cap · tanh(logits / cap)
    causal: bool
    window: tuple[int, int] | None
    q_len: int  # true lengths; the arrays the kernels see are padded to tile multiples
    kv_len: int
    num_heads: int
    num_kv_heads: int
    block_k: int  # key/value rows per streamed tile of the forward
    stages: int  # shared-memory slots per stream in the forward
    block_k_dq: int  # key/value rows per streamed tile of the dQ kernel
    block_q_dkv: int  # query rows per streamed tile of the dK/dV kernel
    stages_bwd: int
    bounded: bool = False  # soft-capped bfloat16: 2^logit never overflows, so no running max, no rescaling
    exp2_fma_cols: int = 0  # columns of each forward score tile whose exp2 runs on the FMA units
    row_sums_on_tc: bool = False  # bf16 ping-pong forward: row sums as P·e₀ on the tensor cores, not an add per score
    q_prescaled: bool = False  # forward with `bounded`: q times the tanh's input scale once, in shared memory
    fused_bwd: bool = False  # one backward kernel; dQ added into float32 HBM by TMA reductions
    # forward without soft cap (and the float8 forward where asked): tile t's Q·Kᵀ issued with tile t-1's P·V,
    # softmax beside P·V
    overlap: bool = False
    overlap_schedule: bool = True  # with `overlap`: the two warpgroups still take turns issuing matmuls
    q_tiles_per_cta: int = 1  # forward: 1, or 2 (a long and a short causal tile; an even tile count)
    heads_major: bool = False  # arrays [B, H, S, D] (block-sparse attention's layout), not [B, S, H, D]
    # streamed tiles fetched into L2 this many steps before their copy (0: none): block-sparse walks
    # visit each tile a few times, so its first read misses L2 and waits on memory
    prefetch: int = 0

    @property
    def group(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def scale2(self) -> float:
        return self.softmax_scale * LOG2E

    @property
    def tanh_scale(self) -> float:
        """The soft cap's tanh input per raw score: `tanh(q·k · scale / cap)`."""
        return self.softmax_scale / self.soft_cap

    @property
    def kv_len_padded(self) -> int:
        """Key/value length the kernels see: a multiple of every key tile and of a CTA's rows."""
        return round_up(self.kv_len, max(CTA_ROWS, self.block_k))

    @property
    def fused_scale(self) -> bool:
        """Unmasked tiles may scale inside the exponent (`exp2(qk·c - m)`, one FMA per score)."""
        return self.soft_cap is None and self.scale2 > 0


SMEM_BYTES = 227 * 1024  # shared memory one Hopper CTA may use


def float8_smem_bytes(head_dim: int, block_k: int, stages: int) -> int:
    """Shared memory of the float8 forward (`_fwd_fp8`): per compute warpgroup its e4m3 Q tile and its bfloat16
    output tile (P lives in registers); a ring of `stages` e4m3 K and Vᵀ tiles; the per-row scales. Barriers (a few
    dozen bytes) left out.

    At head dim 128 and block_k 128: 16 KiB of Q, 32 KiB of output, 32 KiB per stage, 1 KiB of scales: 113 KiB at
    2 stages, 209 KiB at 5.
    """
    per_warpgroup = ROWS * head_dim + ROWS * head_dim * 2 + 2 * ROWS * 4
    return COMPUTE_WGS * per_warpgroup + stages * 2 * block_k * head_dim


# ---- which key tiles a block of query rows needs (and the converse) ----


def _cdiv(a, b: int):
    return lax.div(a + (b - 1), jnp.int32(b))


def _tile_range(lo_elem, hi_elem, full_lo_elem, full_hi_elem, block: int, num_blocks: int):
    """Element bounds -> tile bounds `(lo, hi, full_lo, full_hi)`, all within [0, num_blocks].

    Monotone in the element bounds, so the ranges of a CTA's two warpgroups nest as `run_segments`
    needs; capped at `num_blocks` so no tile past the padded array is ever streamed.
    """
    lo = jnp.minimum(lax.div(lo_elem, jnp.int32(block)), num_blocks)
    hi = jnp.minimum(jnp.maximum(_cdiv(hi_elem, block), lo), num_blocks)
    f_lo = jnp.clip(_cdiv(full_lo_elem, block), lo, hi)
    f_hi = jnp.clip(lax.div(full_hi_elem, jnp.int32(block)), f_lo, hi)
    return lo, hi, f_lo, f_hi


def key_ranges(st: MosaicGpuFlashStatic, row0, rows: int, block: int, num_blocks: int):
    """Key tiles of query rows [row0, row0+rows) among `num_blocks`: `(lo, hi, full_lo, full_hi)`.

    Tiles [lo, hi) hold at least one allowed key of some row; [full_lo, full_hi) ⊆ [lo, hi) hold
    only keys every row may see (no mask needed).
    """
    last = row0 + rows - 1
    key_lo, key_hi = jnp.int32(0), jnp.int32(st.kv_len)  # allowed keys of some row: [key_lo, key_hi)
    full_lo, full_hi = jnp.int32(0), jnp.int32(st.kv_len)  # allowed for every row
    right = 0 if st.causal else None
    if st.window is not None:
        left, w_right = st.window
        key_lo, full_lo = jnp.maximum(row0 - left, 0), jnp.maximum(last - left, 0)
        right = w_right if right is None else min(right, w_right)
    if right is not None:
        key_hi = jnp.minimum(key_hi, last + right + 1)
        full_hi = jnp.minimum(full_hi, row0 + right + 1)
    return _tile_range(key_lo, key_hi, full_lo, full_hi, block, num_blocks)


def query_ranges(st: MosaicGpuFlashStatic, col0, cols: int, block: int, num_blocks: int):
    """Query tiles that see keys [col0, col0+cols): `(lo, hi, full_lo, full_hi)` as in `key_ranges`."""
    last = col0 + cols - 1
    q_lo, q_hi = jnp.int32(0), jnp.int32(num_blocks * block)
    full_lo, full_hi = jnp.int32(0), jnp.int32(num_blocks * block)
    right = 0 if st.causal else None
    if st.window is not None:
        left, w_right = st.window
        q_hi, full_hi = jnp.minimum(q_hi, last + left + 1), jnp.minimum(full_hi, col0 + left + 1)
        right = w_right if right is None else min(right, w_right)
    if right is not None:  # key <= query + right  <=>  query >= key - right
        q_lo, full_lo = jnp.maximum(col0 - right, 0), jnp.maximum(last - right, 0)
    return _tile_range(q_lo, q_hi, full_lo, full_hi, block, num_blocks)


def allowed(st: MosaicGpuFlashStatic, key_minus_query, key, q0, k0):
    """Boolean tile: may each (query, key) pair attend? None: every pair may.

    Positions are tile offsets (`key - query` and `key`, int32 tiles) plus the tile's origin `(q0, k0)`,
    so each condition is one compare of a tile with a scalar. Keys past `kv_len` need a test only
    where the arrays hold padded keys.
    """
    d0 = q0 - k0  # key - query = key_minus_query - d0
    tests = []
    if st.kv_len < st.kv_len_padded:
        tests.append(key < st.kv_len - k0)
    if st.causal:
        tests.append(key_minus_query <= d0)
    if st.window is not None:
        left, right = st.window
        tests += [key_minus_query >= d0 - left, key_minus_query <= d0 + right]
    return functools.reduce(operator.and_, tests) if tests else None
