"""causal_conv1d: the XLA implementation against the reference, dense and packed, forward and every gradient;
the state pool's rules (decode chains, empty sequences, unused slots, widths W - 1 and W, donation); EasyDeL's
call form; bad inputs; channels sharded on the simulated devices; the Triton tiling's fields."""

import functools
import re

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from ejkernel.modules import CausalConv1dConfig, CausalConv1dTritonTiling, causal_conv1d, ragged_causal_conv1d
from ejkernel.reference.causal_conv1d import causal_conv1d_reference
from harness import assert_close, check_forward_and_grads, randn

C = 6


def _flat(result):
    """One array of every float output, so that one cotangent checks every gradient path."""
    return jnp.concatenate([leaf.ravel().astype(jnp.float32) for leaf in jax.tree_util.tree_leaves(result)])


def _check(args, argnums, dtype=jnp.float32, **options):
    """The op and the reference on `(x, weight, bias, conv_state)`: outputs and the gradients in `argnums`."""

    def call(fn, x, weight, bias, state):
        return _flat(fn(x, weight, bias, conv_state=state, **options))

    op = jax.jit(lambda *a: call(causal_conv1d, *a))  # one compilation each, not one per eager op
    ref = jax.jit(lambda *a: call(causal_conv1d_reference, *a))
    check_forward_and_grads(op, ref, list(args), argnums, dtype)


@pytest.mark.parametrize(
    ("width", "bias", "activation", "state_width"),
    [(4, True, "silu", None), (4, False, None, -1), (4, True, None, 0), (2, False, "silu", -1)],
)
def test_dense_matches_reference(width, bias, activation, state_width):
    x, weight = randn((2, 11, C)), randn((C, width))
    b = randn((C,)) if bias else None
    state = None if state_width is None else randn((2, C, width + state_width))
    argnums = tuple(i for i, a in enumerate((x, weight, b, state)) if a is not None)
    _check((x, weight, b, state), argnums, activation=activation)


def test_under_jit_vmap_and_checkpoint():
    x, weight, b = randn((3, 2, 7, C)), randn((C, 4)), randn((C,))
    call = lambda x: causal_conv1d(x, weight, b, activation="silu")
    expected = jnp.stack([causal_conv1d_reference(row, weight, b, activation="silu") for row in x])
    assert_close(jax.jit(jax.vmap(call))(x), expected)
    grad = jax.grad(lambda x: jnp.sum(jax.checkpoint(call)(x) ** 2))(x[0])
    assert_close(grad, jax.grad(lambda x: jnp.sum(causal_conv1d_reference(x, weight, b, activation="silu") ** 2))(x[0]))


def test_dense_bfloat16():
    x, weight, b = randn((2, 9, C), jnp.bfloat16), randn((C, 4), jnp.bfloat16), randn((C,), jnp.bfloat16)
    _check((x, weight, b, randn((2, C, 3), jnp.bfloat16)), (0, 1, 2, 3), jnp.bfloat16, activation="silu")
    assert causal_conv1d(x, weight, b).dtype == jnp.bfloat16


@pytest.mark.parametrize(("width", "state_width"), [(4, None), (4, -1), (4, 0), (3, -1)])
def test_packed_matches_reference(width, state_width):
    """Prefill, decode (one token), empty and shorter-than-the-window sequences, padding tokens, unused slots."""
    cu = jnp.array([0, 7, 8, 8, 10, 17], jnp.int32)  # lengths 7, 1, 0, 2, 7; tokens 17-19 are padding
    x, weight, b = randn((20, C)), randn((C, width)), randn((C,))
    state = None if state_width is None else randn((7, C, width + state_width))
    slots = None if state is None else jnp.array([5, 0, 3, 2, 6], jnp.int32)  # slots 1 and 4 unused
    argnums = (0, 1, 2) if state is None else (0, 1, 2, 3)
    _check((x, weight, b, state), argnums, activation="silu", cu_seqlens=cu, state_indices=slots)
    if state is not None:
        out, pool = causal_conv1d(x, weight, b, cu_seqlens=cu, conv_state=state, state_indices=slots)
        for unchanged in (1, 4, 3):  # unused, unused, the empty sequence's
            assert bool(jnp.all(pool[unchanged] == state[unchanged]))
        assert bool(jnp.all(out[17:] == 0))


def test_packed_equals_dense_rows_and_decode_chain_equals_one_call():
    """A packed batch of equal lengths is the dense call; prefill then decode steps equal one long call."""
    x, weight, b = randn((3, 9, C)), randn((C, 4)), randn((C,))
    state = randn((3, C, 3))
    dense_out, dense_state = causal_conv1d(x, weight, b, conv_state=state, activation="silu")
    cu = jnp.arange(4, dtype=jnp.int32) * 9
    out, pool = causal_conv1d(x.reshape(27, C), weight, b, cu_seqlens=cu, conv_state=state, activation="silu")
    assert_close(out.reshape(3, 9, C), dense_out)
    assert_close(pool, dense_state)

    step = jax.jit(functools.partial(causal_conv1d, activation="silu"), donate_argnames="conv_state")
    pool, outs = state, []
    prefill = jnp.array([0, 2, 4, 6], jnp.int32)  # two tokens each, then seven decode steps
    out, pool = step(x[:, :2].reshape(6, C), weight, b, cu_seqlens=prefill, conv_state=pool)
    outs.append(out.reshape(3, 2, C))
    for t in range(2, 9):
        out, pool = step(x[:, t], weight, b, cu_seqlens=jnp.arange(4, dtype=jnp.int32), conv_state=pool)
        outs.append(out[:, None])
    assert_close(jnp.concatenate(outs, axis=1), dense_out)
    assert_close(pool, dense_state)


def test_donated_pool_is_updated_in_place():
    pool, x, weight = randn((4, C, 4)), randn((3, C)), randn((C, 4))
    step = jax.jit(
        lambda x, w, pool, si: causal_conv1d(x, w, cu_seqlens=jnp.array([0, 2, 3]), conv_state=pool, state_indices=si),
        donate_argnums=2,
    )
    expected = causal_conv1d_reference(x, weight, cu_seqlens=[0, 2, 3], conv_state=pool, state_indices=[3, 1])[1]
    _, new = step(x, weight, pool, jnp.array([3, 1], jnp.int32))
    assert pool.is_deleted()
    assert_close(new, expected)


def test_traced_out_of_range_slot_reads_zeros_and_writes_nothing():
    pool, x, weight = randn((3, C, 3)), randn((5, C)), randn((C, 4))
    cu, slots = jnp.array([0, 2, 5], jnp.int32), jnp.array([7, 1], jnp.int32)
    out, new = jax.jit(lambda s: causal_conv1d(x, weight, cu_seqlens=cu, conv_state=pool, state_indices=s))(slots)
    assert_close(out[:2], causal_conv1d_reference(x[:2], weight, cu_seqlens=[0, 2]))
    assert bool(jnp.all(new[0] == pool[0])) and bool(jnp.all(new[2] == pool[2]))


@pytest.mark.lowest
def test_easydel_call_form():
    """EasyDeL 0.3.0's `ragged_causal_conv1d(x, conv_state, kernel, query_start_loc, state_indices, distribution,
    d_conv=, apply_silu=)`: full-width state, SiLU by default, sequences past `distribution[2]` inactive."""
    x, kernel, pool = randn((12, C)), randn((C, 4)), randn((5, C, 4))
    qsl, slots = jnp.array([0, 1, 3, 9, 11], jnp.int32), jnp.array([4, 0, 2, 1], jnp.int32)
    out, new = ragged_causal_conv1d(x, pool, kernel, qsl, slots, jnp.array([1, 3, 3], jnp.int32), d_conv=4)
    active = jnp.array([0, 1, 3, 9, 9], jnp.int32)
    ref_out, ref_pool = causal_conv1d_reference(
        x, kernel, activation="silu", cu_seqlens=active, conv_state=pool, state_indices=slots
    )
    assert_close(out, ref_out)
    assert_close(new, ref_pool)
    assert bool(jnp.all(new[1] == pool[1])) and bool(jnp.all(out[9:] == 0))
    raw, _ = jax.jit(functools.partial(ragged_causal_conv1d, d_conv=4, apply_silu=False))(x, pool, kernel, qsl, slots)
    assert_close(raw, causal_conv1d_reference(x, kernel, cu_seqlens=qsl, conv_state=pool, state_indices=slots)[0])


def test_empty_inputs():
    weight, state = randn((C, 4)), randn((2, C, 3))
    out, new = causal_conv1d(randn((2, 0, C)), weight, conv_state=state)
    assert out.shape == (2, 0, C) and bool(jnp.all(new == state))
    assert causal_conv1d(randn((0, C)), weight, cu_seqlens=jnp.array([0, 0], jnp.int32)).shape == (0, C)


@pytest.mark.lowest
def test_sharded_over_channels_and_batch():
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    x, weight, b, state = randn((4, 10, 8)), randn((8, 4)), randn((8,)), randn((4, 8, 3))
    specs = (P("data", None, "model"), P("model"), P("model"), P("data", "model"))
    out_specs = (P("data", None, "model"), P("data", "model"))
    got = causal_conv1d(x, weight, b, conv_state=state, mesh=mesh, in_specs=specs, out_specs=out_specs)
    expected = causal_conv1d_reference(x, weight, b, conv_state=state)
    jax.tree_util.tree_map(assert_close, got, expected)

    cu, pool, slots = jnp.array([0, 3, 3, 9], jnp.int32), randn((4, 8, 4)), jnp.array([2, 0, 3], jnp.int32)
    channels = jax.make_mesh((8,), ("model",))
    packed_specs = (P(None, "model"), P("model"), None, P(None, "model"), P(), P())
    call = lambda x, pool: causal_conv1d(
        x,
        weight,
        cu_seqlens=cu,
        conv_state=pool,
        state_indices=slots,
        mesh=channels,
        in_specs=packed_specs,
        out_specs=(P(None, "model"), P(None, "model")),
    )
    got = call(x[0], pool)
    jax.tree_util.tree_map(
        assert_close, got, causal_conv1d_reference(x[0], weight, cu_seqlens=cu, conv_state=pool, state_indices=slots)
    )
    with pytest.raises(ValueError, match=r"x's axis 0 \(tokens\)"):
        causal_conv1d(x[0], weight, cu_seqlens=cu, mesh=channels, in_specs=(P("model"), P(), P()), out_specs=P())
    with pytest.raises(ValueError, match=r"weight's axis 1 \(taps\)"):
        causal_conv1d(x, weight, mesh=channels, in_specs=(P(), P(None, "model")), out_specs=P())


def _bad(**changes):
    args = dict(x=jnp.ones((2, 5, C)), weight=jnp.ones((C, 4)), bias=None)
    args.update(changes)
    x, weight, bias = args.pop("x"), args.pop("weight"), args.pop("bias")
    return lambda: causal_conv1d(x, weight, bias, **args)


PACKED = dict(x=jnp.ones((5, C)), cu_seqlens=jnp.array([0, 2, 2, 5], jnp.int32))


@pytest.mark.lowest
@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (_bad(x=jnp.ones((2, 5, C), jnp.int32)), TypeError, "x"),
        (_bad(x=jnp.ones((5, C))), ValueError, r"x must have layout \[batch, seq, channels\]"),
        (_bad(weight=jnp.ones((C + 1, 4))), ValueError, r"weight must be \[channels, width\] with channels = 6"),
        (_bad(weight=jnp.ones((C, 4, 1))), TypeError, "weight"),
        (_bad(bias=jnp.ones((C + 1,))), TypeError, "bias"),
        (_bad(activation="gelu"), ValueError, "activation must be None, 'silu' or 'swish', got 'gelu'"),
        (_bad(conv_state=jnp.ones((2, C, 2))), ValueError, r"conv_state must be .* width = 4, got \(2, 6, 2\)"),
        (_bad(conv_state=jnp.ones((3, C, 3))), ValueError, "conv_state must be .* batch = 2"),
        (_bad(state_indices=jnp.array([0, 1])), ValueError, "state_indices needs cu_seqlens and conv_state"),
        (_bad(**{**PACKED, "cu_seqlens": jnp.array([0, 3, 9], jnp.int32)}), ValueError, r"cu_seqlens\[2\] = 9"),
        (_bad(**PACKED, conv_state=jnp.ones((2, C, 3))), ValueError, "one slot per sequence"),
        (
            _bad(**PACKED, conv_state=jnp.ones((2, C, 3)), state_indices=jnp.array([0, 1], jnp.int32)),
            ValueError,
            r"state_indices must be \[num_seqs\] = \(3,\)",
        ),
        (
            _bad(**PACKED, conv_state=jnp.ones((2, C, 3)), state_indices=jnp.array([0, 5, 2], jnp.int32)),
            ValueError,
            r"state_indices\[2\] = 2 is outside",  # slot 5 of the empty sequence is never read
        ),
        (
            lambda: ragged_causal_conv1d(
                jnp.ones((5, C)),
                jnp.ones((2, C, 4)),
                jnp.ones((C, 4)),
                *[jnp.array(a) for a in ([0, 5], [0])],
                d_conv=3,
            ),
            ValueError,
            "d_conv must equal kernel.shape",
        ),
        (
            lambda: ragged_causal_conv1d(
                jnp.ones((5, C)),
                jnp.ones((2, C, 4)),
                jnp.ones((C, 4)),
                *[jnp.array(a) for a in ([0, 5], [0], [0, 0, 2])],
            ),
            ValueError,
            r"distribution\[2\] = 2",
        ),
        (_bad(platform="triton"), ValueError, "causal_conv1d"),
    ],
)
def test_bad_input_is_one_line_naming_the_argument(call, error, words):
    with pytest.raises(error, match=words) as err:
        call()
    assert "\n" not in str(err.value)


def test_triton_tiling_round_trips_and_rejects_bad_fields():
    """`CausalConv1dConfig.triton_tiling` survives JSON; a bad field is one line naming it."""
    cfg = CausalConv1dConfig(
        platform="triton", triton_tiling=CausalConv1dTritonTiling(forward="shifted", step_rows=2, prefetch=True)
    )
    back = CausalConv1dConfig.from_json(cfg.to_json())
    assert back == cfg and isinstance(back.triton_tiling, CausalConv1dTritonTiling)
    for fields, words in (
        (dict(forward="tiles"), "CausalConv1dTritonTiling.forward must be 'window' or 'shifted', got 'tiles'"),
        (dict(step_rows=3), "CausalConv1dTritonTiling.step_rows must be a positive power of two, got 3"),
        (dict(step_rows=True), "CausalConv1dTritonTiling.step_rows must be a positive power of two, got True"),
        (dict(prefetch=1), "CausalConv1dTritonTiling.prefetch must be a bool, got 1"),
    ):
        with pytest.raises(ValueError, match=f"^{re.escape(words)}$"):
            CausalConv1dTritonTiling(**fields)
    with pytest.raises(ValueError, match=r"CausalConv1dConfig\.triton_tiling must be a CausalConv1dTritonTiling"):
        CausalConv1dConfig(triton_tiling={"forward": "window"})
