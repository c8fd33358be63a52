"""Linear attention in plain JAX against the step-by-step reference: outputs, final states, every gradient.

Each case compares one jitted call of an implementation with the reference, forward and VJP (random
cotangents) of every float input; outputs and final states are checked together (concatenated), so a
wrong state fails as surely as a wrong output. Compilation dominates: one case per feature.
"""

import functools
import json

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P
from linear_cases import DK, DV, SEGMENTS, B, H, S, check, joined, log_decay, qkv, write_strength

from ejkernel import kernel_registry
from ejkernel.kernels._common.linear_attention.driver import chunked_linear_attention
from ejkernel.kernels._common.linear_attention.numerics import decay_matrix, unit_lower_inverse
from ejkernel.modules import (
    GatedDeltaRuleConfig,
    GLAttention,
    GLAttentionConfig,
    GLAttentionTritonTiling,
    KernelDeltaAttentionConfig,
    LightningAttentionConfig,
    RecurrentAttentionConfig,
    gated_delta_rule,
    gla_attention,
    kernel_delta_attention,
    lightning_attention,
    recurrent_attention,
)
from ejkernel.ops import Invocation
from ejkernel.ops.cache import PersistentCache
from ejkernel.ops.kernel import FORWARD, TRAIN
from ejkernel.reference.linear_attention import (
    delta_rule_reference,
    gla_reference,
    lightning_reference,
    linear_recurrence_reference,
)
from harness import assert_close, check_forward_and_grads, randn


def test_chunked_core_packed_reversed_with_both_gates():
    """The core that state_space_v2 builds on: packed sequences (one empty), reverse, per-head + per-key gates,
    grouped key/value heads, sub-chunked chunks (the last partial)."""
    cu = jnp.array([0, 5, 5, 40, 70], jnp.int32)
    q, k, v = qkv(batch=1)
    args = [q, k, v, log_decay(1, S, H), log_decay(1, S, H, DK), randn((4, H, DK, DV))]
    options = dict(scale=0.3, reverse=True, cu_seqlens=cu)

    def fn(q, k, v, g, gk, h0):
        return chunked_linear_attention(q, k, v, g=g, gk=gk, initial_state=h0, chunk_size=32, **options)

    def ref(q, k, v, g, gk, h0):
        return linear_recurrence_reference(q, k, v, g, None, gk, None, h0, cu, softmax_scale=0.3, reverse=True)

    check(fn, ref, args)


def test_recurrent_value_gates_bf16():
    """Per-value-channel gates take the recurrent form; bfloat16 inputs, per-row g_gamma."""
    q, k, v = qkv(dtype=jnp.bfloat16)
    args = [q, k, v, log_decay(B, S, H), log_decay(B, H), log_decay(B, S, H, DV, strength=0.3)]
    fn = lambda q, k, v, g, gamma, gv: recurrent_attention(q, k, v, g, gamma, None, gv, return_state=True)
    ref = lambda q, k, v, g, gamma, gv: linear_recurrence_reference(q, k, v, g, gamma, None, gv)
    check(fn, ref, args, jnp.bfloat16)


def test_lightning_layer_decay():
    q, k, v = qkv(seq=63, kv_heads=H)
    opts = dict(layer_idx=1, num_layers=4, softmax_scale=0.5)
    fn = lambda q, k, v: lightning_attention(
        q, k, v, return_state=True, cfg=LightningAttentionConfig(chunk_size=16), **opts
    )
    check(fn, lambda q, k, v: lightning_reference(q, k, v, **opts), [q, k, v])


def test_kernel_delta_attention_chunked():
    q, k, v = qkv(kv_heads=H)
    args = [q, k, v, write_strength(B, S, H), log_decay(B, S, H), randn((B, H, DK, DV))]
    fn = lambda *a: kernel_delta_attention(*a, chunk_size=16, return_state=True)
    check(fn, delta_rule_reference, args)


@pytest.mark.parametrize("use_chunked", [True, False])
def test_gated_delta_rule_segments(use_chunked):
    """Restarts where the id changes, padding tokens invisible; chunked and recurrent forms; no q/k norm."""
    seg = jnp.asarray(SEGMENTS, jnp.int32)
    q, k, v = qkv(kv_heads=H)
    args = [q, k, v, write_strength(B, S, H), log_decay(B, S, H), randn((B, H, DK, DV))]
    cfg = GatedDeltaRuleConfig(chunk_size=16)
    opts = dict(use_chunked=use_chunked, use_qk_l2norm=use_chunked)  # (l2 norm on and off, one case each)
    fn = lambda q, k, v, b, d, h0: gated_delta_rule(q, k, v, b, d, seg, h0, return_state=True, cfg=cfg, **opts)
    ref = lambda q, k, v, b, d, h0: delta_rule_reference(q, k, v, b, d, h0, seg, use_qk_l2norm=use_chunked)
    check(fn, ref, args)


def test_long_sequence_strong_gates_stay_finite_and_exact():
    """S = 4093 with gates whose running sum reaches about -4000: exp of it (or its negation) overflows."""
    seq = 4093
    q, k, v = (randn((1, seq, 1, 4)) for _ in range(3))
    gk = log_decay(1, seq, 1, 4, strength=1.5)
    assert float(jnp.min(jnp.sum(gk, axis=1))) < -1000
    fn = lambda q, k, v, gk: gla_attention(q, k, v, gk, return_state=True)
    check(fn, gla_reference, [q, k, v, gk])
    beta, decay = write_strength(1, seq, 1), log_decay(1, seq, 1, strength=1.5)
    fn = lambda q, k, v, b, d: gated_delta_rule(q, k, v, b, d, return_state=True)
    check(fn, delta_rule_reference, [q, k, v, beta, decay])


@pytest.mark.parametrize("chunk", [16, 64, 48])
def test_unit_lower_inverse_matches_the_triangular_solve(chunk):
    """`(I + L)⁻¹` by block doubling (48: padded to 64), forward and gradient, against the triangular solve.

    L as the delta rule makes it from unnormalised keys of dim 128 (entries up to about 10); the decays
    are strong enough that the inverse stays within float32 (weak ones make it overflow for any method).
    """
    k = randn((2, chunk, 128))
    b = jnp.cumsum(log_decay(2, chunk, strength=2.0), axis=-1)
    lower = write_strength(2, chunk)[..., None] * (k @ jnp.swapaxes(k, -1, -2)) * decay_matrix(b, strict=True)
    eye = jnp.eye(chunk)

    def solve(lower):
        system = jnp.tril(lower, -1) + eye
        return lax.linalg.triangular_solve(system, jnp.broadcast_to(eye, lower.shape), left_side=True, lower=True)

    check_forward_and_grads(jax.jit(unit_lower_inverse), jax.jit(solve), [lower], (0,), jnp.float32)


def test_decode_steps_chain_to_the_chunked_result():
    """Token-by-token calls threading the state equal one chunked call (GLA and the delta rule)."""
    seq = 12
    q, k, v = qkv(seq=seq, kv_heads=H)
    g, h0 = log_decay(B, seq, H, DK), randn((B, H, DK, DV))
    beta, decay = write_strength(B, seq, H), log_decay(B, seq, H)
    gla_step = jax.jit(lambda q, k, v, g, h: gla_attention(q, k, v, g, None, h, return_state=True))
    gdr_step = jax.jit(lambda q, k, v, b, d, h: gated_delta_rule(q, k, v, b, d, None, h, return_state=True))
    for step, gates in ((gla_step, (g,)), (gdr_step, (beta, decay))):
        full_out, full_state = step(q, k, v, *gates, h0)
        state, outs = h0, []
        for t in range(seq):
            out, state = step(*(x[:, t : t + 1] for x in (q, k, v, *gates)), state)
            outs.append(out)
        assert_close(jnp.concatenate(outs, axis=1), full_out)
        assert_close(state, full_state)


def test_packed_decode_continues_each_sequence():
    """One token for each of three packed sequences continues each from its own state."""
    q, k, v = qkv(batch=1, seq=3)
    g, h0 = log_decay(1, 3, H, DK), randn((3, H, DK, DV))
    cu = jnp.array([0, 1, 2, 3], jnp.int32)
    out = jax.jit(joined(lambda q, k, v, g, h0: gla_attention(q, k, v, g, None, h0, cu, return_state=True)))
    ref = jax.jit(joined(lambda q, k, v, g, h0: gla_reference(q, k, v, g, None, h0, cu)))
    assert_close(out(q, k, v, g, h0), ref(q, k, v, g, h0))


@pytest.mark.lowest
def test_padding_only_and_empty_inputs_are_zeros_with_finite_gradients():
    q, k, v = qkv(seq=9, kv_heads=H)
    beta, seg = write_strength(B, 9, H), -jnp.ones((B, 9), jnp.int32)
    out, grads = jax.jit(
        lambda q, k, v: jax.value_and_grad(
            lambda q, k, v: jnp.sum(gated_delta_rule(q, k, v, beta, None, seg) ** 2), argnums=(0, 1, 2)
        )(q, k, v)
    )(q, k, v)
    assert float(out) == 0.0 and all(bool(jnp.all(g == 0)) for g in grads)
    h0 = randn((B, H, DK, DV))
    out, state = jax.jit(lambda q, k, v: gla_attention(q, k, v, None, None, h0, return_state=True))(
        q[:, :0], k[:, :0], v[:, :0]
    )
    assert out.shape == (B, 0, H, DV)
    assert_close(state, h0)


def test_vmap_and_checkpoint():
    q, k, v = qkv(batch=3, seq=20, kv_heads=H)
    g = log_decay(3, 20, H, DK)
    fn = lambda q, k, v, g: gla_attention(q[None], k[None], v[None], g[None])[0]
    expected = jax.jit(gla_reference)(q, k, v, g)[0]
    assert_close(jax.jit(jax.vmap(fn))(q, k, v, g), expected)
    grad = jax.jit(jax.grad(lambda q: jnp.sum(jax.checkpoint(gla_attention)(q, k, v, g) ** 2)))(q)
    ref_grad = jax.jit(jax.grad(lambda q: jnp.sum(gla_reference(q, k, v, g)[0] ** 2)))(q)
    assert_close(grad, ref_grad, tol=1e-4)


@pytest.mark.lowest
def test_gated_delta_rule_sharded_over_batch_and_heads():
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    q, k, v = qkv(batch=4, seq=20, heads=8, kv_heads=8)
    beta, decay = write_strength(4, 20, 8), log_decay(4, 20, 8)
    token, head = P("data", None, "model"), P("data", "model")
    specs = dict(mesh=mesh, in_specs=(token,) * 5, out_specs=(token, head), return_state=True)
    out, state = gated_delta_rule(q, k, v, beta, decay, **specs)
    ref_out, ref_state = jax.jit(delta_rule_reference)(q, k, v, beta, decay)
    assert_close(out, ref_out)
    assert_close(state, ref_state)
    with pytest.raises(ValueError, match="axis 1"):
        gated_delta_rule(q, k, v, beta, mesh=mesh, in_specs=(P(None, "data"),) * 4, out_specs=P(None, "data"))


@pytest.mark.lowest
def test_registry_names_and_direct_calls():
    q, k, v = qkv(batch=1, seq=5, kv_heads=H)
    beta = write_strength(1, 5, H)
    assert kernel_registry.get("kda") is kernel_registry.get("kernel_delta_attention")
    for name, extra, options in (
        ("gla", (), {}),
        ("lightning_attn", (), dict(layer_idx=0, num_layers=2)),
        ("recurrent", (), {}),
        ("kernel_delta_attention", (beta,), {}),
        ("gated_delta_rule", (beta,), {}),
    ):
        out = jax.jit(functools.partial(kernel_registry.get(name, platform="xla"), **options))(q, k, v, *extra)
        assert out.shape == (1, 5, H, DV) and bool(jnp.all(jnp.isfinite(out)))


def test_configs_validate_chunk_size():
    for config in (GLAttentionConfig, LightningAttentionConfig, RecurrentAttentionConfig, KernelDeltaAttentionConfig):
        with pytest.raises(ValueError, match="chunk_size"):
            config(chunk_size=48)


def test_gla_triton_tiling_round_trips_through_the_persistent_cache(tmp_path):
    tiling = GLAttentionTritonTiling(block_k=32, grads_warps=8, num_stages=3, fuse_head_scores=False)
    cfg = GLAttentionConfig(platform="triton", chunk_size=32, triton_tiling=tiling)
    assert json.loads(cfg.to_json())["triton_tiling"] == {
        "block_k": 32,
        "fuse_head_scores": False,
        "grads_warps": 8,
        "num_stages": 3,
    }
    PersistentCache(tmp_path).put("gla|key", cfg)
    back = PersistentCache(tmp_path).get("gla|key")
    assert back == cfg and hash(back) == hash(cfg) and isinstance(back.triton_tiling, GLAttentionTritonTiling)
    # a config without a tiling writes what it always wrote (the shipped tables and old caches read as before)
    assert "triton_tiling" not in GLAttentionConfig(platform="triton").to_json()
    assert GLAttentionConfig.from_json('{"type": "GLAttentionConfig", "platform": "xla"}').triton_tiling is None


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        (dict(block_k=8), "GLAttentionTritonTiling.block_k must be a power of two of at least 16, got 8"),
        (dict(state_v=48), "GLAttentionTritonTiling.state_v must be a power of two of at least 16, got 48"),
        (dict(grads_warps=3), "GLAttentionTritonTiling.grads_warps must be a positive power of two, got 3"),
        (dict(head_span=True), "GLAttentionTritonTiling.head_span must be a positive power of two, got True"),
        (dict(num_stages=0), "GLAttentionTritonTiling.num_stages must be a positive int, got 0"),
        (dict(fuse_head_scores=1), "GLAttentionTritonTiling.fuse_head_scores must be a bool, got 1"),
    ],
)
def test_gla_triton_tiling_rejects_bad_fields(fields, words):
    with pytest.raises(ValueError) as err:
        GLAttentionTritonTiling(**fields)
    assert str(err.value) == words
    with pytest.raises(ValueError, match=r"GLAttentionTritonTiling\.block_k"):  # read back from JSON, likewise
        GLAttentionConfig.from_json('{"type": "GLAttentionConfig", "triton_tiling": {"block_k": 12}}')
    with pytest.raises(ValueError, match=r"GLAttentionConfig\.triton_tiling must be a GLAttentionTritonTiling"):
        GLAttentionConfig(triton_tiling={"block_k": 32})


def test_gla_autotunes_a_few_triton_tilings():
    """Tilings only on the Triton platform; the gradient kernel's only for a differentiated call."""
    args = (jnp.ones((1, 64, 2, 16)),) * 3 + (None,) * 4
    cfgs = lambda platform, mode: list(GLAttention().candidate_cfgs(Invocation("gla", args, {}, platform, mode)))
    assert all(c.triton_tiling is None for c in cfgs("xla", TRAIN))
    forward, train = cfgs("triton", FORWARD), cfgs("triton", TRAIN)
    tiled = lambda cs: [c.triton_tiling for c in cs if c.triton_tiling is not None]
    assert len(forward) == 7 and len(train) == 9 and len(set(train)) == 9
    assert all(t.block_k is None and t.grads_warps is None for t in tiled(forward))
    assert set(tiled(forward)) < set(tiled(train))


_q, _k, _v = (jnp.ones((1, 6, 2, 4)),) * 3
_beta = jnp.full((1, 6, 2), 0.5)
_xla = functools.partial(kernel_registry.get, platform="xla")


@pytest.mark.lowest
@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda: gla_attention(_q, _k, _v.astype(jnp.bfloat16)), TypeError, "share one dtype"),
        (lambda: gla_attention(_q, _k, _v.astype(jnp.int32)), TypeError, "value"),
        (lambda: gla_attention(_q[0], _k, _v), TypeError, "query"),
        (lambda: gla_attention(_q, _k[:, :, :1].repeat(3, 2), _v[:, :, :1].repeat(3, 2)), ValueError, "multiple"),
        (lambda: gla_attention(_q, _k, _v, jnp.ones((1, 6, 2, 3))), TypeError, "attention: g must be"),
        (lambda: gla_attention(_q, _k, _v, None, jnp.ones((3,))), TypeError, "g_gamma"),
        (lambda: gla_attention(_q, _k, _v, None, None, jnp.ones((2, 2, 4, 4))), ValueError, "initial_state"),
        (lambda: gla_attention(_q, _k, _v, None, None, None, jnp.array([0, 2, 7])), ValueError, "cu_seqlens"),
        (lambda: gla_attention(_q, _k, _v, None, None, None, jnp.array([0.0, 6.0])), TypeError, "cu_seqlens"),
        (lambda: recurrent_attention(_q, _k, _v, jnp.ones((1, 6, 3))), TypeError, "attention: g must be"),
        (lambda: lightning_attention(_q, _k, _v, layer_idx=-1, num_layers=2), ValueError, "layer_idx"),
        (lambda: lightning_attention(_q, _k, _v, layer_idx=0, num_layers=0), ValueError, "num_layers"),
        (lambda: kernel_delta_attention(_q, _k, _v, _beta, chunk_size=24), ValueError, "chunk_size"),
        (lambda: kernel_delta_attention(_q, _k, _v, _beta[..., :1]), TypeError, "beta"),
        (lambda: gated_delta_rule(_q, _k, _v, _beta, None, jnp.zeros((1, 6))), TypeError, "seg_ids"),
        (lambda: gated_delta_rule(_q, _k, _v, _beta, autotune_chunk_candidates=(16, 20)), ValueError, "autotune"),
        (lambda: gated_delta_rule(_q, _k, _v, _beta, platform="tpu"), ValueError, "platform"),
        # the registered implementations, called directly, check as the public functions do
        (lambda: _xla("gla")(_q, _k, _v, None, None, None, jnp.array([0, 2, 9])), ValueError, "cu_seqlens"),
        (lambda: _xla("recurrent")(_q, _k, _v.astype(jnp.int32)), TypeError, "value"),
        (lambda: _xla("lightning_attn")(_q, _k, _v, layer_idx=2, num_layers=2), ValueError, "layer_idx"),
        (lambda: _xla("kda")(_q, _k, _v, _beta[..., :1]), ValueError, "beta"),
        (
            lambda: _xla("gated_delta_rule")(_q, _k, _v, _beta, None, jnp.zeros((1, 5), jnp.int32)),
            ValueError,
            "seg_ids",
        ),
    ],
)
def test_bad_input_names_the_argument(call, error, words):
    with pytest.raises(error, match=words):
        call()
