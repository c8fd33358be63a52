"""GPU suite: every GPU implementation through the public API against the XLA path, at real shapes."""

import jax
import jax.numpy as jnp
import pytest

from ejkernel.modules import flash_attention
from ejkernel.types import MaskInfo
from harness import assert_close, randn

pytestmark = pytest.mark.gpu

FEATURES = {
    "plain": {},
    "causal": {"causal": True},
    "window": {"causal": True, "sliding_window": (256, 0)},
    "softcap+sinks+segments": {"causal": True, "logits_soft_cap": 30.0, "sinks": True, "segments": True},
    "bias": {"bias": True},
    "dropout": {"dropout_prob": 0.1, "dropout_seed": 3},
}


def _call(platform, features, q, k, v, bias=None):
    kw = {k_: v_ for k_, v_ in features.items() if k_ not in ("sinks", "segments", "bias")}
    sinks = jnp.linspace(-1.0, 1.0, q.shape[2]).astype(q.dtype) if features.get("sinks") else None
    if features.get("segments"):
        seg = jnp.repeat(jnp.arange(4, dtype=jnp.int32), q.shape[1] // 4)[None].repeat(q.shape[0], 0)
        kw["mask_info"] = MaskInfo.from_segments(seg.at[:, -100:].set(-1))
    return flash_attention(q, k, v, bias, None, None, sinks, platform=platform, **kw)


@pytest.mark.parametrize("feature", FEATURES)
@pytest.mark.parametrize("platform", ["auto", "triton", "pallas", "cuda"])
def test_matches_xla_forward_and_backward(platform, feature):
    features = FEATURES[feature]
    q, k, v = (
        randn((2, 1024, 8, 128), jnp.bfloat16),
        randn((2, 1024, 2, 128), jnp.bfloat16),
        randn((2, 1024, 2, 128), jnp.bfloat16),
    )
    args = [q, k, v] + ([randn((1, 8, 1024, 1024), jnp.bfloat16)] if features.get("bias") else [])
    if platform in ("cuda", "pallas") and feature not in ("plain", "causal", "window"):
        with pytest.raises(NotImplementedError):
            jax.jit(lambda *a: _call(platform, features, *a))(*args)
        return
    out, vjp = jax.vjp(jax.jit(lambda *a: _call(platform, features, *a)), *args)
    ref_out, ref_vjp = jax.vjp(jax.jit(lambda *a: _call("xla", features, *a)), *args)
    assert_close(out, ref_out, jnp.bfloat16)
    g = randn(out.shape, jnp.bfloat16)
    for name, a, b in zip(["dq", "dk", "dv", "dbias"], vjp(g), ref_vjp(g), strict=False):
        assert_close(a, b, jnp.bfloat16, tol=4e-2, name=name)


# Mosaic GPU cases beyond the shared ones: lengths off the tile grid, Sq != Sk, windows open on the
# right, MQA, head dim 64, sinks (joined as the forward writes each row, also rows with no allowed
# key), soft cap (bounded forward, exp2 partly on the FMA units, row sums on the tensor cores at head
# dim 64, fused backward).
MOSAIC_CASES = {
    "gqa-odd-lengths-sinks": ((2, 1000, 8, 128), (2, 1000, 2, 128), {"causal": True}, True),
    "window-both-sides": ((1, 777, 4, 128), (1, 777, 4, 128), {"sliding_window": (100, 37)}, False),
    "soft-cap-gqa-sinks": ((2, 512, 8, 128), (2, 512, 2, 128), {"causal": True, "logits_soft_cap": 5.0}, True),
    "soft-cap-d64-window": (
        (1, 1500, 8, 64),
        (1, 1500, 2, 64),
        {"sliding_window": (400, 100), "logits_soft_cap": 30.0},
        False,
    ),
    "sq-ne-sk-causal": ((2, 300, 4, 64), (2, 650, 1, 64), {"causal": True}, True),
    "mqa-d64-window": ((1, 2048, 8, 64), (1, 2048, 1, 64), {"causal": True, "sliding_window": (300, 300)}, False),
    # the overlapped forward (head dim 128): free-running with odd lengths, taking turns with empty rows
    "sq-ne-sk-sinks": ((2, 333, 4, 128), (2, 900, 2, 128), {}, True),
    "window-empty-rows-sinks": ((1, 700, 2, 128), (1, 200, 2, 128), {"sliding_window": (30, 0)}, True),
    "soft-cap-d64-empty-rows-sinks": (
        (1, 500, 2, 64),
        (1, 150, 2, 64),
        {"sliding_window": (20, 0), "logits_soft_cap": 30.0},
        True,
    ),
    # head dim 64 without a mask streams 256-key tiles by default
    "d64-wide-tiles-sinks": ((2, 333, 4, 64), (2, 1000, 2, 64), {}, True),
    "soft-cap-d64-wide-tiles": ((1, 500, 4, 64), (1, 700, 4, 64), {"logits_soft_cap": 30.0}, False),
    # a cap too large for the bounded forward: the running max, its row sums as P·e₀ rescaled like the output
    "soft-cap-d64-unbounded": ((2, 600, 4, 64), (2, 900, 2, 64), {"causal": True, "logits_soft_cap": 80.0}, True),
    # short causal calls at head dim 64: two query tiles per CTA, one key/value stream through both
    "d64-causal-paired-sinks": ((2, 1024, 4, 64), (2, 1024, 2, 64), {"causal": True}, True),
    "soft-cap-d64-causal-paired-sq-ne-sk": (
        (1, 768, 4, 64),
        (1, 1000, 2, 64),
        {"causal": True, "logits_soft_cap": 30.0},
        True,
    ),
    "soft-cap-d64-unbounded-paired": (
        (2, 512, 4, 64),
        (2, 512, 2, 64),
        {"causal": True, "logits_soft_cap": 80.0},
        False,
    ),
}


@pytest.mark.parametrize("case", MOSAIC_CASES)
def test_mosaic_gpu_matches_reference(case):
    from ejkernel.reference.flash_attention import flash_attention_reference

    q_shape, kv_shape, kw, sinks = MOSAIC_CASES[case]
    q, k, v = randn(q_shape, jnp.bfloat16), randn(kv_shape, jnp.bfloat16), randn(kv_shape, jnp.bfloat16)
    aux = randn((q_shape[2],)) if sinks else None

    def ours(q, k, v, aux):
        return flash_attention(q, k, v, None, None, None, aux, platform="pallas", **kw)

    def ref(q, k, v, aux):
        return flash_attention_reference(q, k, v, softmax_aux=aux, softmax_scale=q_shape[-1] ** -0.5, **kw)

    argnums = (0, 1, 2, 3) if sinks else (0, 1, 2)
    out, vjp = jax.vjp(jax.jit(ours), q, k, v, aux)
    f32 = [None if a is None else a.astype(jnp.float32) for a in (q, k, v, aux)]
    ref_out, ref_vjp = jax.vjp(ref, *f32)
    assert_close(out, ref_out, jnp.bfloat16)
    g = randn(out.shape, jnp.bfloat16)
    grads, ref_grads = vjp(g), ref_vjp(g.astype(jnp.float32))
    for i in argnums:
        assert_close(grads[i], ref_grads[i], jnp.bfloat16, tol=4e-2, name=["dq", "dk", "dv", "dsinks"][i])


def test_xla_path_memory_is_linear_at_32k():
    """B=1, S=32768, H=16, D=128 bf16 forward+backward compiles to under 2 GiB of peak memory."""
    shape = jax.ShapeDtypeStruct((1, 32768, 16, 128), jnp.bfloat16)
    loss = lambda q, k, v: jnp.sum(flash_attention(q, k, v, causal=True, platform="xla").astype(jnp.float32))
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(shape, shape, shape).compile()
    stats = compiled.memory_analysis()
    peak = stats.temp_size_in_bytes + stats.argument_size_in_bytes + stats.output_size_in_bytes
    gib = {name: getattr(stats, f"{name}_size_in_bytes") / 2**30 for name in ("temp", "argument", "output")}
    print(f"xla fwd+bwd S=32768 memory (GiB): {gib}, peak {peak / 2**30:.3f}")
    assert peak < 2 * 2**30
