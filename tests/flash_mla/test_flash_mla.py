"""flash_mla: the XLA implementation and the public function against the reference; RoPE modes, options, errors."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ejkernel.kernels._xla.flash_mla._interface import flash_mla_xla
from ejkernel.modules import FlashMLAConfig, flash_mla
from ejkernel.ops import BwdParams, FwdParams
from ejkernel.reference.flash_mla import flash_mla_reference
from harness import assert_close, check_forward_and_grads, randn

# Several (partial) tiles per call: one test uses them (tiling is the flash attention core's, tested there);
# the others run the implementation's default tiles, one per call, which compile several times faster on CPU.
SMALL = FlashMLAConfig(
    platform="xla", fwd_params=FwdParams(block_q=16, block_k=16), bwd_params=BwdParams(block_q=16, block_k=32)
)
B, S, H, HKV, RANK, NOPE, ROPE, DV = 2, 37, 4, 2, 32, 16, 8, 24


def mla_inputs(mode="decoupled", q_len=S, kv_len=S, dtype=jnp.float32):
    """(query, key_value, w_kc, w_vc, b_q, b_k) for a RoPE mode: "none", "b_k" or "decoupled" / "per_head"."""
    q_dim = NOPE + ROPE if mode == "b_k" else NOPE
    tensors = [
        randn((B, q_len, H, q_dim), dtype),
        randn((B, kv_len, RANK), dtype),
        randn((RANK, HKV, NOPE), dtype, scale=RANK**-0.5),
        randn((RANK, HKV, DV), dtype, scale=RANK**-0.5),
        None,
        None if mode == "none" else randn((B, kv_len, ROPE), dtype),
    ]
    if mode in ("decoupled", "per_head"):
        tensors[4] = randn((B, q_len, H, ROPE) if mode == "per_head" else (B, q_len, ROPE), dtype)
    return tensors


def _check(tensors, dtype=jnp.float32, extra=(), cfg=None, **options):
    """XLA vs reference, jitted, forward and the VJP of every float tensor given (and of `extra` options)."""
    names = list(extra)
    given = [i for i, t in enumerate(tensors) if t is not None]
    args = [tensors[i] for i in given] + [options.pop(name) for name in names]

    def call(impl, *a):
        full = [None] * 6
        for i, t in zip(given, a, strict=False):
            full[i] = t
        return impl(*full, **dict(zip(names, a[len(given) :], strict=True)), **options)

    fn = jax.jit(functools.partial(call, functools.partial(flash_mla_xla, cfg=cfg)))
    ref = jax.jit(functools.partial(call, flash_mla_reference))
    check_forward_and_grads(fn, ref, args, tuple(range(len(args))), dtype)


def test_no_rope_with_every_mask_cap_sinks_and_bias():
    tensors = mla_inputs("none")
    tensors[0] = tensors[0] * 3.0
    mask = jax.random.bernoulli(jax.random.PRNGKey(3), 0.8, (B, 1, S, S))
    options = dict(causal=True, sliding_window=(9, 2), logits_soft_cap=2.5, attention_mask=mask)
    _check(tensors, extra=("softmax_aux", "bias"), softmax_aux=randn((H,)), bias=randn((1, H, S, S)), **options)


def test_rope_in_query_packed_sequences_small_tiles():
    """Three packed sequences and 4 padding positions; several partial tiles per call."""
    _check(mla_inputs("b_k"), cfg=SMALL, cu_seqlens=jnp.array([0, 12, 13, 33], jnp.int32), causal=True)


def test_decoupled_per_head_rope_bf16_with_dropout():
    options = dict(dropout_prob=0.3, deterministic=False, dropout_rng=jax.random.PRNGKey(11), causal=True)
    _check(mla_inputs("per_head", dtype=jnp.bfloat16), jnp.bfloat16, **options)


def test_decode_one_query_against_long_context():
    _check(mla_inputs("b_k", q_len=1, kv_len=100), softmax_scale=0.3)


def test_padding_rows_are_zero_with_finite_gradients():
    tensors = [t for t in mla_inputs() if t is not None]
    cu = jnp.array([0, 20, 30], jnp.int32)  # positions 30.. are padding
    call = lambda *t: flash_mla(*t[:4], t[4], t[5], cu, causal=True)
    out, grads = jax.jit(lambda *t: (call(*t), jax.grad(lambda *t: jnp.sum(jnp.sin(call(*t))), range(6))(*t)))(*tensors)
    assert bool(jnp.all(out[:, 30:] == 0)) and bool(jnp.all(out[:, :30] != 0))
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in grads)
    assert bool(jnp.all(grads[0][:, 30:] == 0))


@pytest.mark.lowest
def test_public_function_defaults_jit_vmap_checkpoint():
    q, kv, wk, wv, bq, bk = mla_inputs()
    ref = jax.jit(functools.partial(flash_mla_reference, sliding_window=(5, 5)))(q, kv, wk, wv, bq, bk)
    assert_close(jax.jit(functools.partial(flash_mla, sliding_window=5))(q, kv, wk, wv, bq, bk), ref)
    batched = jax.jit(jax.vmap(lambda q, kv: flash_mla(q[None], kv[None], wk, wv)[0]))
    assert_close(batched(q[..., :NOPE], kv), jax.jit(flash_mla_reference)(q[..., :NOPE], kv, wk, wv))
    loss = lambda f: jax.jit(jax.grad(lambda kv: jnp.sum(jnp.tanh(f(q, kv, wk, wv, bq, bk)))))
    assert_close(loss(jax.checkpoint(flash_mla))(kv), loss(flash_mla_reference)(kv), tol=1e-4)


def test_dropout_is_deterministic_per_key_and_off_when_deterministic():
    q, kv, wk, wv, bq, bk = mla_inputs()
    drop = jax.jit(
        lambda key, det: flash_mla(q, kv, wk, wv, bq, bk, dropout_prob=0.5, deterministic=det, dropout_rng=key),
        static_argnums=1,
    )
    a, b, c = drop(jax.random.PRNGKey(1), False), drop(jax.random.PRNGKey(1), False), drop(jax.random.PRNGKey(2), False)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not np.allclose(np.asarray(a), np.asarray(c))
    assert_close(drop(jax.random.PRNGKey(1), True), flash_mla_reference(q, kv, wk, wv, bq, bk))


@pytest.mark.lowest
@pytest.mark.parametrize(
    ("change", "error", "words"),
    [
        (lambda t: (t[0][..., :5], *t[1:]), ValueError, "query's last dim"),
        (lambda t: (*t[:4], t[4], None), ValueError, "b_q .* needs b_k"),
        (lambda t: (t[0], t[1][:1], *t[2:]), Exception, "key_value"),
        (lambda t: (*t[:2], t[2][:5], *t[3:]), Exception, "w_kc"),
        (lambda t: (t[0], t[1].astype(jnp.bfloat16), *t[2:]), TypeError, "share a dtype"),
        (lambda t: (t[0][:, :, :3], *t[1:]), ValueError, "multiple of kv_heads"),
    ],
)
def test_bad_tensors_name_the_argument(change, error, words):
    with pytest.raises(error, match=words):
        flash_mla(*change(mla_inputs()))


@pytest.mark.lowest
@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        (dict(dropout_prob=0.1, deterministic=False), ValueError, "dropout_rng"),
        (dict(dropout_prob=1.5), ValueError, "dropout_prob"),
        (dict(logits_soft_cap=-1.0), ValueError, "logits_soft_cap"),
        (dict(bias=jnp.zeros((3, H, S, S))), ValueError, "bias"),
        (dict(attention_mask=randn((B, 1, S, S))), TypeError, "attention_mask"),  # additive: a bias
        (dict(sliding_window=-2), ValueError, "sliding_window"),
        (dict(platform="triton"), ValueError, "flash_mla"),
    ],
)
def test_bad_options_name_the_argument(options, error, words):
    with pytest.raises(error, match=words):
        flash_mla(*mla_inputs(), **options)


def test_bad_cu_seqlens():
    tensors = mla_inputs()
    with pytest.raises(ValueError, match=r"cu_seqlens\[2\] = 20 is outside"):
        flash_mla(*tensors, jnp.array([0, 30, 20], jnp.int32))
    with pytest.raises(ValueError, match="lengths differ"):
        flash_mla(tensors[0][:, :1], *tensors[1:4], tensors[4][:, :1], tensors[5], jnp.array([0, 1], jnp.int32))


def test_sharded_over_batch_and_heads():
    """Batch over "data" and heads over "model" (w_kc / w_vc on their head axis alike), forward and gradients."""
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((2, 2), ("data", "model"), devices=jax.devices()[:4])
    q, kv, wk, wv, bq, bk = mla_inputs()
    specs = (P("data", None, "model"), P("data"), P(None, "model"), P(None, "model"), P("data"), P("data"))
    sharded = lambda *a, **kw: flash_mla(
        *a, causal=True, mesh=mesh, in_specs=specs, out_specs=P("data", None, "model"), **kw
    )
    reference = lambda *a, **kw: flash_mla_reference(*a, causal=True, **kw)
    check_forward_and_grads(jax.jit(sharded), jax.jit(reference), [q, kv, wk, wv, bq, bk], (0, 1, 2, 3, 4, 5), q.dtype)
    # Keyword arrays follow the query's split: sinks per head, a bias per batch row and head.
    options = dict(softmax_aux=randn((q.shape[2],)), bias=randn((q.shape[0], q.shape[2], q.shape[1], kv.shape[1])))
    assert_close(sharded(q, kv, wk, wv, bq, bk, **options), reference(q, kv, wk, wv, bq, bk, **options))
    # A shared list of sinks (not one per head) under split heads: folded to one logit, its gradient exact.
    shared = randn((q.shape[2] + 1,))
    check_forward_and_grads(
        jax.jit(lambda q, s: sharded(q, kv, wk, wv, bq, bk, softmax_aux=s)),
        jax.jit(lambda q, s: reference(q, kv, wk, wv, bq, bk, softmax_aux=s)),
        [q, shared],
        (0, 1),
        q.dtype,
    )
