"""The linear-attention family's numerics: the chunked form's building blocks and the one-token steps.

Every op of the family (GLA, lightning, recurrent, the delta rules, and Mamba-2's SSD) is a linear
recurrence on a `[Dk, Dv]` state per head. The chunked form cuts the sequence into chunks of C tokens:
inside a chunk the recurrence unrolls into a masked product (parallel), and only chunk-entry states
pass from chunk to chunk (sequential). The blocks here are plain `jnp` on the trailing axes
(`[..., C, D]` chunks, `[..., Dk, Dv]` states), with any leading batch axes:

- `decay_matrix` / `gated_scores`: the intra-chunk masked product, for a per-head or a per-key-channel gate;
- `diagonal_chunk` / `delta_chunk`: a chunk reduced to `ChunkParts` (the delta rule through the WY/UT
  transform, `wy_transform`, with the explicit inverse of `unit_lower_inverse`);
- `chunk_output` / `chunk_carry` / `carry_transpose`: what a chunk's entry state gives (outputs, exit state);
- `diagonal_step` / `delta_step`: one token of each recurrence (the recurrent form and decoding).

Gates are log decays, summed cumulatively inside a chunk only (`b_t = Σ_{u<=t} a_u`), and used only
through differences `b_t − b_s` with `s <= t`: for decaying gates (`a <= 0`) every exponent is <= 0, so
nothing overflows however long the sequence, and no decay is ever divided by.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

# ---- intra-chunk masked product ----


def _lower(n: int, strict: bool = False) -> jax.Array:
    i = jnp.arange(n)
    return i[:, None] > i[None, :] if strict else i[:, None] >= i[None, :]


def decay_matrix(b: jax.Array, strict: bool = False) -> jax.Array:
    """`[..., C] -> [..., C, C]`: `exp(b_t − b_s)` for `s <= t` (`s < t` if strict), else 0 (masked before exp)."""
    mask = _lower(b.shape[-1], strict)
    diff = jnp.where(mask, b[..., :, None] - b[..., None, :], 0.0)
    return jnp.where(mask, jnp.exp(diff), 0.0)


def gated_scores(q: jax.Array, k: jax.Array, b: jax.Array) -> jax.Array:
    """`[..., C, D]` x3 -> `[..., C, C]`: `Σ_d q_td k_sd exp(b_td − b_sd)` for `s <= t`, else 0.

    `b` is the cumulative per-channel log gate; C a power of two. Built by halving: the pairs whose query
    lies in the right half of a block and key in its left half are one product through the gate `r` at
    the halves' boundary, `(q_t e^{b_t − r}) · (k_s e^{r − b_s})`, both exponents <= 0 for decaying
    gates; the pairs inside each half recurse, down to the diagonal `q_t · k_t`. No `[C, C, D]` weights
    are ever formed: each of the log2(C) levels reads every query and key once.
    """
    *lead, c, d = q.shape
    if c & (c - 1):
        raise ValueError(f"gated_scores needs a power-of-two chunk, got {c}")
    blocks = jnp.sum(q * k, axis=-1)[..., None, None]  # [..., C, 1, 1]: the diagonal blocks of size 1
    half = 1
    while half < c:
        n = c // (2 * half)
        qs, ks, bs = (x.reshape(*lead, n, 2, half, d) for x in (q, k, b))
        r = bs[..., 0, -1:, :]  # [..., n, 1, D]: the gate at the end of each left half
        cross = jnp.einsum(
            "...td,...sd->...ts",
            qs[..., 1, :, :] * jnp.exp(bs[..., 1, :, :] - r),
            ks[..., 0, :, :] * jnp.exp(r - bs[..., 0, :, :]),
        )
        inner = blocks.reshape(*lead, n, 2, half, half)
        upper = jnp.concatenate([inner[..., 0, :, :], jnp.zeros_like(cross)], axis=-1)
        lower = jnp.concatenate([cross, inner[..., 1, :, :]], axis=-1)
        blocks = jnp.concatenate([upper, lower], axis=-2)  # [..., n, 2·half, 2·half]
        half *= 2
    return blocks.reshape(*lead, c, c)


# ---- a chunk, reduced to what its entry state needs ----


class ChunkParts(NamedTuple):
    """One chunk of a linear recurrence, as linear maps of its entry state `h` (`[..., H, Dk, Dv]`).

    With `U = u − w h` (the chunk's effective values; `w` is None except for the delta rule):
    outputs `o = q_scale ⊙ (q h) + scores U` and exit state `decay[:, None] ⊙ h + kᵀ (k_scale ⊙ U)`
    (a scale of None is 1). `q` and `k` may be shared by groups of heads (`[..., G, C, Dk]`, head h
    reading group `h // (H // G)`, as Mamba-2's C and B): the per-head row scales then carry the gates,
    and no per-head copy of them is formed.
    """

    q: jax.Array  # [..., H or G, C, Dk] queries (scale applied; the decay since the chunk start too, or in q_scale)
    scores: jax.Array  # [..., H, C, C] intra-chunk weights (lower triangular)
    k: jax.Array  # [..., H or G, C, Dk] keys (decayed to the chunk end, or through k_scale)
    decay: jax.Array  # [..., H, Dk] decay of each state row over the chunk
    u: jax.Array  # [..., H, C, Dv]
    w: jax.Array | None  # [..., H, C, Dk]
    q_scale: jax.Array | None = None  # [..., H, C]
    k_scale: jax.Array | None = None  # [..., H, C]


def shared_matmul(a: jax.Array, b: jax.Array, *, trans_a: bool = False) -> jax.Array:
    """`op(a) @ b` per head, with `a [..., G, ·, ·]` shared by groups of the heads of `b [..., H, ·, ·]`.

    With G < H the product runs per group over its heads, without broadcasting `a` to every head.
    """
    groups, heads = a.shape[-3], b.shape[-3]
    if groups == heads:
        return (jnp.swapaxes(a, -1, -2) if trans_a else a) @ b
    split = b.reshape(*b.shape[:-3], groups, heads // groups, *b.shape[-2:])
    out = jnp.einsum("...gki,...grkj->...grij" if trans_a else "...gik,...grkj->...grij", a, split)
    return out.reshape(*b.shape[:-3], heads, *out.shape[-2:])


def diagonal_chunk(q, k, v, a_head=None, a_key=None) -> ChunkParts:
    """A chunk of `h_t = h_{t-1} ⊙ exp(a_head_t + a_key_t)[:, None] + k_t v_tᵀ`, `o_t = q_tᵀ h_t`.

    q, k `[..., C, Dk]` (q already scaled), v `[..., C, Dv]`; log gates a_head `[..., C]` per head
    and a_key `[..., C, Dk]` per key channel, each optional. Without a_key, q and k may be shared by
    groups of heads (`[..., G, C, Dk]` beside v's `[..., H, C, Dv]`).
    """
    if a_key is None:
        b = jnp.zeros(v.shape[:-1], jnp.float32) if a_head is None else jnp.cumsum(a_head, axis=-1)  # [..., H, C]
        qk = q @ jnp.swapaxes(k, -1, -2)  # [..., G, C, C]
        decays = decay_matrix(b)
        groups, heads = qk.shape[-3], decays.shape[-3]
        split = decays.reshape(*decays.shape[:-3], groups, heads // groups, *decays.shape[-2:])
        scores = (qk[..., :, None, :, :] * split).reshape(decays.shape)
        decay = jnp.broadcast_to(jnp.exp(b[..., -1:]), b.shape[:-1] + q.shape[-1:])
        return ChunkParts(q, scores, k, decay, v, None, q_scale=jnp.exp(b), k_scale=jnp.exp(b[..., -1:] - b))
    b = jnp.cumsum(a_key if a_head is None else a_key + a_head[..., None], axis=-2)  # [..., C, Dk]
    return ChunkParts(
        q * jnp.exp(b), gated_scores(q, k, b), k * jnp.exp(b[..., -1:, :] - b), jnp.exp(b[..., -1, :]), v, None
    )


def _exact_matmul(a: jax.Array, b: jax.Array) -> jax.Array:
    """`a @ b` in full float32 (GPUs otherwise multiply float32 in TF32, whose errors compound here)."""
    return jnp.matmul(a, b, precision=lax.Precision.HIGHEST)


@jax.custom_vjp
def unit_lower_inverse(lower: jax.Array) -> jax.Array:
    """`[..., C, C]` strictly lower triangular (float32) -> `(I + lower)⁻¹`, by block doubling.

    Batched matmuls instead of a triangular solve (a slow batched kernel on GPUs), about as accurate as
    forward substitution (unlike a Neumann series, whose powers of `lower` blow up for unnormalised keys).
    From the diagonal blocks of size 1 (all 1), each level merges pairs of diagonal blocks of size s,
    `[[A, 0], [X, B]]⁻¹ = [[A⁻¹, 0], [−B⁻¹ X A⁻¹, B⁻¹]]`, for all blocks at once. C is padded to a power
    of two with zero rows and columns of `lower` (identity rows of `I + lower`, which leave the rest exact).
    """
    *lead, c, _ = lower.shape
    size = 1 << max(0, c - 1).bit_length()
    blocks = jnp.pad(lower, [(0, 0)] * len(lead) + [(0, size - c)] * 2)[..., None, :, :]  # [..., 1, size, size]
    crosses = []  # lower-left quadrants of the diagonal blocks of sizes size, size/2, ..., 2
    while blocks.shape[-1] > 1:
        num, half = blocks.shape[-3], blocks.shape[-1] // 2
        split = blocks.reshape(*lead, num, 2, half, 2, half)
        crosses.append(split[..., 1, :, 0, :])
        diagonal = jnp.stack([split[..., 0, :, 0, :], split[..., 1, :, 1, :]], axis=-3)
        blocks = diagonal.reshape(*lead, 2 * num, half, half)
    inverse = jnp.ones_like(blocks)  # [..., size, 1, 1]: the inverted diagonal blocks of size 1
    for cross in reversed(crosses):
        num, half = cross.shape[-3], cross.shape[-1]
        pair = inverse.reshape(*lead, num, 2, half, half)
        first, second = pair[..., 0, :, :], pair[..., 1, :, :]
        merged = -_exact_matmul(second, _exact_matmul(cross, first))
        inverse = jnp.concatenate(
            [jnp.concatenate([first, jnp.zeros_like(merged)], axis=-1), jnp.concatenate([merged, second], axis=-1)],
            axis=-2,
        )
    return inverse.reshape(*lead, size, size)[..., :c, :c]


def _unit_lower_inverse_fwd(lower):
    inverse = unit_lower_inverse(lower)
    return inverse, inverse


def _unit_lower_inverse_bwd(inverse, g):
    """`d(I + L)⁻¹ = −T dL T`, so L's cotangent is `−Tᵀ g Tᵀ` on L's strictly lower part."""
    t = jnp.swapaxes(inverse, -1, -2)
    return (-jnp.tril(_exact_matmul(t, _exact_matmul(g, t)), -1),)


unit_lower_inverse.defvjp(_unit_lower_inverse_fwd, _unit_lower_inverse_bwd)


def wy_transform(k, v, beta, b, same_run=None, from_entry=None):
    """The delta rule's chunk in closed form: effective values `U = u − w h` from the entry state `h`.

    With `L[t,s] = beta_t exp(b_t − b_s) (k_t·k_s)` for `s < t` (same run), the chunk's values solve
    `(I + L) U = beta ⊙ (v − exp(b) ⊙ hᵀ k)`, so `u = (I + L)⁻¹ (beta ⊙ v)` and
    `w = (I + L)⁻¹ (beta exp(b) ⊙ k)`, through the explicit inverse of `unit_lower_inverse`.
    `from_entry [..., C]` masks the tokens that see the entry state; `same_run [..., C, C]` the pairs
    not separated by a restart. The products take k's and v's dtype (bfloat16 ones: bfloat16 operands),
    accumulated in float32; the system is solved in float32, and u, w come in float32.
    """
    product = functools.partial(jnp.matmul, preferred_element_type=jnp.float32)
    lower = decay_matrix(b, strict=True)
    if same_run is not None:
        lower = lower * same_run
    system = beta[..., :, None] * product(k, jnp.swapaxes(k, -1, -2)) * lower
    entry = beta * jnp.exp(b) * (1.0 if from_entry is None else from_entry)
    # Two products at the default precision of the path's other products (TF32 for float32 on GPUs), not one
    # of a concatenated right-hand side: on an H100 (gated_delta_rule B=2 S=16384 H=16 D=128 bf16, forward +
    # backward) the concatenation, its slices and float32 FMA products took 2 of 17 ms of kernel time.
    inverse = unit_lower_inverse(system)
    scaled = lambda x, by: (by[..., None] * x).astype(x.dtype)
    return product(inverse.astype(v.dtype), scaled(v, beta)), product(inverse.astype(k.dtype), scaled(k, entry))


def delta_chunk(q, k, v, beta, a_head=None, restarts=None) -> ChunkParts:
    """A chunk of the delta rule (`h ← h·exp(a_t)`, `u_t = beta_t (v_t − hᵀk_t)`, `h ← h + k_t u_tᵀ`).

    q, k `[..., C, Dk]` (q scaled), v `[..., C, Dv]`, beta and a_head `[..., C]`; `restarts [..., C]`
    (1 where the state is reset to zeros before the token, else 0) is optional.
    """
    b = jnp.zeros_like(beta) if a_head is None else jnp.cumsum(a_head, axis=-1)
    same_run = from_entry = to_exit = None
    if restarts is not None:
        run = jnp.cumsum((restarts > 0).astype(jnp.int32), axis=-1)  # restarts seen so far in the chunk
        same_run = (run[..., :, None] == run[..., None, :]).astype(q.dtype)
        from_entry = (run == 0).astype(q.dtype)
        to_exit = (run == run[..., -1:]).astype(q.dtype)
    u, w = wy_transform(k, v, beta, b, same_run, from_entry)
    scores = (q @ jnp.swapaxes(k, -1, -2)) * decay_matrix(b)
    q_in = q * jnp.exp(b)[..., None]
    k_out = k * jnp.exp(b[..., -1:] - b)[..., None]
    decay = jnp.exp(b[..., -1:])
    if restarts is not None:
        scores, q_in, k_out = scores * same_run, q_in * from_entry[..., None], k_out * to_exit[..., None]
        decay = decay * from_entry[..., -1:]
    return ChunkParts(q_in, scores, k_out, jnp.broadcast_to(decay, q.shape[:-2] + q.shape[-1:]), u, w)


# ---- inter-chunk state passing ----


def _values(p: ChunkParts, h):
    return p.u if p.w is None else p.u - p.w @ h


def _scaled(scale, x):
    return x if scale is None else scale[..., None] * x


def state_increment(p: ChunkParts, values: jax.Array) -> jax.Array:
    """What a chunk's values add to its exit state: `kᵀ (k_scale ⊙ values)`, `[..., H, Dk, Dv]`."""
    return shared_matmul(p.k, _scaled(p.k_scale, values), trans_a=True)


def chunk_output(p: ChunkParts, h: jax.Array) -> jax.Array:
    """Outputs `[..., C, Dv]` of a chunk entered with state `h`."""
    return _scaled(p.q_scale, shared_matmul(p.q, h)) + p.scores @ _values(p, h)


def chunk_carry(p: ChunkParts, h: jax.Array) -> jax.Array:
    """Exit state of a chunk entered with state `h`."""
    return p.decay[..., :, None] * h + state_increment(p, _values(p, h))


def carry_transpose(p: ChunkParts, g: jax.Array) -> jax.Array:
    """Gradient w.r.t. the entry state, of the exit state's gradient `g` (`chunk_carry` is linear in `h`)."""
    dh = p.decay[..., :, None] * g
    return dh if p.w is None else dh - jnp.swapaxes(p.w, -1, -2) @ (p.k @ g)


# ---- one token (recurrent form, decoding) ----


def diagonal_step(h, q, k, v, a_key=None, a_value=None):
    """`h ← h ⊙ exp(a_key)[:, None] ⊙ exp(a_value)[None, :] + k vᵀ`; returns `(h, qᵀ h)`.

    h `[..., Dk, Dv]`; q, k, a_key `[..., Dk]`; v, a_value `[..., Dv]` (q already scaled).
    """
    if a_key is not None:
        h = h * jnp.exp(a_key)[..., :, None]
    if a_value is not None:
        h = h * jnp.exp(a_value)[..., None, :]
    h = h + k[..., :, None] * v[..., None, :]
    return h, jnp.sum(q[..., :, None] * h, axis=-2)


def delta_step(h, q, k, v, beta, a_head=None, restarts=None):
    """One delta-rule token: restart, decay, `u = beta (v − hᵀk)`, `h ← h + k uᵀ`; returns `(h, qᵀ h)`.

    h `[..., Dk, Dv]`; q, k `[..., Dk]`; v `[..., Dv]`; beta, a_head and restarts (1 = reset) `[...]`.
    """
    if restarts is not None:
        h = jnp.where(restarts[..., None, None] > 0, 0.0, h)
    if a_head is not None:
        h = h * jnp.exp(a_head)[..., None, None]
    u = beta[..., None] * (v - jnp.sum(h * k[..., :, None], axis=-2))
    h = h + k[..., :, None] * u[..., None, :]
    return h, jnp.sum(q[..., :, None] * h, axis=-2)
