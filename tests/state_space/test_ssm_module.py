"""The public `state_space_v1` / `state_space_v2`: arguments, conv_state, dtypes, transforms, registry,
sharding and errors."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from state_space_cases import packed, v1_inputs, v2_inputs

from ejkernel import kernel_registry
from ejkernel.modules import StateSpaceV1Config, StateSpaceV2Config, state_space_v1, state_space_v2
from ejkernel.reference.state_space import state_space_v1_reference, state_space_v2_reference
from harness import assert_close, check_forward_and_grads, randn

V1_CFG = StateSpaceV1Config(platform="xla", chunk_size=8)
V2_CFG = StateSpaceV2Config(platform="xla", chunk_size=8)


@pytest.mark.lowest
@pytest.mark.parametrize("op", ["v1", "v2"])
def test_public_function_under_jit_vmap_and_checkpoint(op):
    """An extra leading axis through vmap, each slice a full call; forward and the VJP of x, A and dt."""
    if op == "v1":
        args = [a[None].repeat(2, 0) if i not in (1, 4) else a for i, a in enumerate(v1_inputs(seq=20))]
        fn, ref = functools.partial(state_space_v1, cfg=V1_CFG), state_space_v1_reference
    else:
        args = [a[None].repeat(2, 0) if i not in (1, 4) else a for i, a in enumerate(v2_inputs(seq=20, groups=1))]
        fn, ref = functools.partial(state_space_v2, cfg=V2_CFG), state_space_v2_reference
    args[0] = args[0] * jnp.array([1.0, -0.5]).reshape((2,) + (1,) * (args[0].ndim - 1))  # slices differ
    axes = (0, None, 0, 0, None, 0, 0, 0)

    def batched(f):
        return lambda *a: jax.vmap(packed(f), in_axes=axes)(*a)

    check_forward_and_grads(jax.jit(batched(jax.checkpoint(fn))), jax.jit(batched(ref)), args, (0, 1, 5), jnp.float32)


def test_positional_options_conv_state_and_state_dtype():
    """gate / initial_state / conv_state may be positional; conv_state comes back as given; the state keeps
    initial_state's dtype (float32 beside bfloat16 activations), else x's."""
    x, A, B, C, D, dt, gate, h0 = v1_inputs(seq=1, dtype=jnp.bfloat16)
    conv = randn((2, 24, 4), jnp.bfloat16)
    assert state_space_v1(x, A, B, C, D, dt, gate, h0, conv)[2] is conv
    assert state_space_v2(*v2_inputs(seq=1)[:6], conv_state=conv, n_groups=2)[2] is conv
    y, state, _ = jax.jit(state_space_v1)(x, A, B, C, D, dt, gate, h0)
    assert state.dtype == jnp.float32 and y.dtype == jnp.bfloat16
    ref_y, ref_state, _ = state_space_v1_reference(x, A, B, C, D, dt, gate, h0)
    assert_close(y, ref_y)
    assert_close(state, ref_state, tol=1e-5)
    y, state, none = jax.jit(state_space_v1)(x, A, B, C, D, dt)
    assert state.dtype == jnp.bfloat16 and none is None


def test_registry_names_and_direct_calls():
    """Aliases reach the registered implementations, which take only the required tensors."""
    assert kernel_registry.get("mamba1") is kernel_registry.get("state_space_v1")
    assert kernel_registry.get("ssm2") is kernel_registry.get("mamba2") is kernel_registry.get("state_space_v2")
    x, A, B, C, D, dt, _, _ = v1_inputs(seq=1)
    y, state, conv = kernel_registry.get("ssm1")(x, A, B, C, D, dt)
    assert y.shape == x.shape and state.shape == (2, 24, 8) and conv is None
    x, A, B, C, D, dt, _, _ = v2_inputs(seq=1, groups=1)
    y, state, conv = kernel_registry.get("mamba2")(x, A, B, C, D, dt)
    assert y.shape == (2, 1, 32) and state.shape == (2, 4, 8, 16) and conv is None


def test_sharded_channels_and_heads_equal_the_reference():
    """v1 with its channels sharded (slot-form in_specs: None for the gate not passed), v2 with its heads
    sharded and one group of B/C replicated (its gradient sums over the devices); forward and gradients."""
    mesh = jax.make_mesh((8,), ("model",), axis_types=(jax.sharding.AxisType.Auto,))
    ch = P(None, None, "model")
    x, A, B, C, D, dt, _, h0 = v1_inputs(seq=20, channels=16)
    v1_specs = (ch, P("model"), P(), P(), P("model"), ch, None, P(None, "model"))
    v1 = lambda x, A, dt, h0: state_space_v1(
        x, A, B, C, D, dt, None, h0, cfg=V1_CFG, mesh=mesh, in_specs=v1_specs, out_specs=(ch, P(None, "model"))
    )
    v1_ref = lambda x, A, dt, h0: state_space_v1_reference(x, A, B, C, D, dt, None, h0)

    x2, A2, B2, C2, D2, dt2, gate2, h02 = v2_inputs(seq=20, heads=8, head_dim=4, groups=1)
    heads = P(None, None, "model")
    v2_specs = (P(None, None, "model", None), P("model"), P(), P(), P("model"), heads, heads, P(None, "model"))
    v2 = lambda x, A, B, dt, h0: state_space_v2(
        x, A, B, C2, D2, dt, gate2, h0, cfg=V2_CFG, mesh=mesh, in_specs=v2_specs, out_specs=(heads, P(None, "model"))
    )
    v2_ref = lambda x, A, B, dt, h0: state_space_v2_reference(x, A, B, C2, D2, dt, gate2, h0)
    check_forward_and_grads(packed(v1), packed(v1_ref), [x, A, dt, h0], (0, 1, 2, 3), jnp.float32)
    check_forward_and_grads(packed(v2), packed(v2_ref), [x2, A2, B2, dt2, h02], (0, 1, 2, 3, 4), jnp.float32)
    # Two groups of B/C split with the heads: each shard holds one group and its heads.
    x3, A3, B3, C3, D3, dt3, _, _ = v2_inputs(seq=8, head_dim=4, gate=False, initial=False)
    hs, two = P(None, None, "model"), jax.make_mesh((2,), ("model",), devices=jax.devices()[:2])
    specs = (hs, P("model"), hs, hs, P("model"), hs)
    y, *_ = state_space_v2(
        x3, A3, B3, C3, D3, dt3, n_groups=2, mesh=two, in_specs=specs, out_specs=(hs, P(None, "model"))
    )
    assert_close(y, state_space_v2_reference(x3, A3, B3, C3, D3, dt3, n_groups=2)[0])


def _v1(**kw):
    x, A, B, C, D, dt, gate, h0 = v1_inputs(batch=1, seq=3, channels=4, state=2)
    args = dict(x=x, A=A, B=B, C=C, D=D, dt=dt, gate=gate, h0=h0) | kw
    return lambda **options: state_space_v1(*args.values(), **options)


def _v2(**kw):
    x, A, B, C, D, dt, gate, h0 = v2_inputs(batch=1, seq=3, heads=4, head_dim=2, groups=2, state=2)
    args = dict(x=x, A=A, B=B, C=C, D=D, dt=dt, gate=gate, h0=h0) | kw
    return lambda **options: state_space_v2(*args.values(), **{"n_groups": 2, **options})


def _mesh():  # made when a case runs: on a one-GPU host the GPU suite only collects this module
    return jax.make_mesh((8,), ("model",))


SEQ_SHARDED = (P(None, "model"), P(), P(None, "model"), P(None, "model"), P(), P(None, "model"), None, None)


@pytest.mark.lowest
@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (_v1(x=jnp.ones((1, 3, 4), jnp.int32)), TypeError, "hidden_states"),
        (_v1(A=jnp.ones((5, 2))), TypeError, "A"),
        (_v1(dt=jnp.ones((1, 3, 5))), TypeError, "dt"),
        (_v1(h0=jnp.ones((1, 4, 3))), TypeError, "initial_state"),
        (_v1(gate=jnp.ones((1, 3, 4), jnp.int8)), TypeError, "gate"),
        (lambda: _v1()(act_fn="silu"), TypeError, "act_fn"),
        (lambda: state_space_v1(*v1_inputs(batch=1, seq=3)[:6], None, None, jnp.ones((2, 4))), ValueError, "conv"),
        (lambda: _v1()(platform="tpu"), ValueError, "platform"),
        (lambda: _v1()(cfg=StateSpaceV2Config()), TypeError, "StateSpaceV1Config"),
        (lambda: StateSpaceV1Config(chunk_size=12), ValueError, "chunk_size"),
        (_v2(B=jnp.ones((1, 3, 3, 2)), C=jnp.ones((1, 3, 3, 2))), ValueError, "n_groups"),
        (_v2(D=jnp.ones((3,))), TypeError, "D"),
        (_v2(gate=jnp.ones((1, 3, 7))), ValueError, "gate"),
        (lambda: _v2()(n_groups=3), ValueError, "n_groups"),
        (lambda: _v2(gate=None)(use_gated_rmsnorm=True), ValueError, "gate"),
        (lambda: _v2()(rmsnorm_eps=-1.0), ValueError, "rmsnorm_eps"),
        (lambda: _v2()(precision="fast"), ValueError, "precision"),
        (lambda: _v1()(mesh=_mesh(), in_specs=SEQ_SHARDED, out_specs=(P(), P())), ValueError, "sequence"),
        (lambda: _v1()(mesh=_mesh(), in_specs=(P(),) * 5, out_specs=(P(), P())), ValueError, "in_specs"),
        (lambda: _v1()(mesh=_mesh(), in_specs=(P(),) * 8, out_specs=P()), ValueError, "out_specs"),
        (lambda: _v1()(mesh=_mesh()), ValueError, "together"),
        (
            lambda: _v2()(mesh=_mesh(), in_specs=(P(None, None, None, "model"),) + (P(),) * 7, out_specs=(P(), P())),
            ValueError,
            "head_dim",
        ),
        (
            lambda: _v2()(
                use_gated_rmsnorm=True,
                mesh=_mesh(),
                in_specs=(P(None, None, "model"),) + (P(),) * 7,
                out_specs=(P(), P()),
            ),
            ValueError,
            "rmsnorm",
        ),
        (
            lambda: _v2()(mesh=_mesh(), in_specs=(P(None, None, "model"),) + (P(),) * 7, out_specs=(P(), P())),
            ValueError,
            "groups",
        ),
    ],
)
def test_bad_input_names_the_argument(call, error, words):
    with pytest.raises(error, match=words):
        call()


def test_nonfinite_free_extremes():
    """Strong decays (dt · |A| in the hundreds) and tiny ones stay finite through the chunked forms."""
    x, A, B, C, D, dt, gate, h0 = v1_inputs(seq=20)
    dt = dt.at[:, 5:9].set(300.0).at[:, 12:].set(1e-6)
    y, state, _ = state_space_v1(x, A, B, C, D, dt, gate, h0, cfg=V1_CFG)
    assert_close(y, state_space_v1_reference(x, A, B, C, D, dt, gate, h0)[0])
    assert np.isfinite(np.asarray(state)).all()
