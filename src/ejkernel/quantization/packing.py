"""Bit packing of codes into uint32 words along the last axis, LSB-first.

Code `i` of a row occupies bits `[i*b, (i+1)*b)` of the row's bit stream and word `w` holds bits
`[32w, 32w + 32)`, so a width dividing 32 puts code `i` in word `i // (32/b)` at shift
`(i % (32/b)) * b`, and an odd width (3, 5, 6, 7) splits some codes over two words: low bits in
word `w`, high bits in word `w + 1`. Bits past the last code are zero.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ejkernel.quantization.modes import packed_words

UNPACK_POLICIES = ("auto", "fast", "generic")


def _pad_last(x: jnp.ndarray, size: int) -> jnp.ndarray:
    extra = size - x.shape[-1]
    return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, extra)]) if extra else x


@functools.partial(jax.jit, static_argnames=("bits",))
def pack_codes(codes: jnp.ndarray, bits: int) -> jnp.ndarray:
    """uint32 `[..., ceil(n*bits/32)]` holding the codes `[..., n]` (each below `2**bits`)."""
    codes = codes.astype(jnp.uint32)
    lead, n = codes.shape[:-1], codes.shape[-1]
    words = packed_words(n, bits)
    if 32 % bits == 0:  # whole codes per word: shift each into place and add (the bits are disjoint)
        per_word = 32 // bits
        grouped = _pad_last(codes, words * per_word).reshape(*lead, words, per_word)
        shifts = jnp.arange(per_word, dtype=jnp.uint32) * bits
        return jnp.sum(grouped << shifts, axis=-1, dtype=jnp.uint32)
    # Odd widths: spell out the bit stream (one uint8 per bit), then gather it 32 bits per word.
    stream = ((codes[..., None] >> jnp.arange(bits, dtype=jnp.uint32)) & 1).astype(jnp.uint8)
    stream = _pad_last(stream.reshape(*lead, n * bits), words * 32).reshape(*lead, words, 32)
    return jnp.sum(stream.astype(jnp.uint32) << jnp.arange(32, dtype=jnp.uint32), axis=-1, dtype=jnp.uint32)


@functools.partial(jax.jit, static_argnames=("bits", "n", "policy"))
def unpack_codes(words: jnp.ndarray, bits: int, n: int, policy: str = "auto") -> jnp.ndarray:
    """uint32 codes `[..., n]` from packed words `[..., ceil(n*bits/32)]`.

    `policy`: `"fast"` splits each word into its `32/bits` codes (widths dividing 32 only), `"generic"`
    reads each code from the one or two words it spans (any width), `"auto"` the first where it applies.
    """
    if policy not in UNPACK_POLICIES:
        raise ValueError(f"dequant_unpack_policy must be one of {UNPACK_POLICIES}, got {policy!r}")
    fast = 32 % bits == 0
    if policy == "fast" and not fast:
        raise ValueError(f"dequant_unpack_policy='fast' needs bits dividing 32, got bits={bits}")
    mask = jnp.uint32((1 << bits) - 1)
    if fast and policy != "generic":
        per_word = 32 // bits
        shifts = jnp.arange(per_word, dtype=jnp.uint32) * bits
        codes = (words[..., None] >> shifts) & mask
        return codes.reshape(*words.shape[:-1], words.shape[-1] * per_word)[..., :n]
    start = np.arange(n) * bits
    first, shift = start // 32, (start % 32).astype(np.uint32)
    spills = shift + bits > 32  # the code's high bits continue in the next word
    low = jnp.take(words, first, axis=-1) >> shift
    # For a code that does not spill, the shift below is 0 and its result is masked away.
    high = jnp.take(words, np.minimum(first + 1, words.shape[-1] - 1), axis=-1) << np.where(spills, 32 - shift, 0)
    return (low | jnp.where(spills, high, 0)) & mask
