"""Pallas-Triton state-space kernels: interpret mode against the references (few grid steps), lowering
for CUDA on this host, and the GPU suite against the XLA implementations at realistic shapes."""

import functools

import jax
import jax.numpy as jnp
import pytest
from state_space_cases import check_scan, packed, v1_inputs, v2_inputs

from ejkernel import kernel_registry
from ejkernel.kernels._triton.state_space_v1._interface import state_space_v1_triton
from ejkernel.kernels._triton.state_space_v2 import _interface as v2_triton
from ejkernel.kernels._triton.state_space_v2._interface import state_space_v2_triton
from ejkernel.kernels._xla.state_space_v1._interface import state_space_v1_xla
from ejkernel.kernels._xla.state_space_v2._interface import state_space_v2_xla
from ejkernel.modules import StateSpaceV1Config, StateSpaceV2Config, state_space_v1, state_space_v2
from ejkernel.ops import FwdParams
from ejkernel.reference.state_space import state_space_v1_reference, state_space_v2_reference
from harness import assert_close, check_forward_and_grads, highest

# 16-token chunks of two 8-token sub-chunks, 16-channel blocks: 24 channels pad to 32, N = 6 pads to 8,
# 37 tokens to 48: a grid of 2 x 3 programs per batch row.
SMALL = StateSpaceV1Config(chunk_size=16, fwd_params=FwdParams(block_d=16))


def test_v1_interpret_matches_reference():
    args = v1_inputs(batch=1, seq=37, channels=24, state=6)
    fn = functools.partial(state_space_v1_triton, cfg=SMALL, interpret=True)
    check_scan(fn, state_space_v1_reference, args)


def test_v1_decode_step_kernel_interpret():
    """A one-token call through the decode kernel (32 channels: one program per batch row), and one whose
    channels would need padding (24: the plain-JAX step), forward and every gradient."""
    for channels in (32, 24):
        args = v1_inputs(batch=2, seq=1, channels=channels, state=8)
        check_scan(functools.partial(state_space_v1_triton, interpret=True), state_space_v1_reference, args)


@pytest.mark.parametrize(
    ("seq", "heads", "head_dim", "groups", "state", "chunk", "gate"),
    [(40, 2, 8, 1, 6, 16, True), (128, 4, 16, 2, 32, None, False)],
    ids=["padded", "finished-in-kernels (two groups)"],
)
def test_v2_interpret_matches_reference(seq, heads, head_dim, groups, state, chunk, gate):
    """The GLA kernels against the reference: y, the final state and every gradient of a differentiated
    call, and a plain call's y and state. Dims the kernels take padded (P = 8 and N = 6 to 16), 40 tokens with
    `chunk_size` 16 capping both chunks (the last partial); and two groups of two heads without a gate, P = 16,
    N = 32, 128 tokens at the default chunks: the plain call's kernels take dt into the values and add the D
    skip."""
    shape = dict(seq=seq, heads=heads, head_dim=head_dim, groups=groups, state=state, gate=gate)
    args = v2_inputs(batch=2 if groups == 1 else 1, **shape)
    cfg = StateSpaceV2Config(chunk_size=chunk)
    fn = functools.partial(state_space_v2_triton, n_groups=groups, cfg=cfg, interpret=True)
    reference = functools.partial(state_space_v2_reference, n_groups=groups)
    check_scan(fn, reference, args)
    assert_close(jax.jit(packed(fn))(*args), packed(reference)(*args), jnp.float32)


def test_v2_chunks():
    """Plain calls take 64-token chunks and differentiated ones 32, each capped by `chunk_size`."""
    expected = {None: (64, 32), 256: (64, 32), 64: (64, 32), 32: (32, 32), 16: (16, 16)}
    assert {size: v2_triton.chunks(StateSpaceV2Config(chunk_size=size)) for size in expected} == expected
    assert v2_triton.chunks(None) == (64, 32)


@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")
@pytest.mark.parametrize("op", ["v1", "v2"])
def test_kernels_lower_for_cuda(cuda_lowering, monkeypatch, op):
    """The kernels lower to Triton IR for an H100 (compute capability 9.0) without a GPU: v1's forward and
    backward; v2's on the GLA kernels (q and k read per group): a plain call's forward kernels at chunk 64,
    a differentiated call's forward and backward kernels at chunk 32. The plain forward makes the scores in
    its output kernel (`head_outputs`; without a gate also taking dt and the D skip), the differentiated one
    writes them for the backward (`scores`)."""
    lowered = lambda fn, *args: jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    train = lambda fn: lambda *a: (lambda out, pullback: pullback(jnp.ones_like(out)))(*jax.vjp(fn, *a))
    if op == "v1":
        args = v1_inputs(batch=2, seq=256, channels=64, state=16, dtype=jnp.bfloat16)
        forward = packed(functools.partial(state_space_v1_triton, interpret=False))
        step_args = [None if a is None else a[:, :1] if a.ndim == 3 and a.shape[1] == 256 else a for a in args]
        assert "ejkernel_ssm1_decode_step" in lowered(forward, *step_args)
        text = lowered(train(forward), *args)
        assert all(f"ejkernel_ssm1_{name}" in text for name in ("chunk_ends", "chunk_outputs", "chunk_grads"))
        return
    # 16 heads per group: two spans of 8 in the gradient kernel (dB, dC summed in it, then over the spans)
    args = v2_inputs(batch=1, seq=256, heads=32, head_dim=64, groups=2, state=128, dtype=jnp.bfloat16)
    v2 = lambda: packed(functools.partial(state_space_v2_triton, n_groups=2, interpret=False))  # (jit caches by fn)
    chunks = []
    scan = v2_triton.gla_scan
    monkeypatch.setattr(v2_triton, "gla_scan", lambda chunk, *a: chunks.append(chunk) or scan(chunk, *a))
    plain = [f"ejkernel_gla_{name}" for name in ("cumulative", "states", "head_outputs")]
    forward = [f"ejkernel_gla_{name}" for name in ("cumulative", "states", "scores", "outputs")]
    backward = ["ejkernel_gla_state_grads", "ejkernel_gla_grads"]
    text = lowered(v2(), *args)
    assert all(name in text for name in plain) and not any(name in text for name in ["ejkernel_gla_scores", *backward])
    assert chunks == [64]
    no_gate = [None if i == 6 else a for i, a in enumerate(args)]  # dt and the D skip taken in the kernels
    text = lowered(v2(), *no_gate)
    assert all(name in text for name in plain) and not any(name in text for name in ["ejkernel_gla_scores", *backward])
    text = lowered(train(v2()), *args)
    assert all(name in text for name in forward + backward)
    assert chunks == [64, 32]  # the differentiated call traced only the chunk-32 kernels


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("cfg", "initial"),
    [(None, True), (StateSpaceV1Config(chunk_size=128, fwd_params=FwdParams(block_d=64, num_warps=8)), False)],
)
def test_gpu_v1_triton_matches_xla(cfg, initial):
    args = v1_inputs(batch=2, seq=2000, channels=1024, state=16, dtype=jnp.bfloat16, initial=initial)
    triton = functools.partial(state_space_v1, platform="triton", cfg=cfg)
    xla = functools.partial(state_space_v1_xla, cfg=StateSpaceV1Config(chunk_size=64))
    argnums = tuple(i for i, a in enumerate(args) if a is not None)
    check_forward_and_grads(jax.jit(packed(triton)), jax.jit(packed(xla)), list(args), argnums, jnp.bfloat16)


@pytest.mark.gpu
def test_gpu_v1_decode_step_and_auto_platform():
    """A one-token call continues a prefix exactly; `platform="auto"` takes the Triton kernels."""
    assert kernel_registry.get("state_space_v1") is state_space_v1_triton
    x, A, B, C, D, dt, gate, h0 = v1_inputs(batch=64, seq=257, channels=2048, state=16)
    y, state, _ = state_space_v1(x, A, B, C, D, dt, gate, h0)
    y1, state1, _ = state_space_v1(x[:, :256], A, B[:, :256], C[:, :256], D, dt[:, :256], gate[:, :256], h0)
    last = slice(256, 257)
    y2, state2, _ = state_space_v1(x[:, last], A, B[:, last], C[:, last], D, dt[:, last], gate[:, last], state1)
    ref_y, ref_state, _ = state_space_v1_xla(x, A, B, C, D, dt, gate, h0)
    check = lambda a, b: float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))
    assert check(jnp.concatenate([y1, y2], axis=1), ref_y) < 1e-4 and check(state2, ref_state) < 1e-4
    assert check(y, ref_y) < 1e-4 and check(state, ref_state) < 1e-4


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("groups", "dtype", "cfg"),
    [
        (1, jnp.bfloat16, None),
        (4, jnp.bfloat16, StateSpaceV2Config(chunk_size=32)),
        (2, jnp.float32, StateSpaceV2Config(chunk_size=256)),
    ],
)
def test_gpu_v2_triton_matches_xla(groups, dtype, cfg):
    """The GLA kernels: a differentiated call's forward and every gradient, and a plain call's forward. The
    chunks: by default 64 plain and 32 differentiated; capped at 32 for both (one set of kernels; two heads
    per group summed in the gradient kernel); the bench's `chunk_size` 256 (the defaults again, in float32:
    float32 products in full precision)."""
    args = v2_inputs(batch=2, seq=2000, heads=8, head_dim=64, groups=groups, state=128, dtype=dtype)
    triton = functools.partial(state_space_v2, n_groups=groups, platform="triton", cfg=cfg)
    # The float32 oracle is the step-by-step reference at full precision (on an H100 the Triton forward
    # and XLA at precision="highest" both came within 5e-7 of it). dA sums 2000 tokens' terms that cancel
    # to a thousandth of their size: float32 rounding alone leaves it about 1e-3 apart.
    oracle = state_space_v2_reference if dtype == jnp.float32 else state_space_v2_xla
    xla = highest(functools.partial(oracle, n_groups=groups))
    argnums = tuple(i for i, a in enumerate(args) if a is not None)
    grad_tol = 3e-3 if dtype == jnp.float32 else None
    check_forward_and_grads(jax.jit(packed(triton)), jax.jit(packed(xla)), list(args), argnums, dtype, None, grad_tol)
    f32 = [None if a is None else a.astype(jnp.float32) for a in args]
    assert_close(jax.jit(packed(triton))(*args), jax.jit(packed(xla))(*f32), dtype)
