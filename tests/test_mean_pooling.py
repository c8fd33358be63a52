"""mean_pooling: every implementation against the reference, packed mode, sharding, errors."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from ejkernel.kernels._triton.mean_pooling._interface import mean_pooling_triton
from ejkernel.kernels._xla.mean_pooling._interface import mean_pooling_xla
from ejkernel.modules import MeanPoolingConfig, mean_pooling
from ejkernel.ops import FwdParams
from ejkernel.reference.mean_pooling import mean_pooling_reference
from harness import assert_close, check_forward_and_grads, randn

SMALL_TILES = MeanPoolingConfig(fwd_params=FwdParams(block_k=8, block_d=32))
IMPLEMENTATIONS = {"xla": mean_pooling_xla, "triton": functools.partial(mean_pooling_triton, interpret=True)}


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize(  # last: split rows
    ("shape", "dtype"),
    [
        ((3, 37, 70), jnp.float32),
        ((2, 1, 16), jnp.bfloat16),
        ((2, 19, 3, 24), jnp.float32),
        ((2, 101, 16), jnp.bfloat16),
    ],
)
def test_dense_matches_reference(impl, dtype, shape):
    fn = lambda x: IMPLEMENTATIONS[impl](x, cfg=SMALL_TILES)
    check_forward_and_grads(fn, mean_pooling_reference, [randn(shape, dtype)], argnums=(0,), dtype=dtype)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("lengths", [[5, 0, 35, 71], [1], [3, 150, 40]])
def test_packed_matches_reference(impl, lengths):
    cu = jnp.asarray(np.concatenate([[0], np.cumsum(lengths)]), jnp.int32)
    x = randn((int(cu[-1]), 2, 21))
    fn = lambda x: IMPLEMENTATIONS[impl](x, cu, cfg=SMALL_TILES)
    check_forward_and_grads(fn, lambda x: mean_pooling_reference(x, cu), [x], argnums=(0,), dtype=jnp.float32)


def test_empty_sequence_gives_zeros():
    cu = jnp.array([0, 4, 4, 9], jnp.int32)
    out = mean_pooling(randn((9, 8)), cu)
    assert out.shape == (3, 8)
    assert bool(jnp.all(out[1] == 0))
    empty = mean_pooling(randn((2, 0, 8)))  # no tokens at all: zeros, not 0 / 0
    assert empty.shape == (2, 8) and bool(jnp.all(empty == 0))


@pytest.mark.lowest
def test_public_function_under_jit_vmap_and_checkpoint():
    x = randn((2, 3, 17, 8))
    expected = jax.vmap(mean_pooling_reference)(x)
    assert_close(jax.jit(jax.vmap(mean_pooling))(x), expected)
    grad = jax.grad(lambda x: jnp.sum(jax.checkpoint(mean_pooling)(x) ** 2))(x[0])
    ref_grad = jax.grad(lambda x: jnp.sum(mean_pooling_reference(x) ** 2))(x[0])
    assert_close(grad, ref_grad)


@pytest.mark.lowest
def test_sharded_over_batch_equals_unsharded():
    mesh = jax.make_mesh((8,), ("data",))
    x = randn((16, 33, 12))
    out = mean_pooling(x, mesh=mesh, in_specs=(P("data"),), out_specs=P("data"))
    assert_close(out, mean_pooling(x))
    with jax.set_mesh(mesh):  # reductions of explicitly sharded results need the mesh in context
        grad = jax.grad(lambda x: jnp.sum(mean_pooling(x, mesh=mesh, in_specs=(P("data"),), out_specs=P("data")) ** 3))(
            x
        )
    assert_close(grad, jax.grad(lambda x: jnp.sum(mean_pooling_reference(x) ** 3))(x))


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda: mean_pooling(jnp.ones((2, 3), jnp.int32)), Exception, "x"),
        (lambda: mean_pooling(jnp.ones((2, 3))), ValueError, "x must have layout"),
        (lambda: mean_pooling(jnp.ones((4, 3)), jnp.array([0.0, 4.0])), Exception, "cu_seqlens"),
        (lambda: mean_pooling(jnp.ones((4, 3)), jnp.array([4], jnp.int32)), ValueError, "cu_seqlens"),
        (
            lambda: mean_pooling(jnp.ones((4, 3)), jnp.array([0, 3, 9], jnp.int32)),
            ValueError,
            r"cu_seqlens\[2\] = 9 is outside",
        ),
        (
            lambda: mean_pooling(jnp.ones((4, 3)), jnp.array([0, 3, 2], jnp.int32)),
            ValueError,
            r"cu_seqlens\[2\] = 2 is outside its range: bounds rising from 0",
        ),
        (lambda: mean_pooling(jnp.ones((2, 4, 3)), chunk_size=3), ValueError, "chunk_size"),
        (lambda: mean_pooling(jnp.ones((2, 4, 3)), platform="cuda"), ValueError, "mean_pooling"),
        (lambda: mean_pooling(jnp.ones((2, 4, 3)), platform="tpu"), ValueError, "platform"),
    ],
)
def test_bad_input_names_the_argument(call, error, words):
    with pytest.raises(error, match=words):
        call()


@pytest.mark.gpu
@pytest.mark.parametrize("packed", [False, True])
def test_gpu_triton_matches_xla(packed):
    x = randn((8, 1000, 1000), jnp.bfloat16)
    cu = jnp.array([0, 1, 700, 700, 5000, 8000], jnp.int32) if packed else None
    x = x.reshape(8000, 1000) if packed else x
    expected = mean_pooling(x, cu, platform="xla")
    assert_close(mean_pooling(x, cu, platform="triton"), expected)
    g = randn(expected.shape, jnp.bfloat16)
    grad = jax.grad(lambda x: jnp.vdot(mean_pooling(x, cu, platform="triton"), g).real)(x)
    assert_close(grad, jax.grad(lambda x: jnp.vdot(mean_pooling(x, cu, platform="xla"), g).real)(x))


def test_packed_mode_shards_features_and_refuses_split_tokens():
    mesh = jax.make_mesh((8,), ("model",))
    cu = jnp.array([0, 5, 5, 40], jnp.int32)
    x = randn((40, 16))
    out = mean_pooling(x, cu, mesh=mesh, in_specs=(P(None, "model"), P()), out_specs=P(None, "model"))
    assert_close(out, mean_pooling_reference(x, cu))
    with pytest.raises(ValueError, match=r"x's axis 0 \(tokens\)"):
        mean_pooling(x, cu, mesh=mesh, in_specs=(P("model"), P()), out_specs=P("model"))
