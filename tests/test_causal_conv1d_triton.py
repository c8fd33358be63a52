"""causal_conv1d's Pallas-Triton implementation: interpret mode against the reference (tiles of 8 tokens x 16 channels,
so 20 channels leave a partial tile), forward and every gradient (the backward kernel on calls without a state,
dense or packed, else the plain-JAX forward's VJP; a shared slot's gradient follows the kernels' last writer), dense and
packed over a state pool of width W - 1 or W; the pool's rules (empty sequences, padding tokens, a shared slot, a
slot outside the pool, donation); each forward design (the sliding window, at two step sizes and prefetching, and
the shifted tiles) on runs inside one sequence and runs that cross bounds; lowering for CUDA on this host; and the
GPU suite against the XLA implementation at realistic shapes."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import pytest

from ejkernel import kernel_registry
from ejkernel.kernels._triton.causal_conv1d import causal_conv1d_triton
from ejkernel.kernels._triton.causal_conv1d._interface import forward_tiling
from ejkernel.modules import CausalConv1dConfig, CausalConv1dTritonTiling, causal_conv1d
from ejkernel.ops import BwdParams, FwdParams
from ejkernel.reference.causal_conv1d import causal_conv1d_reference
from harness import assert_close, check_forward_and_grads, randn

C = 20
SMALL = CausalConv1dConfig(fwd_params=FwdParams(block_k=8, block_d=16))
TRITON = functools.partial(causal_conv1d_triton, cfg=SMALL, interpret=True)
DESIGNS = {
    "window": CausalConv1dTritonTiling(forward="window"),
    "window by 1 row": CausalConv1dTritonTiling(forward="window", step_rows=1),
    "window prefetching": CausalConv1dTritonTiling(forward="window", prefetch=True),
    "shifted": CausalConv1dTritonTiling(forward="shifted"),
}
"""The forward's designs (`CausalConv1dTritonTiling`), each a parametrisation of `test_forward_designs`."""


def _flat(result):
    """One array of every float output, so that one cotangent checks every gradient path."""
    return jnp.concatenate([leaf.ravel().astype(jnp.float32) for leaf in jax.tree_util.tree_leaves(result)])


def _check(args, dtype=jnp.float32, activation="silu", cu_seqlens=None, state_indices=None, cfg=SMALL):
    """The kernels and the reference on `(x, weight, bias, conv_state)`: outputs and every gradient."""
    packing = dict(cu_seqlens=cu_seqlens, state_indices=state_indices)
    triton = functools.partial(causal_conv1d_triton, cfg=cfg, interpret=True)
    ours = jax.jit(lambda x, w, b, s: _flat(triton(x, w, b, s, activation=activation, **packing)))
    ref = jax.jit(
        lambda x, w, b, s: _flat(causal_conv1d_reference(x, w, b, activation=activation, conv_state=s, **packing))
    )
    argnums = tuple(i for i, a in enumerate(args) if a is not None)
    check_forward_and_grads(ours, ref, list(args), argnums, dtype)


@pytest.mark.parametrize(
    ("bias", "activation", "state_width"), [(True, "silu", 0), (False, None, -1), (True, None, None)]
)
def test_dense_matches_reference(bias, activation, state_width):
    """Rows of 11 tokens: tiles that cross rows; the state's history, of width W or W - 1, or zeros."""
    x, weight = randn((2, 11, C)), randn((C, 4))
    state = None if state_width is None else randn((2, C, 4 + state_width))
    _check((x, weight, randn((C,)) if bias else None, state), activation=activation)


@pytest.mark.parametrize(("bias", "activation", "width"), [(True, "silu", 4), (False, None, 2)])
def test_dense_backward_kernel(bias, activation, width):
    """Sequences of 48 tokens without a state: the backward kernel, in runs of 16 (three a sequence, each reading
    its neighbours' rows) and two channel tiles (the second partial), every gradient against the reference."""
    cfg = dataclasses.replace(SMALL, bwd_params=BwdParams(block_k=16, block_d=16))
    x, weight = randn((2, 48, C)), randn((C, width))
    _check((x, weight, randn((C,)) if bias else None, None), activation=activation, cfg=cfg)


def test_packed_backward_kernel():
    """Packed sequences without a state: the backward kernel in runs of 16, one inside a sequence (the stepped walk),
    the others row by row across bounds, an empty sequence and padding tokens; every gradient against the
    reference."""
    cfg = dataclasses.replace(SMALL, bwd_params=BwdParams(block_k=16, block_d=16))
    cu = jnp.array([0, 5, 5, 37, 44], jnp.int32)
    _check((randn((64, C)), randn((C, 3)), randn((C,)), None), cu_seqlens=cu, cfg=cfg)


@pytest.mark.parametrize("state_width", [None, -1, 0])
def test_packed_matches_reference(state_width):
    """Prefill, decode (one token), empty and shorter-than-the-window sequences, padding tokens, unused slots;
    with a pool, two non-empty sequences on one slot (each reads the old state, the last writes it)."""
    cu = jnp.array([0, 7, 8, 8, 10, 17], jnp.int32)  # lengths 7, 1, 0, 2, 7; tokens 17-19 are padding
    state = None if state_width is None else randn((7, C, 4 + state_width))
    slots = None if state is None else jnp.array([5, 0, 3, 2, 5], jnp.int32)
    _check((randn((20, C)), randn((C, 4)), randn((C,)), state), cu_seqlens=cu, state_indices=slots)


@pytest.mark.parametrize("design", DESIGNS)
def test_forward_designs(design):
    """Runs of 8 tokens: a dense batch of 16-token rows (every run inside one row: the window's unmasked walk,
    its carry from the history at a row's start and from x after), then packed sequences on a pool: runs inside
    one sequence, a run crossing a 1-token, an empty and a 2-token sequence (shorter than W), a partial last
    run of padding tokens."""
    cfg = dataclasses.replace(SMALL, triton_tiling=DESIGNS[design])
    dense = (randn((2, 16, C)), randn((C, 4)), randn((C,)), randn((2, C, 3)))
    _check(dense, cfg=cfg)
    cu = jnp.array([0, 16, 17, 17, 19, 24, 40], jnp.int32)
    packed = (randn((44, C)), randn((C, 4)), None, randn((7, C, 4)))
    _check(packed, activation=None, cu_seqlens=cu, state_indices=jnp.array([4, 0, 1, 6, 2, 3], jnp.int32), cfg=cfg)


def test_decode_batch_runs_a_program_a_token():
    """The window's default run follows the sequences' mean length: a decode batch (a token a sequence) gets
    1-token runs, each inside its sequence, long sequences 64; a decode step on a pool against the reference."""
    assert forward_tiling(None, 6, C, 6).block_t == 1
    assert forward_tiling(None, 16384, 8192, 8).block_t == 64
    cu, slots = jnp.arange(7, dtype=jnp.int32), jnp.array([3, 0, 5, 1, 2, 4], jnp.int32)
    _check((randn((6, C)), randn((C, 4)), randn((C,)), randn((6, C, 3))), cu_seqlens=cu, state_indices=slots, cfg=None)


def test_bfloat16_and_width_two():
    x, weight, b, state = (randn(s, jnp.bfloat16) for s in ((2, 9, C), (C, 2), (C,), (2, C, 1)))
    _check((x, weight, b, state), jnp.bfloat16)


def test_pool_rules_under_jit_and_donation():
    """A traced slot outside the pool reads zeros and writes nothing; empty sequences and unnamed slots keep
    their state; the donated pool is the result's buffer."""
    pool, x, weight = randn((4, C, 3)), randn((9, C)), randn((C, 4))
    cu, slots = jnp.array([0, 2, 2, 5], jnp.int32), jnp.array([7, 3, 1], jnp.int32)
    expected_out, expected_pool = causal_conv1d_reference(
        x, weight, cu_seqlens=cu, conv_state=pool, state_indices=[0, 3, 1]
    )
    expected_out = expected_out.at[:2].set(causal_conv1d_reference(x[:2], weight, cu_seqlens=[0, 2]))  # from zeros
    expected_pool = expected_pool.at[0].set(pool[0])  # slot 7 is outside: slot 0 keeps its state
    step = jax.jit(lambda x, pool, slots: TRITON(x, weight, None, pool, cu, slots), donate_argnums=1)
    out, new = step(x, pool, slots)
    assert pool.is_deleted()
    assert_close(out, expected_out)
    assert_close(new, expected_pool)


def test_declines_what_it_does_not_serve():
    x = randn((9, C))
    with pytest.raises(NotImplementedError, match="at most 8 taps"):
        TRITON(x, randn((C, 9)), cu_seqlens=jnp.array([0, 9], jnp.int32))
    with pytest.raises(NotImplementedError, match="at least one sequence"):
        TRITON(x, randn((C, 4)), cu_seqlens=jnp.array([0], jnp.int32))
    with pytest.raises(NotImplementedError, match="state pool with slots"):
        TRITON(x, randn((C, 4)), None, randn((0, C, 3)), jnp.array([0, 9], jnp.int32), jnp.array([0], jnp.int32))


@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")
def test_kernels_lower_for_cuda(cuda_lowering):
    """The forward (both designs) and state-write kernels lower to Triton IR for an H100 without a GPU, with
    their plain-JAX backward: packed on a pool with a shared slot (the last-writer search), ragged channels (a
    partial tile), a decode step and a dense batch."""
    ours = functools.partial(causal_conv1d_triton, interpret=False)
    lowered = lambda fn, *args: jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    names = lambda text: {n for n in ("window", "fwd", "state", "backward") if f"ejkernel_causal_conv1d_{n}" in text}
    x, weight, b, pool = (randn(s, jnp.bfloat16) for s in ((100, 1000), (1000, 4), (1000,), (9, 1000, 3)))
    cu, slots = jnp.array([0, 30, 30, 99], jnp.int32), jnp.array([3, 1, 3], jnp.int32)

    def train(x, weight, b, pool):
        call = lambda *a: ours(*a, cu, slots, activation="silu")
        out, pullback = jax.vjp(call, x, weight, b, pool)
        return out, pullback(jax.tree_util.tree_map(jnp.ones_like, out))

    text = lowered(train, x, weight, b, pool)
    assert names(text) == {"window", "state"} and "tanh.approx.f32" in text  # 16-bit SiLU: the hardware's tanh
    one_each = jnp.arange(10, dtype=jnp.int32)  # a decode step: 1-token runs
    decode = lambda x, pool: ours(x, weight, b, pool, one_each, one_each[:9])
    assert names(lowered(decode, x[:9], pool)) == {"window", "state"}
    # With the value: a gradient alone needs no forward kernel (the backward recomputes from the inputs), and
    # newer JAX drops the unused forward. A dense batch without a state: the backward kernel.
    dense = jax.value_and_grad(lambda x, w: ours(x, w).astype(jnp.float32).sum(), (0, 1))
    text = lowered(dense, randn((2, 64, 1024), jnp.bfloat16), randn((1024, 4), jnp.bfloat16))
    assert names(text) == {"window", "backward"}
    packed_grad = jax.value_and_grad(
        lambda x: ours(x, weight, b, None, cu, activation="silu").astype(jnp.float32).sum()
    )
    assert names(lowered(packed_grad, x)) == {"window", "backward"}  # runs inside a sequence, and across bounds
    shifted = CausalConv1dConfig(triton_tiling=CausalConv1dTritonTiling(forward="shifted"))
    packed = lambda x, w, b, pool: ours(x, w, b, pool, cu, slots, cfg=shifted)
    assert names(lowered(packed, x, weight, b, pool)) == {"fwd", "state"}
    prefetching = CausalConv1dConfig(triton_tiling=CausalConv1dTritonTiling(prefetch=True))
    dense_args = randn((2, 64, 1024), jnp.bfloat16), randn((1024, 4), jnp.bfloat16)
    assert names(lowered(lambda x, w: ours(x, w, cfg=prefetching), *dense_args)) == {"window"}


def _inputs(dtype, tokens, channels, slots, state_width):
    x, weight, b = randn((tokens, channels), dtype), randn((channels, 4), dtype), randn((channels,), dtype)
    return x, weight, b, randn((slots, channels, state_width), dtype)


@pytest.mark.gpu
def test_gpu_packed_backward_matches_xla():
    """Packed training without a state (the backward kernel: runs inside a sequence and across bounds, an empty
    sequence, padding tokens): every gradient against XLA's."""
    lengths = [1000, 1, 0, 517, 2048, 3]
    cu = jnp.cumsum(jnp.array([0, *lengths], jnp.int32))
    x, weight, b, _ = _inputs(jnp.bfloat16, 3600, 4096, 1, 3)
    call = lambda platform: jax.jit(
        lambda x, w, b: causal_conv1d(x, w, b, activation="silu", cu_seqlens=cu, platform=platform)
    )
    check_forward_and_grads(call("triton"), call("xla"), [x, weight, b], (0, 1, 2), jnp.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("state_width", [3, 4])
def test_gpu_packed_matches_xla(state_width):
    """A serving batch on a pool: long prefills, decode steps, an empty sequence, a slot outside the pool
    (under jit), padding tokens; forward (outputs and pool) and every gradient against XLA's."""
    lengths = [1000, 1, 1, 0, 517, 1, 2048, 3]
    cu = jnp.cumsum(jnp.array([0, *lengths], jnp.int32))
    slots = jnp.array([5, 0, 99, 7, 1, 2, 3, 4], jnp.int32)
    x, weight, b, pool = _inputs(jnp.bfloat16, 3600, 4096, 8, state_width)
    call = lambda platform: jax.jit(
        lambda x, w, b, pool, cu, slots: _flat(
            causal_conv1d(
                x, w, b, activation="silu", cu_seqlens=cu, conv_state=pool, state_indices=slots, platform=platform
            )
        )
    )
    ours, xla = call("triton"), call("xla")
    check_forward_and_grads(
        lambda *a: ours(*a, cu, slots), lambda *a: xla(*a, cu, slots), [x, weight, b, pool], (0, 1, 2, 3), jnp.bfloat16
    )


@pytest.mark.gpu
@pytest.mark.parametrize(("activation", "state"), [("silu", True), (None, False)])
def test_gpu_dense_matches_xla_and_auto_takes_triton(activation, state):
    """Triton is first on the GPU: its forward beat XLA's on an H200 (`IMPLEMENTATIONS`)."""
    assert kernel_registry.get("causal_conv1d") is causal_conv1d_triton
    x, weight, b = randn((4, 2048, 2048), jnp.bfloat16), randn((2048, 4), jnp.bfloat16), randn((2048,), jnp.bfloat16)
    initial = randn((4, 2048, 3), jnp.bfloat16) if state else None
    call = lambda platform: jax.jit(
        lambda x, w, b, s: _flat(causal_conv1d(x, w, b, activation=activation, conv_state=s, platform=platform))
    )
    args = [x, weight, b, initial]
    argnums = (0, 1, 2, 3) if state else (0, 1, 2)
    check_forward_and_grads(call("triton"), call("xla"), args, argnums, jnp.bfloat16)


@pytest.mark.gpu
def test_gpu_decode_steps_on_a_donated_pool_continue_a_prefill():
    """Prefill then decode steps, the pool donated each step and updated in its own buffer, equal one long call
    (Triton against XLA)."""
    x, weight, b, pool = _inputs(jnp.float32, 8 * 40, 1024, 16, 3)
    x = x.reshape(8, 40, 1024)
    slots = jnp.array([9, 3, 15, 0, 7, 1, 12, 4], jnp.int32)
    step = jax.jit(
        lambda x, cu, pool: causal_conv1d(
            x, weight, b, activation="silu", cu_seqlens=cu, conv_state=pool, state_indices=slots, platform="triton"
        ),
        donate_argnums=2,
    )
    full = causal_conv1d(x, weight, b, activation="silu", conv_state=pool[slots], platform="xla")
    state, outs = pool, []
    out, state = step(x[:, :32].reshape(256, 1024), jnp.arange(9, dtype=jnp.int32) * 32, state)
    outs.append(out.reshape(8, 32, 1024))
    for t in range(32, 40):
        buffer = state.unsafe_buffer_pointer()
        out, state = step(x[:, t], jnp.arange(9, dtype=jnp.int32), state)
        assert state.unsafe_buffer_pointer() == buffer  # updated in place: no copy of the pool
        outs.append(out[:, None])
    assert_close(jnp.concatenate(outs, axis=1), full[0])
    assert_close(state[slots], full[1])


@pytest.mark.gpu
@pytest.mark.parametrize("design", DESIGNS)
def test_gpu_forward_designs_match_xla(design):
    """Each forward design compiled, against XLA's: a dense batch with a state (SiLU, bias), and a serving batch
    on a pool (prefills, decode steps, an empty sequence, sequences shorter than W, padding tokens)."""
    cfg = CausalConv1dConfig(triton_tiling=DESIGNS[design])
    x, weight, b, pool = _inputs(jnp.bfloat16, 3600, 4096, 8, 3)
    dense = lambda platform: jax.jit(
        lambda x, s: causal_conv1d(x, weight, b, activation="silu", conv_state=s, platform=platform, cfg=cfg)
    )
    dense_x, initial = x[:3584].reshape(2, 1792, 4096), pool[:2]
    for ours, theirs in zip(dense("triton")(dense_x, initial), dense("xla")(dense_x, initial), strict=True):
        assert_close(ours, theirs, jnp.bfloat16)
    cu = jnp.cumsum(jnp.array([0, 1000, 1, 2, 0, 517, 1, 2047, 3], jnp.int32))
    slots = jnp.array([5, 0, 1, 7, 2, 3, 4, 6], jnp.int32)
    packed = lambda platform: jax.jit(
        lambda x, pool: causal_conv1d(
            x, weight, cu_seqlens=cu, conv_state=pool, state_indices=slots, platform=platform, cfg=cfg
        )
    )
    for ours, theirs in zip(packed("triton")(x, pool), packed("xla")(x, pool), strict=True):
        assert_close(ours, theirs, jnp.bfloat16)
