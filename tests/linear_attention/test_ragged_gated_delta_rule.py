"""`ragged_gated_delta_rule` (packed serving requests on a pool of states) and upstream's two private entries
against the token-by-token reference.

Request layout of most cases: padding tokens before and after the requests (`query_start_loc` does not
start at 0), prefill requests whose lengths no chunk size divides, decode requests of one token, an empty
request whose slot a non-empty one also names, and slots that no request names.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from linear_cases import log_decay, write_strength

from ejkernel import kernel_registry
from ejkernel.kernels._pallas.tpu.ragged_gated_delta_rule._interface import _decode_path
from ejkernel.kernels._xla.ragged_gated_delta_rule._xla_impl_fwd import _ragged_gdr_chunked_prefill
from ejkernel.modules import RaggedGatedDeltaRule, RaggedGatedDeltaRuleConfig, ragged_gated_delta_rule
from ejkernel.modules.operations import configs
from ejkernel.reference.ragged_gated_delta_rule import ragged_gated_delta_rule_reference
from harness import assert_close, randn

T, H, DK, DV, SLOTS = 48, 2, 8, 16, 9
# Requests: 13 tokens, 1 (decode), 0 (its slot 0 also request 1's), 21, 1, 6, 0 (its own slot 6); tokens 0-2
# and 45-47 are padding; slots 1, 3, 6 and 8 keep their states.
QSL = np.array([3, 16, 17, 17, 38, 39, 45, 45], np.int32)
SLOT_OF = np.array([4, 0, 0, 7, 2, 5, 6], np.int32)
# Decode-only batch: one token each but an empty request; tokens 0, 1 and 6, 7 are padding.
DECODE_QSL = np.array([2, 3, 4, 4, 5, 6], np.int32)
DECODE_SLOTS = np.array([1, 3, 8, 0, 6], np.int32)


def make_inputs(num_tokens=T, heads=H, dtype=jnp.float32, decay=True):
    """query, key, value, beta, decay (or None), recurrent_state: fresh draws, in `dtype`."""
    return (
        randn((num_tokens, heads, DK), dtype),
        randn((num_tokens, heads, DK), dtype),
        randn((num_tokens, heads, DV), dtype),
        write_strength(num_tokens, heads).astype(dtype),
        log_decay(num_tokens, heads).astype(dtype) if decay else None,
        randn((SLOTS, heads, DK, DV), dtype),
    )


def i32(x):
    return jnp.asarray(x, jnp.int32)


def reference(qsl, slots, use_qk_l2norm=True):
    """The reference on fixed request bounds and slots, as a function of the float inputs (jitted: it compiles
    faster as one program than it runs op by op)."""
    return lambda *inputs: ragged_gated_delta_rule_reference(*inputs, qsl, slots, use_qk_l2norm=use_qk_l2norm)


def check(out, new_state, inputs, qsl, slots, use_qk_l2norm=True):
    """Matches the reference; padding tokens are exactly zero, slots no non-empty request names exactly kept."""
    query, state = inputs[0], inputs[5]
    assert out.dtype == query.dtype and new_state.dtype == state.dtype
    ref_out, ref_state = jax.jit(reference(qsl, slots, use_qk_l2norm))(*inputs)
    assert_close(out, ref_out, query.dtype, name="out")
    assert_close(new_state, ref_state, query.dtype, name="new_state")
    outside = np.r_[0 : qsl[0], qsl[-1] : query.shape[0]]
    assert bool(jnp.all(out[outside] == 0))
    untouched = np.setdiff1d(np.arange(state.shape[0]), slots[np.diff(qsl) > 0])
    assert bool(jnp.all(new_state[untouched] == state[untouched]))


@pytest.mark.parametrize(
    "dtype, use_qk_l2norm, decay, chunk_size",
    [
        (jnp.float32, True, True, 8),
        (jnp.float32, False, False, 16),
        (jnp.float32, True, True, 6),  # not a power of two
        (jnp.bfloat16, True, True, 64),  # longer than every request
    ],
)
def test_mixed_requests_under_jit(dtype, use_qk_l2norm, decay, chunk_size):
    inputs = make_inputs(dtype=dtype, decay=decay)
    call = jax.jit(
        lambda *args: ragged_gated_delta_rule(*args, chunk_size=chunk_size, use_qk_l2norm=use_qk_l2norm)
    )  # query_start_loc and state_indices traced, as in serving
    out, new_state = call(*inputs, i32(QSL), i32(SLOT_OF))
    check(out, new_state, inputs, QSL, SLOT_OF, use_qk_l2norm)


def test_decode_only_requests_under_jit():
    inputs = make_inputs(num_tokens=8)
    out, new_state = jax.jit(ragged_gated_delta_rule)(*inputs, i32(DECODE_QSL), i32(DECODE_SLOTS))
    check(out, new_state, inputs, DECODE_QSL, DECODE_SLOTS)


def test_decode_batch_without_query_start_loc():
    """No `query_start_loc`: token i is request i (its slot `state_indices[i]`), under `jit` as in serving; tokens
    sharing a slot read its old state and the first writes it (as `arange(T + 1)` bounds give)."""
    inputs = make_inputs(num_tokens=6)
    slots = np.array([4, 0, 4, 7, 2, 0], np.int32)
    out, new_state = jax.jit(ragged_gated_delta_rule)(*inputs, None, i32(slots))
    check(out, new_state, inputs, np.arange(7, dtype=np.int32), slots)


@pytest.mark.lowest
def test_easydel_call_form():
    """EasyDeL's keyword call (decay zeros where the model has none), eagerly: the values are checked too."""
    query, key, value, beta, _, state = make_inputs()
    decay = jnp.zeros_like(beta)
    out, new_state = ragged_gated_delta_rule(
        query=query,
        key=key,
        value=value,
        beta=beta,
        decay=decay,
        recurrent_state=state,
        query_start_loc=i32(QSL),
        state_indices=i32(SLOT_OF),
        chunk_size=64,
        use_qk_l2norm=True,
    )
    check(out, new_state, (query, key, value, beta, None, state), QSL, SLOT_OF)


def test_decode_path_first_occurrence_wins():
    """Upstream's decode entry, called inside `shard_map` as EasyDeL calls it: output first; every token reads the
    given state of its slot, and of tokens sharing a slot the first writes it (slot 0 aliased by zero-padded indices
    keeps request 0's update)."""
    inputs = make_inputs(num_tokens=6)
    slots = np.array([0, 3, 0, 3, 0, 5], np.int32)
    mesh = jax.make_mesh((1,), ("tp",), axis_types=(jax.sharding.AxisType.Auto,))
    tokens, rows, pool = P(None, "tp", None), P(None, "tp"), P(None, "tp", None, None)
    entry = jax.shard_map(
        lambda *args: _decode_path(*args, True),
        mesh=mesh,
        in_specs=(tokens, tokens, tokens, rows, rows, pool, P()),
        out_specs=(tokens, pool),
        check_vma=False,
    )
    out, new_state = jax.jit(entry)(*inputs, i32(slots))
    assert out.shape == (6, H, DV) and new_state.shape == (SLOTS, H, DK, DV)
    check(out, new_state, inputs, np.arange(7, dtype=np.int32), slots)


def test_chunked_prefill_entry_returns_state_first():
    inputs = make_inputs()
    call = jax.jit(_ragged_gdr_chunked_prefill, static_argnums=(8, 9))
    new_state, out = call(*inputs, i32(QSL), i32(SLOT_OF), 16, False)
    assert new_state.shape == (SLOTS, H, DK, DV) and out.shape == (T, H, DV)
    check(out, new_state, inputs, QSL, SLOT_OF, use_qk_l2norm=False)


def test_grad_through_a_surrounding_function():
    """Not meant for training, but differentiable: the gradient w.r.t. the query is the reference's."""
    inputs = make_inputs()
    cotangent = randn((T, H, DV))
    qsl, slots = i32(QSL), i32(SLOT_OF)

    def loss(fn, query, *rest):
        out, new_state = fn(query, *rest)
        return jnp.sum(out * cotangent) + jnp.sum(new_state[4] ** 2)

    grad = jax.jit(jax.grad(lambda q, *rest: loss(ragged_gated_delta_rule, q, *rest)))(*inputs, qsl, slots)
    expected = jax.jit(jax.grad(lambda q, *rest: loss(reference(QSL, SLOT_OF), q, *rest)))(*inputs)
    assert_close(grad, expected, tol=1e-4)


@pytest.mark.lowest
def test_heads_split_over_a_mesh():
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    inputs = make_inputs(heads=4)
    heads = P(None, "model")  # axis 1 is the heads' in every tensor: [T, H, ...] and [S, H, Dk, Dv]
    specs = dict(mesh=mesh, in_specs=(heads,) * 6 + (P(), P()), out_specs=(heads, heads))
    out, new_state = ragged_gated_delta_rule(*inputs, i32(QSL), i32(SLOT_OF), chunk_size=16, **specs)
    check(out, new_state, inputs, QSL, SLOT_OF)
    tokens_split = dict(specs, in_specs=(P("data"),) * 5 + (heads, P(), P()))
    with pytest.raises(ValueError, match="query's axis 0"):
        ragged_gated_delta_rule(*inputs, i32(QSL), i32(SLOT_OF), **tokens_split)


def test_config_registry_and_exports():
    assert [f.name for f in dataclasses.fields(RaggedGatedDeltaRuleConfig)] == [
        "platform",
        "fwd_params",
        "bwd_params",
        "backend",
        "chunk_size",
    ]
    assert RaggedGatedDeltaRuleConfig().chunk_size == 64
    assert configs.RaggedGatedDeltaRuleConfig is RaggedGatedDeltaRuleConfig
    assert RaggedGatedDeltaRule.op_id == "ragged_gated_delta_rule"
    assert kernel_registry.get("ragged_gated_delta_rule", platform="xla") is not None
    with pytest.raises(ValueError, match="chunk_size"):
        RaggedGatedDeltaRuleConfig(chunk_size=0)
    # `platform` overrides cfg.platform (Pallas, Mosaic GPU, declines on a CPU: the call would fail on it).
    inputs = make_inputs(num_tokens=8)
    cfg = RaggedGatedDeltaRuleConfig(platform="pallas", chunk_size=4)
    out, new_state = ragged_gated_delta_rule(*inputs, i32(DECODE_QSL), i32(DECODE_SLOTS), platform="xla", cfg=cfg)
    check(out, new_state, inputs, DECODE_QSL, DECODE_SLOTS)


def _bad(**changes):
    """Keyword arguments of a small valid call, with `changes` applied (functions of the valid value)."""

    def build():
        query, key, value, beta, decay, state = make_inputs(num_tokens=8)
        call = dict(query=query, key=key, value=value, beta=beta, decay=decay, recurrent_state=state)
        call |= dict(query_start_loc=i32(DECODE_QSL), state_indices=i32(DECODE_SLOTS))
        for name, change in changes.items():
            call[name] = change(call.get(name))
        return call

    return build


BAD_INPUTS = {
    "no beta": (_bad(beta=lambda _: None), ValueError, "beta is required"),
    "no recurrent_state": (_bad(recurrent_state=lambda _: None), ValueError, "recurrent_state is required"),
    "decode batch's state_indices": (
        _bad(query_start_loc=lambda _: None),
        ValueError,
        r"state_indices must be \[tokens\] \(without query_start_loc, one token a request\) = \(8,\), got \(5,\)",
    ),
    "no state_indices": (_bad(state_indices=lambda _: None), ValueError, "state_indices is required"),
    "query rank": (_bad(query=lambda x: x[None]), ValueError, "query must be"),
    "query dtype": (_bad(query=lambda x: x.astype(jnp.int32)), TypeError, "query must be a floating"),
    "key shape": (_bad(key=lambda x: x[:, :, :4]), ValueError, "key must be"),
    "value tokens": (_bad(value=lambda x: x[:4]), ValueError, "value must be"),
    "beta shape": (_bad(beta=lambda x: x[:, :1]), ValueError, "beta must be"),
    "decay shape": (_bad(decay=lambda x: x[:4]), ValueError, "decay must be"),
    "state dim_v": (_bad(recurrent_state=lambda x: x[..., :4]), ValueError, "recurrent_state must be"),
    "float query_start_loc": (
        _bad(query_start_loc=lambda x: x.astype(jnp.float32)),
        TypeError,
        "query_start_loc must be an integer",
    ),
    "state_indices length": (_bad(state_indices=lambda x: x[:-1]), ValueError, "state_indices must be"),
    "decreasing query_start_loc": (
        _bad(query_start_loc=lambda x: x.at[2].set(5)),
        ValueError,
        r"query_start_loc\[3\] = 4 is outside \[query_start_loc\[i - 1\], 8\]",
    ),
    "query_start_loc past the tokens": (
        _bad(query_start_loc=lambda x: x.at[-1].set(9)),
        ValueError,
        r"query_start_loc\[5\] = 9 is outside",
    ),
    "slot out of range": (_bad(state_indices=lambda x: x.at[0].set(SLOTS)), ValueError, r"state_indices\[0\]"),
    "decode batch's slot out of range": (
        _bad(query_start_loc=lambda _: None, state_indices=lambda _: i32(np.arange(8)).at[5].set(SLOTS)),
        ValueError,
        r"state_indices\[5\]",
    ),
    "chunk_size": (_bad(chunk_size=lambda _: 0), ValueError, "chunk_size must be a positive int"),
    "cfg type": (_bad(cfg=lambda _: "xla"), TypeError, "cfg for ragged_gated_delta_rule"),
    "mesh alone": (_bad(mesh=lambda _: jax.make_mesh((8,), ("x",))), ValueError, "mesh, in_specs and out_specs"),
}


@pytest.mark.lowest
@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_raises_one_line_error(case):
    build, error, words = BAD_INPUTS[case]
    with pytest.raises(error, match=words) as raised:
        ragged_gated_delta_rule(**build())
    assert "\n" not in str(raised.value)
