"""Chunk layout: per-token arrays `[B, S, H, ...]` cut into chunks `[NC, B, H, C, ...]` and back.

A batch keeps its rows; its tail chunk is padded with zeros. Packed sequences (`cu_seqlens`, batch 1)
are laid out so that every sequence starts on a chunk boundary (zeros between them): a chunk then
belongs to one sequence, and a state never crosses from one sequence into the next, because the
chunk that starts a sequence enters with that sequence's initial state instead of the carried one.
Zero tokens (k = v = 0, gates 0, beta 0) leave the state unchanged in every recurrence of the family.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from ejkernel.kernels._common.search import sorted_position


@dataclasses.dataclass(frozen=True)
class ChunkLayout:
    """Where every token sits in the chunked arrays, and where each sequence enters and leaves.

    `starts [NC, B]`: the index of the initial state a chunk enters with (the sequence it starts),
    or -1 where it carries on from the previous chunk. Packed only: `positions [T]` (each token's
    place in the flat chunked axis), `tokens [NC·C]` and `valid [NC·C]` (the reverse map), and
    `last_chunk [N]` / `empty [N]` (where each sequence's final state is read).
    """

    chunk: int
    num_chunks: int
    seq_len: int
    starts: jax.Array
    positions: jax.Array | None = None
    tokens: jax.Array | None = None
    valid: jax.Array | None = None
    last_chunk: jax.Array | None = None
    empty: jax.Array | None = None

    @staticmethod
    def dense(batch: int, seq_len: int, chunk: int) -> ChunkLayout:
        num_chunks = max(1, -(-seq_len // chunk))
        starts = jnp.full((num_chunks, batch), -1, jnp.int32).at[0].set(jnp.arange(batch, dtype=jnp.int32))
        return ChunkLayout(chunk, num_chunks, seq_len, starts)

    @staticmethod
    def packed(cu_seqlens: jax.Array, total: int, chunk: int) -> ChunkLayout:
        cu = cu_seqlens.astype(jnp.int32)
        num_seqs = cu.shape[0] - 1
        num_chunks = max(1, -(-(total + num_seqs * (chunk - 1)) // chunk))  # bound on Σ ceil(len / C)
        lengths = cu[1:] - cu[:-1]
        chunks_per_seq = (lengths + chunk - 1) // chunk
        first_chunk = jnp.cumsum(chunks_per_seq) - chunks_per_seq
        # The sequence each chunk belongs to: the last one starting at or before it (empty ones start
        # where their successor does, so they are never picked). `sorted_position`: one fused comparison where
        # the pairs are few, not jnp.searchsorted's default while loop (a fixed cost per step on a GPU).
        chunk_ids = jnp.arange(num_chunks, dtype=jnp.int32)
        owner = jnp.clip(sorted_position(first_chunk, chunk_ids) - 1, 0, num_seqs - 1)
        starts = jnp.where((first_chunk[owner] == chunk_ids) & (lengths[owner] > 0), owner, -1)
        slots = jnp.arange(num_chunks * chunk, dtype=jnp.int32)
        offset = slots - first_chunk[owner[slots // chunk]] * chunk
        seq_of_slot = owner[slots // chunk]
        valid = (offset >= 0) & (offset < lengths[seq_of_slot])
        token_ids = jnp.arange(total, dtype=jnp.int32)
        seq_of_token = jnp.clip(sorted_position(cu[1:], token_ids), 0, num_seqs - 1)
        positions = first_chunk[seq_of_token] * chunk + token_ids - cu[seq_of_token]
        return ChunkLayout(
            chunk,
            num_chunks,
            total,
            starts[:, None],
            positions=positions,
            tokens=jnp.where(valid, cu[seq_of_slot] + offset, 0),
            valid=valid,
            last_chunk=first_chunk + chunks_per_seq - 1,
            empty=lengths == 0,
        )

    def pad(self, x: jax.Array) -> jax.Array:
        """`[B, S, H, *feature] -> [B, NC·C, H, *feature]`: tokens where the chunks hold them, zeros elsewhere."""
        if self.tokens is None:
            if self.num_chunks * self.chunk == self.seq_len:
                return x
            return jnp.pad(x, [(0, 0), (0, self.num_chunks * self.chunk - self.seq_len)] + [(0, 0)] * (x.ndim - 2))
        mask = self.valid.reshape((1, -1) + (1,) * (x.ndim - 2))
        return jnp.where(mask, jnp.take(x, self.tokens, axis=1), 0)

    def unpad(self, y: jax.Array) -> jax.Array:
        """`[B, NC·C, H, *feature] -> [B, S, H, *feature]` (the inverse of `pad` on the tokens)."""
        if self.positions is None:
            return y if y.shape[1] == self.seq_len else y[:, : self.seq_len]
        return jnp.take(y, self.positions, axis=1)

    def to_chunks(self, x: jax.Array) -> jax.Array:
        """`[B, S, H, *feature] -> [NC, B, H, C, *feature]` (zeros where no token sits)."""
        x = self.pad(x)
        x = x.reshape(x.shape[0], self.num_chunks, self.chunk, *x.shape[2:])
        return jnp.moveaxis(x, (1, 2), (0, 3))

    def from_chunks(self, y: jax.Array) -> jax.Array:
        """`[NC, B, H, C, *feature] -> [B, S, H, *feature]`."""
        y = jnp.moveaxis(y, (0, 3), (1, 2))
        return self.unpad(y.reshape(y.shape[0], self.num_chunks * self.chunk, *y.shape[3:]))

    def ends(self) -> jax.Array:
        """`[NC, B]` int32: 1 where a chunk is its sequence's last (the next starts another, or none follows)."""
        return jnp.concatenate([self.starts[1:] >= 0, jnp.ones_like(self.starts[:1], bool)]).astype(jnp.int32)

    def owners(self) -> jax.Array:
        """`[NC, B]` int32: the sequence (index of its initial state) each chunk belongs to."""
        return jax.lax.cummax(self.starts, axis=0)

    def final_states(self, h_out: jax.Array, init: jax.Array) -> jax.Array:
        """Each sequence's state after its last token, from the chunks' exit states `[NC, B, ...]`."""
        if self.last_chunk is None:
            return h_out[-1]
        last = h_out[jnp.maximum(self.last_chunk, 0), 0]
        return jnp.where(self.empty[:, None, None, None], init, last)


def flip_time(xs: dict, cu_seqlens, initial_state):
    """Time reversed: per-token arrays flipped along axis 1, packed sequences (and their states) reordered."""
    xs = {name: jnp.flip(x, axis=1) for name, x in xs.items()}
    if cu_seqlens is None:
        return xs, None, initial_state
    total = xs["q"].shape[1]
    return xs, total - jnp.flip(cu_seqlens), jnp.flip(initial_state, axis=0)
