"""Pallas-Triton flash attention against the float32 reference (interpret mode off GPU).

Small blocks (32) with lengths that are not block multiples, so every case runs several blocks,
partial blocks and the block-skipping paths; forward and every gradient (q, k, v, bias, sinks).
"""

import functools

import jax
import jax.numpy as jnp
import pytest

from attention_cases import SMALL, run_attention_case, segments
from ejkernel.kernels._common.attention import public_defaults
from ejkernel.kernels._common.attention_call import AttentionCall
from ejkernel.kernels._triton.flash_attention import _interface
from ejkernel.kernels._xla.flash_attention import flash_attention as flash_attention_xla  # keyword form
from ejkernel.ops.config import FwdParams
from ejkernel.reference.flash_attention import flash_attention_reference
from harness import assert_close, check_forward_and_grads, randn

# Off a GPU the kernels run only when interpretation is asked for (the lowering tests below ask for none).
flash_attention_triton = functools.partial(public_defaults(_interface.flash_attention_triton), interpret=True)
plan = functools.partial(public_defaults(_interface.plan), interpret=True)  # the keyword form
run_case = functools.partial(run_attention_case, flash_attention_triton, heads=4, kv_heads=2)


@pytest.mark.parametrize(
    "q_len, kv_len, heads, kv_heads, causal",
    [
        (100, 63, 4, 2, False),  # ragged, GQA
        (1, 100, 4, 1, False),  # single query row, MQA
        (100, 100, 4, 2, True),  # causal GQA: skipped, edge and interior blocks
        (63, 100, 2, 1, True),  # causal with more keys than queries (top-left aligned)
    ],
)
def test_shapes(q_len, kv_len, heads, kv_heads, causal):
    run_case(q_len=q_len, kv_len=kv_len, heads=heads, kv_heads=kv_heads, causal=causal)


def test_sliding_window_both_sides():  # (causal windows: `test_all_features_together`)
    run_case(q_len=100, kv_len=100, sliding_window=(16, 8))


def test_soft_cap():  # also: fewer keys than one block
    run_case(logits_soft_cap=2.0, causal=True, batch=2, q_len=63, kv_len=17)


def test_bias():
    run_case(batch=2, bias_shape=(2, 4, 100, 63), causal=True)


def test_segments_with_padding():
    seg = segments(2, 100, pad=7, key=1)
    run_case(batch=2, q_len=100, kv_len=100, segments=(seg, seg))


def test_attention_mask_with_right_window():
    mask = jax.random.bernoulli(jax.random.PRNGKey(7), 0.6, (2, 1, 100, 63))
    run_case(batch=2, mask=mask, sliding_window=(0, 33))


def test_head_dims_not_powers_of_two():
    run_case(head_dim=24, value_dim=40, q_len=50, kv_len=70, causal=True)


def test_dropout_matches_reference():
    """Same seed, same kept entries as the reference, forward and backward."""
    seed = jnp.asarray(1234, jnp.uint32)
    run_case(batch=2, q_len=63, kv_len=100, dropout_prob=0.3, dropout_seed=seed, causal=True)


def test_fully_masked_rows_are_zero():
    """Rows with no allowed key (mask row all False, or negative q segment) give 0 and finite grads."""
    q_len = kv_len = 64
    mask = jax.random.bernoulli(jax.random.PRNGKey(3), 0.7, (1, 4, q_len, kv_len))
    mask = mask.at[:, :, 5].set(False).at[:, 1, 40:48].set(False)
    q_seg = segments(1, q_len, pad=0, key=2).at[:, 20].set(-1)
    kv_seg = jnp.where(jnp.arange(kv_len) < 33, q_seg, 0)
    for num_sinks in (None, 4):
        fn, args = run_case(
            q_len=q_len,
            kv_len=kv_len,
            mask=mask,
            segments=(q_seg, kv_seg),
            num_sinks=num_sinks,
            sliding_window=(32, 32),
        )
        out = fn(*args)
        for row, head in ((5, 0), (5, 3), (44, 1), (20, 2)):
            assert bool(jnp.all(out[0, row, head] == 0.0)), (row, head)


def test_all_features_together():
    """Causal + window + soft cap + sinks + segments + bias + GQA in one call."""
    segs = segments(2, 100, pad=5, key=4)
    run_case(
        batch=2,
        q_len=100,
        kv_len=100,
        heads=4,
        kv_heads=2,
        causal=True,
        sliding_window=(48, 0),
        logits_soft_cap=3.0,
        num_sinks=4,
        segments=(segs, segs),
        bias_shape=(1, 4, 100, 100),
    )


def test_bfloat16():
    run_case(dtype=jnp.bfloat16, causal=True, num_sinks=4, bias_shape=(1, 1, 100, 63))


def test_bfloat16_soft_cap_without_running_max():
    """bf16 + soft cap, no bias: the forward exponentiates each logit as it is (`TritonFlashStatic.bounded`). Here q is
    scaled so the logits press against a cap of 50 (terms up to 2^72), with sinks and causal rows of one key."""
    q = randn((2, 70, 4, 32), jnp.bfloat16) * 40
    k, v = randn((2, 70, 2, 32), jnp.bfloat16), randn((2, 70, 2, 32), jnp.bfloat16)
    aux = randn((4,), jnp.float32)
    static = dict(softmax_scale=32**-0.5, causal=True, logits_soft_cap=50.0)
    assert plan(q, k, v, None, aux, **static)[0].bounded
    fn = jax.jit(lambda q, k, v, aux: flash_attention_triton(q, k, v, None, aux, **static, **SMALL))
    ref = lambda q, k, v, aux: flash_attention_reference(q, k, v, None, aux, **static)
    check_forward_and_grads(fn, ref, (q, k, v, aux), (0, 1, 2, 3), jnp.bfloat16)


@pytest.mark.parametrize("options", [dict(causal=True), dict(logits_soft_cap=2.0, bias=True)])
def test_return_lse_with_its_gradient(options):
    """`return_lse=True`: each row's natural log-sum-exp (sinks included) as the reference's, and gradients through
    both outputs (an lse cotangent joins the backward as `delta - dlse`); raw logits, and soft cap with a bias."""
    q, k, v = randn((2, 63, 4, 32)), randn((2, 100, 2, 32)), randn((2, 100, 2, 32))
    aux, bias = randn((4,)), randn((1, 4, 63, 100)) if options.pop("bias", False) else None
    static = dict(softmax_scale=32**-0.5, **options)
    joined = lambda fn: lambda *a: jnp.concatenate([x.astype(jnp.float32).ravel() for x in fn(*a)])
    fn = jax.jit(joined(lambda q, k, v, aux: flash_attention_triton(q, k, v, bias, aux, return_lse=True, **static)))
    ref = joined(lambda q, k, v, aux: flash_attention_reference(q, k, v, bias, aux, return_lse=True, **static))
    check_forward_and_grads(fn, ref, (q, k, v, aux), (0, 1, 2, 3), jnp.float32)


def test_return_lse_of_an_empty_row_is_minus_infinity():
    q, k = randn((1, 16, 2, 32)), randn((1, 16, 2, 32))
    seg = jnp.where(jnp.arange(16) < 12, 0, -1)[None]  # the last four queries are padding: no key
    out, lse = flash_attention_triton(
        q, k, k, softmax_scale=0.2, q_segment_ids=seg, kv_segment_ids=seg, return_lse=True
    )
    _, expected = flash_attention_reference(
        q, k, k, softmax_scale=0.2, q_segment_ids=seg, kv_segment_ids=seg, return_lse=True
    )
    assert jnp.all(jnp.isneginf(lse[:, 12:])) and jnp.all(out[:, 12:] == 0)
    assert_close(lse[:, :12], expected[:, :12], name="lse")


def wide_logits(kind: str, dtype):
    """q, k, v whose logits leave the checked zero offset's range: "high" reaches ~100, "low" stays near -106."""
    q, k, v = randn((2, 70, 4, 32), dtype), randn((2, 70, 2, 32), dtype), randn((2, 70, 2, 32), dtype)
    if kind == "high":
        return q * 40, k, v
    # One shared direction puts every logit near -100 * 6 / sqrt(32), where 2^logit underflows float32; the
    # other directions keep the gradients well posed.
    return q.at[..., 0].set(-100), k.at[..., 0].set(6), v


@pytest.mark.parametrize(
    "kind, dtype, params", [("high", jnp.float32, SMALL), ("low", jnp.bfloat16, SMALL), ("low", jnp.float32, {})]
)
def test_zero_offset_redone_with_running_max(kind, dtype, params):
    """Without soft cap the forward tries offset 0 (`TritonFlashStatic.checked_zero_offset`); logits far outside its
    range send the rows' blocks to the redo pass (with smaller blocks than the first pass's by default),
    which recomputes them with the running max: the same answer."""
    q, k, v = wide_logits(kind, dtype)
    static = dict(softmax_scale=32**-0.5, causal=True)
    assert plan(q, k, v, **static)[0].checked_zero_offset
    fn = jax.jit(lambda q, k, v: flash_attention_triton(q, k, v, **static, **params))
    ref = lambda q, k, v: flash_attention_reference(q, k, v, **static)
    check_forward_and_grads(fn, ref, (q, k, v), (0, 1, 2), dtype)


def test_zero_offset_only_where_every_row_has_a_key():
    q, k = randn((1, 70, 2, 32)), randn((1, 50, 2, 32))
    eligible = lambda q, k, **kw: plan(q, k, k, softmax_scale=1.0, **kw)[0].checked_zero_offset
    assert eligible(q, k, causal=True) and eligible(q, q, sliding_window=(4, 4))
    assert not eligible(q, k, sliding_window=(4, 4))  # queries past the last key may see none
    assert not eligible(q, k, logits_soft_cap=5.0)
    assert not eligible(q.astype(jnp.float16), k.astype(jnp.float16))  # P in float16 cannot hold 2^100


def test_default_tiles():
    run_case(q_len=40, kv_len=70, params={}, causal=True)


def test_refuses_what_it_cannot_serve():
    q = jnp.zeros((1, 8, 2, 32), jnp.float32)
    with pytest.raises(NotImplementedError):
        flash_attention_triton(q, q, q.astype(jnp.bfloat16), softmax_scale=1.0)
    big = jnp.zeros((1, 8, 2, 512), jnp.float32)
    with pytest.raises(NotImplementedError):
        flash_attention_triton(big, big, big, softmax_scale=1.0)
    with pytest.raises(NotImplementedError):
        flash_attention_triton(q, q, q, softmax_scale=1.0, fwd_params=FwdParams(block_q=8))
    wide = jnp.zeros((1, 256, 1, 256), jnp.float32)  # these tiles cannot fit in shared memory
    with pytest.raises(NotImplementedError):
        flash_attention_triton(wide, wide, wide, softmax_scale=1.0, fwd_params=FwdParams(256, 256, num_stages=4))
    with pytest.raises(ValueError):
        flash_attention_triton(q, jnp.zeros((1, 8, 3, 32)), jnp.zeros((1, 8, 3, 32)), softmax_scale=1.0)
    with pytest.raises(ValueError):  # a call built field by field: a rate without a seed
        flash_attention_triton(q, q, q, None, None, AttentionCall(softmax_scale=1.0, dropout_prob=0.1))


@pytest.mark.gpu
class TestOnGpu:
    """Real shapes on a CUDA GPU, compiled through Triton, against the XLA implementation."""

    @pytest.mark.parametrize("causal", [False, True])
    def test_matches_xla(self, causal):
        shapes = ((2, 1024, 8, 128), (2, 1024, 2, 128), (2, 1024, 2, 128))
        q, k, v = (randn(s, jnp.bfloat16) for s in shapes)
        kw = dict(softmax_scale=128**-0.5, causal=causal)
        fn = jax.jit(lambda q, k, v: flash_attention_triton(q, k, v, **kw, interpret=False))
        ref = jax.jit(lambda q, k, v: flash_attention_xla(q, k, v, **kw))
        out, vjp = jax.vjp(fn, q, k, v)
        ref_out, ref_vjp = jax.vjp(ref, q, k, v)
        assert_close(out, ref_out, jnp.bfloat16)
        cotangent = randn(out.shape, jnp.bfloat16)
        for name, g, rg in zip("qkv", vjp(cotangent), ref_vjp(cotangent), strict=True):
            assert_close(g, rg, jnp.bfloat16, tol=4e-2, name=f"d{name}")

    def test_return_lse_matches_xla(self):
        """The compiled kernels' log-sum-exp and the gradients through it, against XLA's (GQA, causal, sinks)."""
        q, k, v = randn((2, 1024, 8, 128), jnp.bfloat16), *(randn((2, 1024, 2, 128), jnp.bfloat16) for _ in "kv")
        aux = randn((8,))
        kw = dict(softmax_scale=128**-0.5, causal=True, return_lse=True)
        loss = lambda f: lambda q, k, v: sum(jnp.sum(jnp.sin(x.astype(jnp.float32))) for x in f(q, k, v, None, aux))
        fn = lambda q, k, v, b, s: flash_attention_triton(q, k, v, b, s, interpret=False, **kw)
        ref = lambda q, k, v, b, s: flash_attention_xla(q, k, v, b, s, **kw)
        (out, lse), (ref_out, ref_lse) = jax.jit(fn)(q, k, v, None, aux), jax.jit(ref)(q, k, v, None, aux)
        assert_close(out, ref_out, jnp.bfloat16)
        assert_close(lse, ref_lse, jnp.float32, tol=1e-2, name="lse")
        grads, ref_grads = (jax.jit(jax.grad(loss(f), argnums=(0, 1, 2)))(q, k, v) for f in (fn, ref))
        for name, g, rg in zip("qkv", grads, ref_grads, strict=True):
            assert_close(g, rg, jnp.bfloat16, tol=4e-2, name=f"d{name}")

    @pytest.mark.parametrize("kind", ["high", "low"])
    def test_zero_offset_redone_with_running_max(self, kind):
        """The redo branch (a second key loop under a branch) compiled through Triton."""
        q, k, v = wide_logits(kind, jnp.bfloat16)
        static = dict(softmax_scale=32**-0.5, causal=kind == "low")
        fn = jax.jit(lambda q, k, v: flash_attention_triton(q, k, v, **static, interpret=False))
        ref = lambda q, k, v: flash_attention_reference(q, k, v, **static)
        check_forward_and_grads(fn, ref, (q, k, v), (0, 1, 2), jnp.bfloat16)


@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")
@pytest.mark.parametrize("logits", ["raw", "soft cap, bias, sinks"])
def test_forward_and_backward_lower_for_cuda(cuda_lowering, logits):
    """Both ways the kernels take logits lower to Triton for an H100: raw `q·k` (whose backward exponent is
    an explicit FMA, so that logit·scale is not rounded at large logits) and base-2 logits."""
    q, k = randn((1, 256, 4, 64), jnp.bfloat16), randn((1, 256, 2, 64), jnp.bfloat16)
    extra, kw = (None, None), dict(causal=True)
    if logits != "raw":
        extra, kw = (randn((1, 4, 256, 256), jnp.bfloat16), randn((4,))), dict(logits_soft_cap=20.0)

    def fn(q, k, v):
        return public_defaults(_interface.flash_attention_triton)(
            q, k, v, *extra, softmax_scale=0.125, interpret=False, **kw
        )

    train = lambda *a: jax.vjp(fn, *a)[1](fn(*a))
    text = jax.jit(train).trace(q, k, k).lower(lowering_platforms=("cuda",)).as_text()
    for name in ("fwd", "bwd_dq", "bwd_dkv"):
        assert f"ejkernel_flash_attention_{name}" in text, name
    assert text.count("fma.rn.f32") == (2 if logits == "raw" else 0)
