"""`ragged_gated_delta_rule` on Mosaic GPU: interpret mode on CPU against the XLA implementation (decode batches with a
reader of a shared slot, an out-of-range slot, both value tiles; request bounds, decode and mixed), declines, CUDA
lowering, GPU suite."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from linear_cases import log_decay, write_strength

from ejkernel.kernels._common.linear_attention.ragged import ragged_delta_rule
from ejkernel.kernels._pallas.gpu.ragged_gated_delta_rule import _interface as mosaic_interface
from ejkernel.kernels._pallas.gpu.ragged_gated_delta_rule import ragged_gated_delta_rule_mosaic_gpu
from ejkernel.kernels._pallas.gpu.ragged_gated_delta_rule._decode import MosaicGpuRaggedDecodeTiling, decode_batch
from ejkernel.kernels._xla.ragged_gated_delta_rule import ragged_gated_delta_rule_xla
from ejkernel.modules import ragged_gated_delta_rule
from harness import assert_close, copies_in, randn
from mosaic_gpu_interpret import interpret_mode

H, DK, DV, SLOTS = 2, 64, 128, 9
SLOT_OF = np.array([1, 3, 8, 3, 12, 0], np.int32)  # request 3 reads request 1's slot; request 4's is outside


def make_inputs(num_tokens, heads=H, slots=SLOTS, dk=DK, dv=DV, dtype=jnp.bfloat16, decay=True):
    return (
        randn((num_tokens, heads, dk), dtype),
        randn((num_tokens, heads, dk), dtype),
        randn((num_tokens, heads, dv), dtype),
        write_strength(num_tokens, heads).astype(dtype),
        log_decay(num_tokens, heads).astype(dtype) if decay else None,
        randn((slots, heads, dk, dv)),
    )


@pytest.mark.parametrize("use_qk_l2norm, decay, pool_dtype", [(True, True, jnp.float32), (False, False, jnp.bfloat16)])
def test_interpret_decode_batch_matches_xla(use_qk_l2norm, decay, pool_dtype):
    inputs = list(make_inputs(len(SLOT_OF), decay=decay))
    inputs[5] = inputs[5].astype(pool_dtype)
    slots = jnp.asarray(SLOT_OF)
    mosaic = functools.partial(ragged_gated_delta_rule_mosaic_gpu, use_qk_l2norm=use_qk_l2norm, interpret=True)
    with interpret_mode():
        out, new_state = jax.block_until_ready(mosaic(*inputs, None, slots))
    xla_out, xla_state = ragged_gated_delta_rule_xla(*inputs, None, slots, use_qk_l2norm=use_qk_l2norm)
    assert out.dtype == inputs[0].dtype and new_state.dtype == pool_dtype
    assert_close(out, xla_out, jnp.bfloat16, name="out")
    assert_close(new_state, xla_state, pool_dtype, name="new_state")


@pytest.mark.parametrize(
    "bounds, path",
    [
        ([0, 1, 1, 2, 3, 4, 5, 6], "decode"),  # an empty request (its slot's old state kept), a padding token after
        ([0, 1, 4, 5, 5, 6, 7, 7], "chunked"),  # a request of three tokens
    ],
)
def test_interpret_request_bounds_match_xla(bounds, path, monkeypatch):
    """The `lax.cond` between the decode kernels on the requests' tokens and the chunked form, run here by XLA (the
    interpreter here runs Mosaic GPU kernels only; Triton's are tested in their own file), or by NaNs where the
    decode kernels must be taken."""

    def chunked(inputs, pool, req, *, chunk_size, use_qk_l2norm, **_):
        args = (*inputs, pool, req.bounds, req.slots)
        out, pool = ragged_delta_rule(*args, chunk_size=chunk_size, use_qk_l2norm=use_qk_l2norm)
        return (out, pool) if path == "chunked" else (out * jnp.nan, pool * jnp.nan)

    monkeypatch.setattr(mosaic_interface, "resolve", lambda target: chunked)
    slots = jnp.asarray([*SLOT_OF, 5])
    inputs = make_inputs(8)
    qsl = jnp.asarray(bounds, jnp.int32)
    with interpret_mode():
        out, new_state = jax.block_until_ready(ragged_gated_delta_rule_mosaic_gpu(*inputs, qsl, slots, interpret=True))
    xla_out, xla_state = ragged_gated_delta_rule_xla(*inputs, qsl, slots)
    assert_close(out, xla_out, jnp.bfloat16, name="out")
    assert_close(new_state, xla_state, name="new_state")


@pytest.mark.parametrize(
    "change, words",
    [
        ({"pool": jnp.float8_e4m3fn}, "float32, bfloat16 or float16 state pool"),
        ({"dk": 32}, r"dim_k in \(64, 128\)"),
    ],
)
def test_declines_what_it_cannot_serve(change, words):
    inputs = list(make_inputs(6, dk=change.get("dk", DK)))
    if "pool" in change:
        inputs[5] = inputs[5].astype(change["pool"])
    with pytest.raises(NotImplementedError, match=words):
        ragged_gated_delta_rule_mosaic_gpu(*inputs, None, jnp.asarray(SLOT_OF), interpret=True)


@pytest.mark.parametrize("pool_dtype", [jnp.float32, jnp.bfloat16])
def test_kernels_lower_for_cuda(pool_dtype):
    """Both passes at the bench's head dims, items of 64 columns (float32) and 128 (bf16); without the device check."""
    inputs = make_inputs(256, heads=4, slots=300, dk=128)
    shapes = [jax.ShapeDtypeStruct(x.shape, pool_dtype if i == 5 else x.dtype) for i, x in enumerate(inputs)]
    step = functools.partial(decode_batch, MosaicGpuRaggedDecodeTiling.for_pool(pool_dtype, DV, ctas=132), True)
    traced = jax.jit(step).trace(*shapes, jax.ShapeDtypeStruct((256,), jnp.int32))
    assert traced.lower(lowering_platforms=("cuda",)).as_text().count("mosaic_gpu") >= 2


@pytest.mark.gpu
@pytest.mark.parametrize("pool_dtype", [jnp.float32, jnp.bfloat16])
def test_gpu_decode_batch_matches_xla(pool_dtype):
    """256 requests, 32 heads, D 128; a few share slots, one slot is out of range; the pool donated, updated in
    place (no copy of it in the compiled step)."""
    slots = np.random.default_rng(2).permutation(320)[:256].astype(np.int32)
    slots[10], slots[20], slots[30] = slots[3], slots[3], 400
    inputs = list(make_inputs(256, heads=32, slots=320, dk=128, dtype=jnp.float32))
    inputs[5] = inputs[5].astype(pool_dtype)
    on = lambda platform: jax.jit(functools.partial(ragged_gated_delta_rule, platform=platform))
    xla_out, xla_state = on("xla")(*inputs, None, jnp.asarray(slots))
    step = jax.jit(
        lambda pool, *rest: ragged_gated_delta_rule(*rest[:5], pool, *rest[5:], platform="pallas"), donate_argnums=0
    )
    args = (*inputs[:5], None, jnp.asarray(slots))
    pool_type = f"{jnp.dtype(pool_dtype).name.replace('float', 'f')}[320,32,128,128]"  # f32[...], bf16[...]
    copies = copies_in(step.lower(inputs[5], *args).compile().as_text(), pool_type)
    assert not copies, copies[:2]  # the pool is stepped in place
    out, new_state = step(jnp.copy(inputs[5]), *args)
    assert_close(out, xla_out, jnp.float32, name="out")
    assert_close(new_state, xla_state, pool_dtype, name="new_state")


@pytest.mark.gpu
def test_gpu_upstream_entries_route_as_the_op():
    """EasyDeL's entries (upstream's private paths) reach the op's kernels: the decode entry the Mosaic GPU step
    (Triton's at dim_k 32, which Mosaic GPU declines), the chunked-prefill entry Triton's chunks."""
    from ejkernel.kernels._pallas.tpu.ragged_gated_delta_rule._interface import _decode_path
    from ejkernel.kernels._xla.ragged_gated_delta_rule._xla_impl_fwd import _ragged_gdr_chunked_prefill

    slots = jnp.arange(16, dtype=jnp.int32)
    inputs = make_inputs(16, heads=4, slots=16, dk=128, dtype=jnp.bfloat16)
    lowered = lambda fn, *args: jax.jit(fn).lower(*args).as_text()
    assert "mosaic_gpu" in lowered(lambda *a: _decode_path(*a, True), *inputs, slots)
    narrow = make_inputs(16, heads=4, slots=16, dk=32, dtype=jnp.bfloat16)
    text = lowered(lambda *a: _decode_path(*a, True), *narrow, slots)
    assert "mosaic_gpu" not in text and "triton" in text
    bounds = jnp.array([0, 10, 16], jnp.int32)
    text = lowered(lambda *a: _ragged_gdr_chunked_prefill(*a, 64, True), *inputs, bounds, slots[:2])
    assert "triton" in text


@pytest.mark.gpu
@pytest.mark.parametrize(
    "bounds, dtype",
    # (Triton's chunked form multiplies bf16 inputs as they come, its float32 ones to about 3e-4)
    [([0, 1, 1, 2, 3, 4, 5, 6], jnp.float32), ([0, 1, 4, 5, 5, 6, 7, 7], jnp.bfloat16)],
    ids=["decode", "mixed"],
)
def test_gpu_request_bounds_match_xla(bounds, dtype):
    """Request bounds on the GPU: the decode kernels on the requests' tokens, or Triton's chunked form."""
    slots, qsl = jnp.asarray([*SLOT_OF, 5]), jnp.asarray(bounds, jnp.int32)
    inputs = make_inputs(8, dk=128, dtype=dtype)
    on = lambda platform: jax.jit(functools.partial(ragged_gated_delta_rule, platform=platform))
    out, new_state = on("pallas")(*inputs, qsl, slots)
    xla_out, xla_state = on("xla")(*inputs, qsl, slots)
    assert_close(out, xla_out, dtype, name="out")
    assert_close(new_state, xla_state, dtype, name="new_state")
