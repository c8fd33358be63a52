"""Calls written as EasyDeL 0.3.0 and upstream ejkernel write them (API.md section 4), each checked against
the float32 reference: the `ejkernel.callib` / `loggings` surface, upstream's config spellings and knobs,
shard specs in upstream's forms, the gated delta rule's 0.0.78 argument order, ring attention with a dense
mask, and recurrent attention's per-key-channel `g`."""

import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from ejkernel import modules
from ejkernel.reference import paged_attention as paged_reference
from ejkernel.reference.flash_attention import flash_attention_reference
from ejkernel.reference.linear_attention import delta_rule_reference, linear_recurrence_reference
from ejkernel.types import MaskInfo
from harness import assert_close, randn
from serving_attention.paged_cases import ragged_v3_case, unified_case

# ----------------------------------------------------------------------------- ejkernel.callib, loggings


def test_ejit_is_jax_jit_in_every_form():
    from ejkernel.callib import ejit

    @ejit
    def double(x):
        return 2 * x

    @ejit(static_argnames=["power"])
    def raise_to(x, power):
        return x**power

    x = randn((3,))
    before = jax.config.jax_compilation_cache_dir
    assert_close(double(x), 2 * x)
    assert_close(raise_to(x, power=2), x**2)
    assert_close(raise_to(x, power=3), x**3)  # a static value is part of the key
    assert_close(ejit(lambda v: v + 1, donate_argnums=())(x), x + 1)
    compiled = raise_to.lower(x, power=2).compile()  # EasyDeL's `.lower(...).compile()`
    assert_close(compiled(x), x**2)
    assert jax.config.jax_compilation_cache_dir == before  # no global setting changed


def test_cdiv_is_exact_for_ints_and_arrays():
    from ejkernel.callib import cdiv

    assert cdiv(7, 2) == 4 and type(cdiv(7, 2)) is int
    assert cdiv(np.int64(8), np.int32(4)) == 2 and type(cdiv(np.int64(8), 4)) is int
    np.testing.assert_array_equal(cdiv(jnp.array([-3, 0, 5]), 2), [-1, 0, 3])  # ceil(-1.5) = -1


def test_args_signature_counts_scalar_values():
    from ejkernel.callib._ejit import _get_args_signature

    x = jnp.ones((2, 3), jnp.bfloat16)
    one = _get_args_signature((x, 4), {"mode": "a"})
    assert one == _get_args_signature((jnp.zeros((2, 3), jnp.bfloat16), 4), {"mode": "a"})
    assert "(2, 3)" in one and "bfloat16" in one
    assert one != _get_args_signature((x, 5), {"mode": "a"})
    assert one != _get_args_signature((x, 4), {"mode": "b"})


def test_get_logger_levels_prefix_and_one_handler(monkeypatch, capfd):
    from ejkernel.loggings import get_logger

    monkeypatch.setenv("LOGGING_LEVEL_ED", "no-such-level")
    logger = get_logger("ejkernel.test_logger")
    assert logger.name == "ejkernel.test_logger" and logger.level == logging.INFO
    assert get_logger("x", "debug").level == logging.DEBUG
    get_logger("ejkernel.test_logger").warning("value %d\nsecond line", 7)
    logger.debug("hidden")
    logger.info("shown")
    lines = capfd.readouterr().err.splitlines()
    assert len(lines) == 3 and all(line.startswith("(") and "ejkernel.test_logger) " in line for line in lines)
    assert lines[0].endswith("value 7") and lines[1].endswith("second line") and lines[2].endswith("shown")
    assert len(logging.getLogger("ejkernel.test_logger").handlers) == 1
    with pytest.raises(AttributeError):
        logger.handlers  # noqa: B018


# ----------------------------------------------------------------------------- config spellings and knobs


def test_lower_case_v_names_are_our_classes():
    from ejkernel.modules.operations import configs

    assert configs.RaggedPageAttentionv2Config is modules.RaggedPageAttentionV2Config
    assert configs.RaggedPageAttentionv3Config is modules.RaggedPageAttentionV3Config
    assert modules.RaggedPageAttentionv3 is modules.RaggedPageAttentionV3


def test_ragged_v3_with_upstream_knobs_matches_the_reference():
    args, _ = ragged_v3_case(np.random.default_rng(0))
    cfg = modules.RaggedPageAttentionv3Config(num_kv_pages_per_block=8)
    cfg = dataclasses.replace(cfg, num_kv_pages_per_block=3, num_queries_per_block=5, chunk_prefill_size=7)
    assert type(cfg).from_json(cfg.to_json()) == cfg
    out, cache = modules.ragged_page_attention_v3(*args, cfg=cfg)
    expected, expected_cache = paged_reference.ragged_page_attention_v3_reference(*args)
    assert_close(out, expected)
    assert_close(cache, expected_cache)
    with pytest.raises(ValueError, match="num_kv_pages_per_block must be a positive int"):
        modules.RaggedPageAttentionV3Config(num_kv_pages_per_block=0)


def test_unified_attention_with_easydel_config_matches_the_reference():
    args, _ = unified_case(np.random.default_rng(1))
    cfg = modules.UnifiedAttentionConfig(num_warps=8, num_stages=2, num_par_softmax_segments=4, seq_threshold_3d=64)
    assert_close(modules.unified_attention(*args, cfg=cfg), paged_reference.unified_attention_reference(*args))
    with pytest.raises(ValueError, match=r"platform='triton'.*current device backend: cpu"):
        modules.unified_attention(*args, cfg=cfg, platform="triton")


@pytest.mark.gpu
def test_unified_attention_on_triton_with_easydel_config():
    """EasyDeL hard-codes `platform="triton"` with this config: on a GPU it runs (the split-key decode too)."""
    cfg = modules.UnifiedAttentionConfig(num_warps=8, num_stages=2, num_par_softmax_segments=4, seq_threshold_3d=64)
    for case in (dict(), dict(q_lens=(1, 1, 0, 1, 1))):
        args, _ = unified_case(np.random.default_rng(2), **case)
        out = modules.unified_attention(*args, cfg=cfg, platform="triton")
        assert_close(out, paged_reference.unified_attention_reference(*args))


# ----------------------------------------------------------------------------- shard specs as upstream writes them


def mesh(shape=(1, 4), names=("sp", "tp")):
    return jax.make_mesh(shape, names, devices=jax.devices()[: int(np.prod(shape))])


def test_spec_forms_upstream_accepts():
    """A None spec for per-head sinks follows the split heads; 7 specs for 8 tensor slots (EasyDeL's paged
    flash attention); `P(None)` for a slot not passed; a sequence axis named on a mesh axis of size 1."""
    q, k, v = randn((2, 16, 8, 16)), randn((2, 16, 4, 16)), randn((2, 16, 4, 16))
    sinks = randn((8,))
    heads, seq_heads = P(None, None, "tp"), P(None, "sp", "tp")
    expected = flash_attention_reference(q, k, v, softmax_scale=0.25, causal=True, softmax_aux=sinks)
    sharded = dict(mesh=mesh(), out_specs=heads, causal=True)
    out = modules.flash_attention(q, k, v, None, None, None, sinks, in_specs=(heads,) * 3 + (None,) * 4, **sharded)
    assert_close(out, expected)
    out = modules.flash_attention(q, k, v, None, None, None, sinks, in_specs=(seq_heads,) * 3 + (None,) * 4, **sharded)
    assert_close(out, expected)
    out = modules.flash_attention(q, k, v, None, in_specs=(heads,) * 3 + (P(None),), **sharded)
    assert_close(out, flash_attention_reference(q, k, v, softmax_scale=0.25, causal=True))
    with pytest.raises(ValueError, match="shard the key sequence axis"):  # a split of size 4 stays an error
        modules.flash_attention(q, k, v, in_specs=(P(None, "tp"),) * 3, mesh=mesh(), out_specs=P(None, "tp"))


def test_paged_flash_attention_as_easydel_calls_it():
    q = randn((2, 8, 4, 16))
    pages = jnp.asarray([[2, 0, 5], [1, 4, 3]], jnp.int32)
    cache_k, cache_v = randn((6, 4, 4, 16)), randn((6, 4, 4, 16))  # [pages, page, kv heads, dim]
    sinks = randn((4,))
    gather = lambda cache: cache[pages].reshape(2, 12, 4, 16)
    expected = flash_attention_reference(
        q, gather(cache_k), gather(cache_v), softmax_scale=0.25, causal=True, softmax_aux=sinks
    )
    heads, cache_spec = P(None, None, "tp"), P(None, None, "tp", None)
    out = modules.flash_attention(
        q, cache_k, cache_v, None, None, None, sinks, pages,
        causal=True, mesh=mesh((4,), ("tp",)), in_specs=(heads, cache_spec, cache_spec, None, None, None, None),
        out_specs=heads,
    )  # fmt: skip
    assert_close(out, expected)


def test_blocksparse_and_ragged_v2_with_easydel_specs():
    """EasyDeL's blocksparse call (`P(None)` for the bias slot it leaves None) and RPA v2 call (`Ps()` for
    the per-sequence arrays, the pages split on their combined K/V heads), heads over 4 devices."""
    from ejkernel.reference.blocksparse_attention import blocksparse_attention_reference
    from serving_attention.paged_cases import ragged_v2_case

    q, k, v = randn((2, 8, 32, 16)), randn((2, 4, 32, 16)), randn((2, 4, 32, 16))
    heads = P(None, "tp")
    out = modules.blocksparse_attention(
        q, k, v, None, None, causal=True, mesh=mesh((4,), ("tp",)), in_specs=(heads, heads, heads, None, P(None)),
        out_specs=heads,
    )  # fmt: skip
    assert_close(out, blocksparse_attention_reference(q, k, v, causal=True))
    args, options = ragged_v2_case(np.random.default_rng(3), heads=8, kv_heads=4, sinks=None)
    token_heads = P(None, "tp")
    specs = (token_heads, P(None, None, "tp"), P(), P(), P(), P(), P(None))
    out = modules.ragged_page_attention_v2(
        *args, **options, mesh=mesh((4,), ("tp",)), in_specs=specs, out_specs=token_heads
    )
    assert_close(out, paged_reference.ragged_page_attention_v2_reference(*args, **options))


def test_sdpa_given_six_specs():
    """EasyDeL's six specs, the lengths' following the batch split (they are per-row valid lengths)."""
    q, k, v = randn((4, 8, 4, 16)), randn((4, 8, 4, 16)), randn((4, 8, 4, 16))
    lengths = jnp.array([8, 3, 0, 5], jnp.int32)
    rows, heads = P("dp", None, "tp"), P(None, None, "tp")
    out = modules.scaled_dot_product_attention(
        q, k, v, None, None, None, causal=True, mesh=mesh((4,), ("tp",)), in_specs=(heads,) * 3 + (None,) * 3,
        out_specs=heads,
    )  # fmt: skip
    assert_close(out, flash_attention_reference(q, k, v, softmax_scale=0.25, causal=True))
    out = modules.scaled_dot_product_attention(
        q, k, v, None, lengths, lengths, mesh=mesh((2, 2), ("dp", "tp")),
        in_specs=(rows,) * 3 + (None, P("dp"), P("dp")), out_specs=rows,
    )  # fmt: skip
    valid = jnp.arange(8)[None, :] < lengths[:, None]
    mask = (valid[:, :, None] & valid[:, None, :])[:, None]
    assert_close(out, flash_attention_reference(q, k, v, softmax_scale=0.25, attention_mask=mask))


# ----------------------------------------------------------------------------- op call forms


def test_gated_delta_rule_with_the_state_sixth_as_easydel_passes_it():
    batch, seq, heads, dk, dv = 2, 12, 4, 8, 8
    q, k = randn((batch, seq, heads, dk)), randn((batch, seq, heads, dk))
    v, state = randn((batch, seq, heads, dv)), randn((batch, heads, dk, dv), scale=0.1)
    beta, decay = jax.nn.sigmoid(randn((batch, seq, heads))), -jax.nn.softplus(randn((batch, seq, heads)))
    expected, final = delta_rule_reference(q, k, v, beta, decay, initial_state=state)
    spec = P(None, None, "tp")
    state_spec = P(None, "tp", None, None)
    for decay_arg, decay_spec in ((decay, spec), (None, None)):
        want = (expected, final) if decay_arg is not None else delta_rule_reference(q, k, v, beta, initial_state=state)
        out, new_state = modules.gated_delta_rule(
            q, k, v, beta, decay_arg, state, use_qk_l2norm=True, use_chunked=False, return_state=True,
            cfg=modules.GatedDeltaRuleConfig(chunk_size=8), platform="pallas", mesh=mesh((4,), ("tp",)),
            in_specs=(spec, spec, spec, spec, decay_spec, state_spec), out_specs=(spec, state_spec),
        )  # fmt: skip
        assert_close(out, want[0])
        assert_close(new_state, want[1])
    out = modules.gated_delta_rule(q, k, v, beta, decay, state, cfg=modules.GatedDeltaRuleConfig(chunk_size=4))
    assert_close(out, expected)
    with pytest.raises(TypeError, match=r"seg_ids .* or, with nothing seventh, the initial state"):
        modules.gated_delta_rule(q, k, v, beta, decay, state, state)


def test_ring_attention_with_a_dense_mask_as_mistral_runs_it():
    """EasyDeL's Mistral with `attn_mechanism="ring"`: a sliding-window dense mask in mask_info, padding rows,
    global arrays on a mesh whose sequence axis rings over 4 devices; forward and gradients."""
    batch, seq, heads, dim = 2, 16, 4, 8
    q, k, v = randn((batch, seq, heads, dim)), randn((batch, seq, 2, dim)), randn((batch, seq, 2, dim))
    valid = jnp.arange(seq)[None, :] < jnp.array([[16], [11]])
    i, j = jnp.arange(seq)[:, None], jnp.arange(seq)[None, :]
    dense = (valid[:, None, :, None] & valid[:, None, None, :]) & (j <= i) & (j > i - 5)
    mask_info = MaskInfo.from_attention_mask(dense)
    spec = P(None, "sp")
    ring = jax.jit(lambda q, k, v: modules.ring_attention(
        q, k, v, None, None, mask_info=mask_info, causal=True, axis_name="sp",
        mesh=mesh((4,), ("sp",)), in_specs=(spec, spec, spec, None, None), out_specs=spec,
    ))  # fmt: skip
    reference = lambda q, k, v: flash_attention_reference(q, k, v, softmax_scale=dim**-0.5, attention_mask=dense)
    assert_close(ring(q, k, v), reference(q, k, v))
    cotangent = randn((batch, seq, heads, dim))
    grads = jax.vjp(ring, q, k, v)[1](cotangent)
    expected = jax.vjp(reference, q, k, v)[1](cotangent)
    for name, got, want in zip("qkv", grads, expected, strict=True):
        assert_close(got, want, tol=1e-4, name=f"d{name}")


def test_recurrent_attention_takes_g_per_key_channel():
    q, k, v = randn((1, 10, 2, 8)), randn((1, 10, 2, 8)), randn((1, 10, 2, 8))
    g = -jax.nn.softplus(randn((1, 10, 2, 8)))
    gk = -jax.nn.softplus(randn((1, 10, 2, 8)))
    assert_close(modules.recurrent_attention(q, k, v, g), linear_recurrence_reference(q, k, v, gk=g)[0])
    both = modules.recurrent_attention(q, k, v, g, None, gk)
    assert_close(both, linear_recurrence_reference(q, k, v, gk=g + gk)[0])
