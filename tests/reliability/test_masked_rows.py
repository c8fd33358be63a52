"""`scaled_dot_product_attention` gives zeros for a query row that sees no key, as `flash_attention` and
`attention` do, whatever hides the keys: segments, a window past the keys, a key length of 0. Nothing
flows back from such a row. Checked on the XLA route against the float32 reference (rows with no allowed
key are 0 there and take no part in any gradient), eagerly and under jit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ejkernel.modules import scaled_dot_product_attention
from ejkernel.reference.flash_attention import flash_attention_reference
from ejkernel.types import MaskInfo
from harness import check_forward_and_grads, randn

B, SQ, SK, H, HKV, D = 2, 24, 16, 4, 2, 16


def _ids(rows):
    return jnp.asarray(np.array(rows, np.int32))


def _lengths_as_segments(lengths, length):
    """Key lengths as the reference's segment ids: 0 for a key within the row's length, -1 past it."""
    return jnp.where(jnp.arange(length)[None] < jnp.asarray(lengths)[:, None], 0, -1).astype(jnp.int32)


def segment_case():
    """Queries of segment 2 (row 0) and 3 (row 1) share no key."""
    q_seg = _ids([[0] * 8 + [1] * 8 + [2] * 8, [1] * 12 + [3] * 12])
    kv_seg = _ids([[0] * 6 + [1] * 10, [1] * 16])
    options = dict(mask_info=MaskInfo.from_segments(q_seg, kv_seg))
    return (None, None), options, dict(q_segment_ids=q_seg, kv_segment_ids=kv_seg)


def window_case():
    """A window (3, 0) over 16 keys (row 1: 9) leaves queries from 19 (row 1: 12) with none."""
    lengths = jnp.array([SK, 9], jnp.int32)
    kv_seg = _lengths_as_segments(lengths, SK)
    ref = dict(q_segment_ids=jnp.zeros((B, SQ), jnp.int32), kv_segment_ids=kv_seg, sliding_window=(3, 0))
    return (None, lengths), dict(sliding_window=(3, 0)), ref


def empty_keys_case():
    """Row 0 has key length 0, row 1 has 5 keys under a causal mask."""
    lengths = jnp.array([0, 5], jnp.int32)
    ref = dict(q_segment_ids=jnp.zeros((B, SQ), jnp.int32), kv_segment_ids=_lengths_as_segments(lengths, SK))
    return (None, lengths), dict(causal=True), {**ref, "causal": True}


CASES = {
    "query segment with no key": segment_case,
    "window past the keys": window_case,
    "key length 0": empty_keys_case,
}


def _call(case, jit):
    lengths, options, ref_options = CASES[case]()
    fn = lambda q, k, v: scaled_dot_product_attention(q, k, v, None, *lengths, platform="xla", **options)
    ref = lambda q, k, v: flash_attention_reference(q, k, v, softmax_scale=D**-0.5, **ref_options)
    return (jax.jit(fn) if jit else fn), ref


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("case", CASES)
def test_rows_without_keys_match_the_reference(case, jit):
    fn, ref = _call(case, jit)
    q, k, v = randn((B, SQ, H, D)), randn((B, SK, HKV, D)), randn((B, SK, HKV, D))
    empty = ~jnp.any(ref(q, k, v) != 0, axis=(2, 3))  # [B, Sq]: the reference's rows with no key
    assert 0 < int(empty.sum()) < B * SQ, "the case must hold rows with and without keys"
    check_forward_and_grads(fn, ref, [q, k, v], (0, 1, 2), jnp.float32)

    out, vjp = jax.vjp(fn, q, k, v)
    assert bool(jnp.all(out[empty] == 0))
    only_empty = jnp.where(empty[:, :, None, None], randn(out.shape), 0.0)  # a cotangent on those rows alone
    for name, grad in zip("qkv", vjp(only_empty), strict=True):
        assert bool(jnp.all(grad == 0)), f"grad of {name}: rows without keys sent back {float(jnp.abs(grad).max())}"


@pytest.mark.gpu
@pytest.mark.parametrize(
    "options",
    [
        dict(sliding_window=(3, 0), lengths=(32, 9)),
        dict(causal=True, sliding_window=(3, 0), lengths=(32, 9)),
        dict(causal=True, lengths=(0, 5)),
    ],
    ids=["window past the keys", "causal window past the keys", "key length 0"],
)
def test_cudnn_route_rows_without_keys(options):
    """The cuDNN route (bfloat16; it takes no dense mask, so no segment case) zeros the same rows as the XLA
    route, and sends nothing back from them: its gradients are finite and match the XLA route's."""
    options = dict(options)
    lengths = jnp.asarray(options.pop("lengths"), jnp.int32)
    q, k, v = (randn((B, 32, h, 64), jnp.bfloat16) for h in (H, HKV, HKV))
    route = lambda platform: (
        lambda q, k, v: scaled_dot_product_attention(q, k, v, None, None, lengths, platform=platform, **options)
    )
    check_forward_and_grads(route("cuda"), route("xla"), [q, k, v], (0, 1, 2), jnp.bfloat16)
    out, vjp = jax.vjp(route("cuda"), q, k, v)
    empty = ~jnp.any(route("xla")(q, k, v) != 0, axis=(2, 3))
    assert int(empty.sum()) > 0 and bool(jnp.all(out[empty] == 0))
    only_empty = jnp.where(empty[:, :, None, None], randn(out.shape, out.dtype), 0).astype(out.dtype)
    for name, grad in zip("qkv", vjp(only_empty), strict=True):
        assert bool(jnp.all(grad == 0)), f"grad of {name}: rows without keys sent back {float(jnp.abs(grad).max())}"
