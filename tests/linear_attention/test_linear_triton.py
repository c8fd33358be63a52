"""Linear attention on the Triton platform: interpret mode on CPU against the reference, CUDA lowering, GPU suite.

Interpret-mode cases stay small (head dims 16 or 32, the smallest the Triton matmuls take; a few chunks):
the state passes loop over chunks inside one program per (row, head, state tile), and the chunk kernels'
grids (chunks x rows x heads) stay under a few dozen programs.
"""

import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
import pytest
from linear_cases import SEGMENTS, check, joined, log_decay, write_strength

from ejkernel.kernels._common.linear_attention import entries
from ejkernel.kernels._common.linear_attention.driver import linear_attention
from ejkernel.kernels._triton.linear_attention import _delta, _interface
from ejkernel.kernels._triton.linear_attention._gla import TritonGlaTiling
from ejkernel.kernels._triton.linear_attention._interface import (
    TritonEngine,
    gated_delta_rule_triton,
    gla_attention_triton,
    kernel_delta_attention_triton,
    lightning_attention_triton,
    recurrent_attention_triton,
)
from ejkernel.kernels._triton.linear_attention._state_passes import TritonStatePassTiling
from ejkernel.modules import (
    GatedDeltaRuleConfig,
    GLAttentionConfig,
    GLAttentionTritonTiling,
    gated_delta_rule,
    gla_attention,
    lightning_attention,
)
from ejkernel.ops import FwdParams
from ejkernel.reference.linear_attention import delta_rule_reference, gla_reference, linear_recurrence_reference
from harness import assert_close, check_forward_and_grads, randn

D = 16
SMALL = FwdParams(block_d=16)  # two column blocks per state


def inputs(batch=2, seq=40, heads=2, kv_heads=2):
    q, k, v = (randn((batch, seq, h, D)) for h in (heads, kv_heads, kv_heads))
    return q, k, v


def test_gla_packed_reversed_grouped():
    """Packed sequences (one empty), reversed, grouped heads; the sequential passes take two of the five chunks a
    loop step (`state_unroll`), the last after."""
    cu = jnp.array([0, 7, 7, 40], jnp.int32)
    q, k, v = inputs(batch=1, heads=4)
    args = [q, k, v, log_decay(1, 40, 4, D), log_decay(4, strength=0.1), randn((3, 4, D, D))]
    tiling = GLAttentionTritonTiling(state_unroll=2)
    cfg = GLAttentionConfig(chunk_size=32, fwd_params=SMALL, triton_tiling=tiling)  # two sub-chunks per chunk
    fn = lambda q, k, v, g, gamma, h0: gla_attention_triton(
        q, k, v, g, gamma, h0, cu, reverse=True, return_state=True, cfg=cfg, interpret=True
    )
    ref = lambda q, k, v, g, gamma, h0: gla_reference(q, k, v, g, gamma, h0, cu, reverse=True)
    check(fn, ref, args)


def test_gla_gates_of_any_span():
    """Row blocks whose gates span little take their own keys by matmuls, those whose gates fall fast (here
    the second half: ~5 per token) the exact loop: both against the reference, in one call."""
    q, k, v = inputs(seq=64)
    strength = jnp.where(jnp.arange(64) < 32, 0.5, 7.0)[None, :, None, None]
    args = [q, k, v, strength * log_decay(2, 64, 2, D), randn((2, 2, D, D))]
    cfg = GLAttentionConfig(chunk_size=32, fwd_params=SMALL)
    fn = lambda q, k, v, g, h0: gla_attention_triton(q, k, v, g, None, h0, return_state=True, cfg=cfg, interpret=True)
    check(fn, lambda q, k, v, g, h0: gla_reference(q, k, v, g, None, h0), args)


def test_gla_tiles_and_row_blocks():
    """Chunks of four row blocks (earlier and later blocks around each), several state, value and key
    tiles per head (dv, and a per-head gate's gradient, summed over key tiles); per-channel gates with a
    per-head one added, then a gate per head alone (its own `[B, T, H, 1]` path) with k and v shared by
    the two query heads."""
    d = 32
    q, k, v = (randn((2, 100, 2, d)) for _ in range(3))
    h0 = randn((2, 2, d, d))
    tiling = TritonGlaTiling(state_k=16, state_v=16, block_v=16, block_k=16, head_block_k=16)
    engine = lambda cfg: TritonEngine(TritonStatePassTiling(32, 4, 2, interpret=True), tiling)
    cfg = GLAttentionConfig(chunk_size=64)
    fn = lambda q, k, v, g, gamma, h0: entries.gla_attention(
        q, k, v, g, gamma, h0, return_state=True, cfg=cfg, engine=engine
    )
    args = [q, k, v, log_decay(2, 100, 2, d), log_decay(2, strength=0.1), h0]
    check(fn, lambda q, k, v, g, gamma, h0: gla_reference(q, k, v, g, gamma, h0), args)
    fn = lambda q, k, v, g, h0: entries.recurrent_attention(
        q, k, v, g, None, None, None, h0, return_state=True, cfg=cfg, engine=engine
    )
    reference = lambda q, k, v, g, h0: linear_recurrence_reference(q, k, v, g, None, None, None, h0)
    check(fn, reference, [q, k[:, :, :1], v[:, :, :1], log_decay(2, 100, 2, strength=0.5), h0])


def test_gla_config_tiling_reaches_the_kernels(monkeypatch):
    """`GLAttentionConfig.triton_tiling` set from a config: several state, value and key tiles per head at
    dim 32, the gradient kernel with 8 warps; the kernels get exactly that tiling (the fields left None at
    their defaults) and match the reference, forward and every gradient. A chunk of 64 asked runs as 32
    (`key_gated_chunk_cap`)."""
    seen, chunks = [], set()
    original = _interface.gla_chunked

    def spy(tiling, scale, packed, q, *args):
        seen.append(tiling)
        chunks.add(q.shape[1] // args[4].shape[0])  # tokens / the layout's chunks
        return original(tiling, scale, packed, q, *args)

    monkeypatch.setattr(_interface, "gla_chunked", spy)
    d = 32
    q, k, v = (randn((2, 40, 2, d)) for _ in range(3))
    tiling = GLAttentionTritonTiling(state_k=16, state_v=16, block_v=16, block_k=16, grads_warps=8, num_stages=1)
    cfg = GLAttentionConfig(chunk_size=64, triton_tiling=tiling)
    fn = lambda q, k, v, g, h0: gla_attention_triton(q, k, v, g, None, h0, return_state=True, cfg=cfg, interpret=True)
    check(
        fn,
        lambda q, k, v, g, h0: gla_reference(q, k, v, g, None, h0),
        [q, k, v, log_decay(2, 40, 2, d), randn((2, 2, d, d))],
    )
    expected = TritonGlaTiling(**tiling.overrides(), interpret=True)
    assert seen and all(dataclasses.replace(t, precise=True) == expected for t in seen)
    assert chunks == {32}


def test_gla_triton_tiling_names_the_kernels_fields():
    """Every field of the config's tiling is one of the kernels' (so `triton_engine` can hand them on), and
    only the two the engine decides itself (interpret mode, full-precision matmuls) are left out."""
    config_fields = {f.name for f in dataclasses.fields(GLAttentionTritonTiling)}
    kernel_fields = {f.name for f in dataclasses.fields(TritonGlaTiling)}
    assert kernel_fields - config_fields == {"interpret", "precise"} and config_fields <= kernel_fields
    assert _interface.triton_engine(GLAttentionConfig(), interpret=True).gla == TritonGlaTiling()


def test_gla_value_heads_share_query_and_key():
    """Mamba-2's head layout in the GLA kernels: q and k one per group of two value heads, a gate per head;
    packed sequences (one empty), reversed; against the reference with q and k copied to every head. The
    gradient kernel's spans of one head (`head_span=1`: dq and dk summed over the group's two spans in
    XLA) and two tiles of key channels (the state tests take spans of two heads, summed in the kernel);
    the plain forward with the scores made in the output kernel (`fuse_head_scores`)."""
    cu = jnp.array([0, 30, 30, 70], jnp.int32)
    q, k = (randn((1, 70, 2, 2 * D)) for _ in range(2))
    args = [q, k, randn((1, 70, 4, D)), log_decay(1, 70, 4), randn((3, 4, 2 * D, D))]
    tiling = TritonGlaTiling(state_k=16, head_block_k=16, head_span=1)
    engine = TritonEngine(TritonStatePassTiling(32, 4, 2, interpret=True), tiling)
    fn = lambda q, k, v, g, h0: linear_attention(
        q, k, v, scale=0.5, g=g, initial_state=h0, cu_seqlens=cu, reverse=True, chunk_size=32, engine=engine
    )
    per_head = jnp.arange(4) // 2
    ref = lambda q, k, v, g, h0: linear_recurrence_reference(
        q[:, :, per_head], k[:, :, per_head], v, g, None, None, None, h0, cu, softmax_scale=0.5, reverse=True
    )
    check(fn, ref, args)
    assert_close(jax.jit(joined(fn))(*args), joined(ref)(*args), jnp.float32)  # not differentiated: fused


def test_gated_delta_rule_segments():
    seq = SEGMENTS.shape[1]
    q, k, v = inputs(seq=seq)
    seg = jnp.asarray(SEGMENTS, jnp.int32)
    args = [q, k, v, write_strength(2, seq, 2), log_decay(2, seq, 2), randn((2, 2, D, D))]
    cfg = GatedDeltaRuleConfig(chunk_size=32, fwd_params=SMALL)
    fn = lambda q, k, v, b, d, h0: gated_delta_rule_triton(
        q, k, v, b, d, seg, h0, return_state=True, cfg=cfg, interpret=True
    )
    ref = lambda q, k, v, b, d, h0: delta_rule_reference(q, k, v, b, d, h0, seg)
    check(fn, ref, args)


def test_delta_rule_on_the_gated_kernels(monkeypatch):
    """One sequence per row, no segments: the delta rule on GLA's kernels of a gate per head (`_delta`),
    a length that is not a chunk multiple (two chunks of 32 and a padded one), with and without decay;
    undifferentiated too (the WY transform's kernel, `_wy_triton`; the outputs by their kernel or in the pass)."""
    q, k, v = inputs(seq=70)
    args = [q, k, v, write_strength(2, 70, 2), log_decay(2, 70, 2), randn((2, 2, D, D))]
    cfg = GatedDeltaRuleConfig(chunk_size=32, fwd_params=SMALL)
    fn = lambda q, k, v, b, d, h0, **options: gated_delta_rule_triton(
        q, k, v, b, d, None, h0, return_state=True, cfg=cfg, interpret=True, **options
    )
    reference = lambda q, k, v, b, d, h0: delta_rule_reference(q, k, v, b, d, h0)
    check(fn, reference, args)
    # undifferentiated: the output kernel, or the outputs made in the state pass (q and k normalised as loaded)
    for one_pass, l2norm in itertools.product((False, True), repeat=2):
        monkeypatch.setattr(_delta, "one_pass_outputs", lambda *_, one_pass=one_pass: one_pass)
        call = lambda *a, l2norm=l2norm: fn(*a, use_qk_l2norm=l2norm)  # a fresh trace each
        expected = delta_rule_reference(*args, use_qk_l2norm=l2norm)
        for got, want in zip(jax.jit(call)(*args), expected, strict=True):
            assert_close(got, want, jnp.float32)
    fn = lambda q, k, v, b, h0: kernel_delta_attention_triton(
        q, k, v, b, None, h0, return_state=True, chunk_size=16, interpret=True
    )
    check(fn, lambda q, k, v, b, h0: delta_rule_reference(q, k, v, b, None, h0), args[:4] + args[5:])


def test_wy_kernels_match_xla_and_its_autodiff():
    """The WY transform's kernels (u, w, the inverse) against XLA's `wy_transform`, and its pullback kernel (dw =
    −dU hᵀ formed inside) against autodiff through it, on fresh float32 inputs, at chunk 32; undifferentiated, the
    transform at chunk 64 (two kernels) against XLA's."""
    batch, seq, heads = 1, 128, 2
    k, v = randn((batch, seq, heads, D)), randn((batch, seq, heads, D))
    k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
    beta, a = write_strength(batch, seq, heads), log_decay(batch, seq, heads)
    du = randn((batch, seq, heads, D))
    _check_wy_kernels(32, k, v, beta, a, du, randn((batch, seq // 32, heads, D, D)))
    t = TritonGlaTiling(interpret=True).fit(D, D)
    xla = _xla_wy(64, k, v, beta, a)
    for got, expected in zip(_delta._wy_triton(t, 64, k, v, beta, a), xla, strict=True):  # two kernels (`split_wy`)
        assert_close(got, expected, jnp.float32)


def _xla_wy(chunk, k, v, beta, a):
    """XLA's `wy_transform` `(u, w)` of chunks of `chunk` in the token layout."""
    from ejkernel.kernels._common.linear_attention.layout import ChunkLayout
    from ejkernel.kernels._common.linear_attention.numerics import wy_transform

    layout = ChunkLayout.dense(k.shape[0], k.shape[1], chunk)
    chunks = [layout.to_chunks(x) for x in (k, v, beta)]
    return tuple(layout.from_chunks(y) for y in wy_transform(*chunks, jnp.cumsum(layout.to_chunks(a), -1)))


def _check_wy_kernels(chunk, k, v, beta, a, du, e):
    batch, seq, heads, _ = k.shape
    t = TritonGlaTiling(interpret=True).fit(D, D)
    u, w, inverse = _delta._wy_triton(t, chunk, k, v, beta, a, with_inverse=True)
    (u0, w0), pullback = jax.vjp(functools.partial(_xla_wy, chunk), k, v, beta, a)
    assert_close(u, u0, jnp.float32)
    assert_close(w, w0, jnp.float32)
    for got, kept in zip(_delta._wy_triton(t, chunk, k, v, beta, a), (u, w), strict=True):  # undifferentiated
        assert bool(jnp.array_equal(got, kept))
    dw = -jnp.einsum("bnhkv,bnchv->bnchk", e, du.reshape(batch, seq // chunk, chunk, heads, D)).reshape(du.shape)
    grads = _delta._wy_pullback(t, chunk, k, v, beta, a, inverse, du, e)
    for got, expected in zip(grads, pullback((du, dw)), strict=True):
        assert_close(got, expected, jnp.float32)


def test_decode_step_kernel():
    """One token with a state (per-key and per-value gates; the delta rule): the fused step kernel."""
    q, k, v = inputs(seq=1)
    gk, gv, h0 = log_decay(2, 1, 2, D), log_decay(2, 1, 2, D), randn((2, 2, D, D))
    fn = lambda q, k, v, gk, gv, h0: recurrent_attention_triton(
        q, k, v, None, None, gk, gv, h0, return_state=True, interpret=True
    )
    check(
        fn,
        lambda q, k, v, gk, gv, h0: linear_recurrence_reference(q, k, v, None, None, gk, gv, h0),
        [q, k, v, gk, gv, h0],
    )
    beta, decay = write_strength(2, 1, 2), log_decay(2, 1, 2)
    fn = lambda q, k, v, b, d, h0: kernel_delta_attention_triton(q, k, v, b, d, h0, return_state=True, interpret=True)
    check(fn, delta_rule_reference, [q, k, v, beta, decay, h0])


def test_calls_it_does_not_serve_fall_back():
    q, k, v = inputs(seq=20)
    with pytest.raises(NotImplementedError, match="xla"):
        recurrent_attention_triton(q, k, v, None, None, None, log_decay(2, 20, 2, D), interpret=True)
    with pytest.raises(NotImplementedError, match="xla"):
        gated_delta_rule_triton(q, k, v, write_strength(2, 20, 2), use_chunked=False, interpret=True)
    with pytest.raises(NotImplementedError, match="dim_k"):
        lightning_attention_triton(q[..., :12], k[..., :12], v, layer_idx=0, num_layers=1, interpret=True)


@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")
def test_kernels_lower_for_cuda(cuda_lowering):
    """Forward + backward of GLA and the delta rule, and a decode step, lower to Triton IR for an H100."""
    shape = lambda *s, dtype=jnp.bfloat16: jax.ShapeDtypeStruct(s, dtype)
    x, gate, per_head = (
        shape(2, 128, 4, 128),
        shape(2, 128, 4, 128, dtype=jnp.float32),
        shape(2, 128, 4, dtype=jnp.float32),
    )
    gate1 = shape(1, 256, 4, 128, dtype=jnp.float32)

    def train(fn, *args):  # the output too: JAX 0.12 drops a forward kernel whose output nothing reads
        out, pullback = jax.vjp(fn, *args)
        return out, pullback(jnp.ones(out.shape, out.dtype))

    def lowered(fn, *args):
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()

    delta = ["ejkernel_delta_wy", "ejkernel_delta_states", "ejkernel_delta_state_grads", "ejkernel_gla_outputs"]
    delta += ["ejkernel_gla_grads", "ejkernel_delta_wy_grads"]
    passes = ["ejkernel_linear_attention_exit_states", "ejkernel_linear_attention_entry_grads"]
    for fn, args, kernels in (
        (
            functools.partial(gla_attention_triton, interpret=False),
            (x, x, x, gate),
            [f"ejkernel_gla_{n}" for n in ("cumulative", "states", "scores", "outputs", "state_grads", "grads")],
        ),
        (  # packed sequences (their own pass kernels), grouped heads, an initial state
            lambda q, k, v, g, h0: gla_attention_triton(
                q, k, v, g, None, h0, jnp.array([0, 50, 256], jnp.int32), return_state=True, interpret=False
            )[0],
            (
                shape(1, 256, 4, 128),
                shape(1, 256, 2, 128),
                shape(1, 256, 2, 128),
                gate1,
                shape(2, 4, 128, 128, dtype=jnp.float32),
            ),
            [f"ejkernel_gla_{name}" for name in ("states", "state_grads")],
        ),
        (  # a gate per head
            lambda q, k, v: lightning_attention_triton(q, k, v, layer_idx=1, num_layers=2, interpret=False),
            (x, x, x),
            [f"ejkernel_gla_{n}" for n in ("cumulative", "scores", "grads")],
        ),
        (
            lambda q, k, v, b, d: gated_delta_rule_triton(q, k, v, b, d, interpret=False),
            (x, x, x, per_head, per_head),
            delta,
        ),
        (  # segments: the XLA chunk parts around the state passes
            lambda q, k, v, b, d: gated_delta_rule_triton(
                q, k, v, b, d, jnp.zeros(x.shape[:2], jnp.int32), interpret=False
            ),
            (x, x, x, per_head, per_head),
            passes,
        ),
    ):
        text = lowered(functools.partial(train, fn), *args)
        assert all(name in text for name in kernels)
    engine = TritonEngine(
        TritonStatePassTiling(32, 4, 2, interpret=False)
    )  # a plain forward with a gate per head: fused
    text = lowered(lambda q, k, v, g: linear_attention(q, k, v, scale=1.0, g=g, engine=engine), x, x, x, per_head)
    assert "ejkernel_gla_head_outputs" in text and "ejkernel_gla_scores" not in text
    plain = lambda q, k, v, b, d: gated_delta_rule_triton(q, k, v, b, d, interpret=False)  # WY in its kernel
    text = lowered(plain, x, x, x, per_head, per_head)
    assert "ejkernel_delta_wy" in text and "ejkernel_gla_head_outputs" in text
    cfg = GatedDeltaRuleConfig(chunk_size=64)
    chunk64 = lambda *a: gated_delta_rule_triton(*a, cfg=cfg, interpret=False)
    text = lowered(chunk64, x, x, x, per_head, per_head)  # a plain forward keeps 64: the WY transform in two kernels
    assert "ejkernel_delta_wy_inverse" in text and "ejkernel_delta_wy_apply" in text
    text = lowered(functools.partial(train, chunk64), x, x, x, per_head, per_head)  # trained as chunks of 32
    assert "ejkernel_delta_wy" in text and "ejkernel_delta_wy_inverse" not in text
    assert "tensor<2x128x4x32xf32>" in text and "tensor<2x128x4x64xf32>" not in text  # the inverse kept: 32 columns
    many, many_per_head = shape(4, 64, 64, 128), shape(4, 64, 64, dtype=jnp.float32)  # 256 rows x heads: one pass
    text = lowered(plain, many, many, many, many_per_head, many_per_head)
    assert "ejkernel_delta_outputs" in text and "ejkernel_delta_states" not in text
    token, state = shape(2, 1, 4, 128), shape(2, 4, 128, 128, dtype=jnp.float32)
    decode = lambda q, k, v, h: lightning_attention_triton(q, k, v, h, layer_idx=1, num_layers=2, interpret=False)
    assert "ejkernel_linear_attention_step" in lowered(decode, token, token, token, state)


# ---- GPU suite: the Triton implementation against the XLA one (in float32) on the device, realistic shapes ----


def versus_xla(call, args):
    """`call(*args, platform=...) -> (out, state)` on Triton (bf16) vs XLA (float32): forward, state, every VJP."""
    on = lambda platform: jax.jit(joined(functools.partial(call, platform=platform)))
    check_forward_and_grads(on("triton"), on("xla"), args, tuple(range(len(args))), jnp.bfloat16)


def big(*shape):
    return randn(shape, jnp.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("packed", [False, True])
def test_gpu_gla_matches_xla(packed):
    batch, seq = (1, 8192) if packed else (2, 4096)
    cu = jnp.array([0, 1000, 1000, 5000, 8192], jnp.int32) if packed else None
    states = 4 if packed else batch
    args = [big(batch, seq, 8, 128), big(batch, seq, 4, 128), big(batch, seq, 4, 128)]
    args += [log_decay(batch, seq, 8, 128, strength=0.05), randn((states, 8, 128, 128))]
    call = lambda q, k, v, g, h0, platform: gla_attention(
        q, k, v, g, None, h0, cu, reverse=packed, return_state=True, platform=platform
    )
    versus_xla(call, args)


@pytest.mark.gpu
@pytest.mark.parametrize("segments", [False, True])  # the gated kernels (`_delta`), the XLA chunk parts
def test_gpu_gated_delta_rule_matches_xla(segments):
    seg = jnp.asarray(jnp.arange(4096) // 1500, jnp.int32)[None].repeat(2, 0) if segments else None
    args = [big(2, 4096, 8, 128) for _ in range(3)]
    args += [write_strength(2, 4096, 8), log_decay(2, 4096, 8, strength=0.05), randn((2, 8, 128, 128))]
    call = lambda q, k, v, b, d, h0, platform: gated_delta_rule(
        q, k, v, b, d, seg, h0, return_state=True, platform=platform
    )
    versus_xla(call, args)


@pytest.mark.gpu
def test_gpu_decode_steps_match_xla():
    q, k, v = (big(32, 1, 16, 128) for _ in range(3))
    h0 = randn((32, 16, 128, 128))
    call = lambda q, k, v, h0, platform: lightning_attention(
        q, k, v, h0, layer_idx=3, num_layers=8, return_state=True, platform=platform
    )
    versus_xla(call, [q, k, v, h0])
    call = lambda q, k, v, b, h0, platform: gated_delta_rule(
        q, k, v, b, None, None, h0, return_state=True, platform=platform
    )
    versus_xla(call, [q, k, v, write_strength(32, 1, 16), h0])
