"""Upstream ejkernel 0.0.80's call forms (issue 28): each is called the upstream way and checked against
the float32 reference, not only for running."""

import dataclasses
import itertools
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from ejkernel.reference.flash_attention import flash_attention_reference
from harness import assert_close, randn

B, S, H, HKV, D = 2, 32, 4, 2, 16


def qkv(length=S):
    return randn((B, length, H, D)), randn((B, length, HKV, D)), randn((B, length, HKV, D))


def reference(q, k, v, **kw):
    return flash_attention_reference(q, k, v, softmax_scale=kw.pop("softmax_scale", D**-0.5), **kw)


# ----------------------------------------------------------------------------- imports and registry


def test_upstream_import_paths():
    from ejkernel.kernels import kernel_registry as from_kernels
    from ejkernel.modules import FlashAttentionConfig as from_modules
    from ejkernel.modules.operations import (
        attention,
        flash_attention,
        mean_pooling,
        ring_attention,
        scaled_dot_product_attention,
    )
    from ejkernel.modules.operations.configs import BaseOperationConfig, FlashAttentionConfig, MeanPoolingConfig
    from ejkernel.ops import KernelConfig, get_device_platform
    from ejkernel.ops.utils.datacarrier import BwdParams, FwdParams
    from ejkernel.registry import kernel_registry
    from ejkernel.types.mask import MaskInfo, mask_to_segment_ids, segment_ids_to_mask, segment_ids_to_qkv_masks

    for fn in (attention, flash_attention, mean_pooling, ring_attention, scaled_dot_product_attention):
        assert callable(fn) and not isinstance(fn, type(sys)), fn
    assert from_kernels is kernel_registry and FlashAttentionConfig is from_modules
    assert BaseOperationConfig is KernelConfig and issubclass(MeanPoolingConfig, BaseOperationConfig)
    assert issubclass(BwdParams, FwdParams) and MaskInfo.from_segments
    assert callable(mask_to_segment_ids) and callable(segment_ids_to_mask) and callable(segment_ids_to_qkv_masks)
    assert get_device_platform() == "cpu" and get_device_platform(jax.devices()[0]) == "cpu"


REGISTRY_ALONE = """
import jax, jax.numpy as jnp, numpy as np
from ejkernel import kernel_registry, Platform, Backend
from ejkernel.reference.flash_attention import flash_attention_reference as ref
q, k, v = (jax.random.normal(jax.random.PRNGKey(i), (1, 24, 2, 16)) for i in range(3))
impl = kernel_registry.get(algorithm="flash_attention", platform=Platform.XLA, backend=Backend.ANY)
out = impl(q, k, v, causal=True)
assert np.allclose(out, ref(q, k, v, softmax_scale=0.25, causal=True), atol=1e-5)
out, weights = kernel_registry.get("attention", platform=Platform.XLA, backend=Backend.ANY)(q, k, v, causal=True)
assert np.allclose(out, ref(q, k, v, softmax_scale=0.25, causal=True), atol=2e-2)
print("ok", sorted(kernel_registry.list_algorithms())[:3])
"""


def test_registry_alone_knows_every_implementation():
    """`from ejkernel import kernel_registry` in a fresh process, nothing else imported first."""
    done = subprocess.run([sys.executable, "-c", REGISTRY_ALONE], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ok" in done.stdout


def test_registered_implementations_take_the_public_defaults():
    from ejkernel import Backend, Platform, kernel_registry

    q, k, v = qkv()
    impl = kernel_registry.get(algorithm="flash_attention", platform=Platform.XLA, backend=Backend.ANY)
    assert_close(impl(q, k, v, sliding_window=5, causal=True), reference(q, k, v, sliding_window=(5, 5), causal=True))
    sinks = randn((H, 3))  # several sinks per head, folded to one per head
    assert_close(impl(q, k, v, None, sinks), dense_with_sinks(q, k, v, sinks))
    with pytest.raises(ValueError, match=r"no implementation of 'flash_attention'.*current device backend: cpu"):
        kernel_registry.get("flash_attention", platform="triton")
    triton = kernel_registry.get("flash_attention", platform=Platform.TRITON, backend=Backend.GPU)
    with pytest.raises(RuntimeError, match="GPU kernel and this device is cpu"):
        triton(q, k, v, causal=True)


def test_upstream_algorithm_aliases():
    from ejkernel import Backend, KernelRegistry, Platform

    registry = KernelRegistry()
    fn = registry.register("mamba2", Platform.XLA, Backend.ANY)(lambda x: x)
    assert registry.list_algorithms() == ["state_space_v2"]
    assert registry.get("ssm2") is registry.get("state_space_v2") is fn


# ------------------------------------------------------------------------------- configs, kernels


def test_fwd_params_take_upstream_names():
    from ejkernel.ops.utils.datacarrier import BwdParams, FwdParams

    params = FwdParams(q_blocksize=64, kv_blocksize=32, num_warps=4, num_stages=2)
    assert params == FwdParams(block_q=64, block_k=32, num_warps=4, num_stages=2)
    assert (params.q_blocksize, params.kv_blocksize, params.blocksize_keys) == (64, 32, 32)
    assert BwdParams(blocksize_m=64, blocksize_n=128, num_key_splits=4).block_n == 128
    with pytest.raises(ValueError, match="contradicts"):
        FwdParams(q_blocksize=64, block_q=32)
    with pytest.raises(TypeError, match="unknown fields"):
        FwdParams(q_block=64)
    from ejkernel.modules import FlashAttentionConfig, flash_attention

    q, k, v = qkv()
    cfg = FlashAttentionConfig(fwd_params=FwdParams(q_blocksize=16, kv_blocksize=16), platform="xla")
    assert_close(flash_attention(q, k, v, causal=True, cfg=cfg), reference(q, k, v, causal=True))


def test_config_backend_is_checked_against_the_device():
    from ejkernel.modules import FlashAttentionConfig, flash_attention

    cfg = FlashAttentionConfig(platform="cuda", backend="gpu")
    assert cfg.backend == "gpu"
    q, k, v = qkv()
    with pytest.raises(ValueError, match="backend='gpu' cannot run on this device \\(cpu\\)"):
        flash_attention(q, k, v, cfg=cfg)
    here = FlashAttentionConfig(platform="xla", backend="cpu")
    assert_close(flash_attention(q, k, v, cfg=here), reference(q, k, v))
    with pytest.raises(ValueError, match="backend must be one of"):
        FlashAttentionConfig(backend="npu")


def test_executor_runs_kernels_with_raw_options():
    from ejkernel.modules import FlashAttention, MeanPooling, create_default_executor

    executor = create_default_executor()
    q, k, v = qkv()
    out = executor(FlashAttention(), q, k, v, sliding_window=6, causal=True)
    assert_close(out, reference(q, k, v, sliding_window=(6, 6), causal=True))
    x = randn((2, 9, 8))
    assert_close(executor(MeanPooling(), x), x.mean(axis=1))


def test_dropout_without_a_seed_uses_the_documented_default():
    from ejkernel.modules import FlashAttention, create_default_executor, flash_attention

    q, k, v = qkv()
    out = flash_attention(q, k, v, causal=True, dropout_prob=0.2)
    seeded = reference(q, k, v, causal=True, dropout_prob=0.2, dropout_seed=jnp.uint32(0))
    assert_close(out, seeded)
    assert_close(create_default_executor()(FlashAttention(), q, k, v, causal=True, dropout_prob=0.2), seeded)
    other = flash_attention(q, k, v, causal=True, dropout_prob=0.2, dropout_seed=1)
    assert not np.allclose(other, out)


def dense_with_sinks(q, k, v, sinks, causal=False):
    """Softmax over [logits | the head's sinks], the sink columns then dropped: independent of the fold."""
    group = H // HKV
    k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
    logits = jnp.einsum("bihd,bjhd->bhij", q, k) * D**-0.5
    if causal:
        logits = jnp.where(jnp.tril(jnp.ones((S, S), bool)), logits, -jnp.inf)
    sink_columns = jnp.broadcast_to(sinks[None, :, None, :], (*logits.shape[:3], sinks.shape[-1]))
    columns = jnp.concatenate([logits, sink_columns], -1)
    weights = jax.nn.softmax(columns, axis=-1)[..., :S]
    return jnp.einsum("bhij,bjhd->bihd", weights, v)


def test_several_sinks_per_head():
    from ejkernel.modules import attention, flash_attention

    q, k, v = qkv()
    sinks = randn((H, 3), scale=2.0)
    expected = dense_with_sinks(q, k, v, sinks, causal=True)
    assert_close(flash_attention(q, k, v, None, None, None, sinks, causal=True), expected)
    out, _ = attention(q, k, v, None, None, sinks, causal=True, dtype=jnp.float32)
    assert_close(out, expected, tol=1e-4)
    grad = jax.grad(lambda s: jnp.sum(flash_attention(q, k, v, None, None, None, s, causal=True) ** 2))(sinks)
    assert_close(grad, jax.grad(lambda s: jnp.sum(dense_with_sinks(q, k, v, s, causal=True) ** 2))(sinks), tol=1e-4)
    with pytest.raises(ValueError, match="softmax_aux must be"):
        flash_attention(q, k, v, None, None, None, randn((3, 2)))


def test_int_values_of_float_options():
    """`softmax_scale=1`, `logits_soft_cap=30`: an int where the signature says float, as in Python's typing."""
    from ejkernel.modules import flash_attention, gla_attention

    q, k, v = qkv()
    expected = flash_attention_reference(q, k, v, softmax_scale=1.0, logits_soft_cap=30.0)
    assert_close(flash_attention(q, k, v, softmax_scale=1, logits_soft_cap=30), expected)
    assert_close(gla_attention(q, k, v, softmax_scale=1), gla_attention(q, k, v, softmax_scale=1.0))


# --------------------------------------------------------------------------------- ring attention


def test_ring_attention_on_one_device_is_flash_attention():
    from ejkernel.modules import ring_attention
    from ejkernel.types import MaskInfo

    q, k, v = qkv()
    bias = randn((1, H, S, S))
    assert_close(ring_attention(q, k, v, causal=True), reference(q, k, v, causal=True))
    assert_close(ring_attention(q, k, v, None, bias), reference(q, k, v, bias=bias))
    dense = np.tril(np.ones((B, 1, S, S), bool)) & (np.arange(S) % 3 != 1)
    out = ring_attention(q, k, v, mask_info=MaskInfo.from_attention_mask(dense), axis_name="sp")
    assert_close(out, reference(q, k, v, attention_mask=jnp.asarray(dense)))
    grad = jax.grad(lambda b: jnp.sum(ring_attention(q, k, v, None, b) ** 2))(bias)
    assert_close(grad, jax.grad(lambda b: jnp.sum(reference(q, k, v, bias=b) ** 2))(bias), tol=1e-4)


def test_in_specs_one_per_positional_slot():
    from ejkernel.modules import flash_attention, mean_pooling, ring_attention

    mesh = jax.make_mesh((8,), ("sp",))
    ring = jax.make_mesh((4,), ("sp",), devices=jax.devices()[:4])  # (a shorter ring traces and compiles faster)
    q, k, v = (randn((1, 64, 2, D)) for _ in range(3))
    spec = P(None, "sp")
    out = ring_attention(q, k, v, causal=True, mesh=ring, in_specs=(spec, spec, spec, None, None), out_specs=spec)
    assert_close(out, reference(q, k, v, causal=True))
    heads = P(None, None, "sp")
    q8, k8, v8 = (randn((1, 16, 8, D)) for _ in range(3))
    out = flash_attention(q8, k8, v8, mesh=mesh, in_specs=(heads,) * 3 + (None,) * 4, out_specs=heads)
    assert_close(out, reference(q8, k8, v8))
    x = randn((8, 5, 4))
    assert_close(mean_pooling(x, mesh=mesh, in_specs=(P("sp"), None), out_specs=P("sp")), x.mean(axis=1))
    with pytest.raises(ValueError, match="not passed"):
        flash_attention(q8, k8, v8, mesh=mesh, in_specs=(heads,) * 4, out_specs=heads)


# --------------------------------------------------------------------------------------- MaskInfo


def oracle(q_seg, kv_seg, allowed):
    """[B, 1, Sq, Sk] from segment ids and a positional rule `allowed(b, i, j)`, pair by pair."""
    batch, q_len, kv_len = q_seg.shape[0], q_seg.shape[1], kv_seg.shape[1]
    out = np.zeros((batch, 1, q_len, kv_len), bool)
    for b, i, j in itertools.product(range(batch), range(q_len), range(kv_len)):
        out[b, 0, i, j] = q_seg[b, i] >= 0 and q_seg[b, i] == kv_seg[b, j] and allowed(b, i, j)
    return out


SEG = np.array([[0, 0, 0, 1, 1, 1, 1, -1], [0, 0, 0, 0, 0, 2, 2, 2]], np.int32)


def test_mask_info_upstream_constructors_and_answers():
    from ejkernel.types.mask import MaskInfo, segment_ids_to_mask

    padding = np.array([[1, 1, 1, 0], [1, 0, 0, 0]], np.int32)
    mi = MaskInfo.from_segments(padding, is_attn_mask=True)
    np.testing.assert_array_equal(mi.q_segment_ids, np.where(padding == 1, 0, -1))
    seg = MaskInfo.from_segments(SEG)
    np.testing.assert_array_equal(seg.attention_mask, oracle(SEG, SEG, lambda b, i, j: True))
    np.testing.assert_array_equal(seg.q_position_ids, [[0, 1, 2, 0, 1, 2, 3, 0], [0, 1, 2, 3, 4, 0, 1, 2]])
    dense = MaskInfo.from_attention_mask(segment_ids_to_mask(jnp.asarray(SEG)))
    # Ids of a dense mask are padding-style (API.md 4.3.4): 0 for a row that attends anywhere, -1 for none.
    np.testing.assert_array_equal(dense.q_segment_ids, [[0, 0, 0, 0, 0, 0, 0, -1], [0, 0, 0, 0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(dense.kv_segment_ids, dense.q_segment_ids)
    positions = np.tile(np.arange(8, dtype=np.int32) + 5, (2, 1))
    carried = MaskInfo.from_segments(SEG, SEG, positions, positions)
    np.testing.assert_array_equal(carried.get_or_compute_positions()[0], positions)
    q_mask, kv_mask, full = seg.get_qkv_masks()
    np.testing.assert_array_equal(q_mask, SEG >= 0)
    np.testing.assert_array_equal(kv_mask, SEG >= 0)
    np.testing.assert_array_equal(full, seg.attention_mask)
    assert seg.batch_size == 2 and seg.shape == (2, 8, 8) and bool(seg.is_self_attention())
    assert seg.to_dtype(jnp.float32).attention_mask.dtype == jnp.float32
    swapped = seg.replace(q_segment_ids=jnp.zeros((2, 8), jnp.int32))
    np.testing.assert_array_equal(swapped.q_segment_ids, 0)
    random = MaskInfo.from_random(batch_size=2, q_len=8, kv_len=12, sparsity=0.5, seed=4)
    assert random.attention_mask.shape == (2, 1, 8, 12)
    text = seg.apply_causal().visualize(block_size=2, return_str=True, charset="ascii")
    assert "8 queries x 8 keys" in text and "#" in text


def test_mask_info_upstream_transforms():
    from ejkernel.types import MaskInfo

    seg = MaskInfo.from_segments(SEG)
    offsets = np.array([1, -2])
    np.testing.assert_array_equal(
        seg.apply_causal(offset=jnp.asarray(offsets)).attention_mask,
        oracle(SEG, SEG, lambda b, i, j: j <= i + offsets[b]),
    )
    np.testing.assert_array_equal(
        seg.apply_chunked(3).attention_mask, oracle(SEG, SEG, lambda b, i, j: i // 3 == j // 3 and j <= i)
    )
    windowed = seg.apply_sliding_window((2, 0), offset=1)
    np.testing.assert_array_equal(windowed.attention_mask, oracle(SEG, SEG, lambda b, i, j: i - 1 <= j <= i + 1))
    decode = seg.apply_causal().apply_sliding_window((2, 1), mode="decode", index=jnp.array([5, 6]))
    full = oracle(SEG, SEG, lambda b, i, j: j <= i and i - 2 <= j <= i + 1)
    np.testing.assert_array_equal(decode.attention_mask, [full[0, :, 5:6, 3:7], full[1, :, 6:7, 4:8]])
    assert decode.kv_segment_ids.shape == (2, 4)
    prefill = seg.apply_causal().apply_sliding_window(3, mode="prefill")
    np.testing.assert_array_equal(prefill.attention_mask, oracle(SEG, SEG, lambda b, i, j: i - 3 <= j <= i)[..., 5:])
    lengths, ends = np.array([7, 5]), np.array([7, 5])
    step = seg.apply_causal().apply_kv_lengths(jnp.asarray(lengths), q_len=2, end_index=jnp.asarray(ends))
    whole = oracle(SEG, SEG, lambda b, i, j: j <= i and j < lengths[b])
    np.testing.assert_array_equal(step.attention_mask, [whole[0, :, 5:7], whole[1, :, 3:5]])
    # Window and chunk sizes traced under jit are baked into the mask.
    traced = jax.jit(lambda w, c: seg.apply_sliding_window(w).apply_chunked(c).attention_mask)(1, 4)
    rule = lambda b, i, j: abs(i - j) <= 1 and i // 4 == j // 4 and j <= i
    np.testing.assert_array_equal(traced, oracle(SEG, SEG, rule))


def test_baked_masks_reach_the_kernels():
    from ejkernel.modules import flash_attention
    from ejkernel.types import MaskInfo

    q, k, v = qkv(8)
    mi = MaskInfo.from_segments(SEG).apply_causal(offset=1).apply_sliding_window((3, 3))
    expected = reference(q, k, v, attention_mask=jnp.asarray(oracle(SEG, SEG, lambda b, i, j: i - 3 <= j <= i + 1)))
    assert_close(flash_attention(q, k, v, mask_info=mi), expected)


# ------------------------------------------------------------------------- a user-defined kernel


def test_user_kernel_as_the_seed_writes_it(tmp_path):
    """A config, a `Kernel[MyConfig, Array]` with `run`, `heuristic_cfg` and `candidate_cfgs`, and
    implementations on two platforms, through `Executor` with its cache tiers and autotuning."""
    from jax import Array

    from ejkernel import Backend, KernelRegistry, Platform
    from ejkernel.ops import (
        ConfigCache,
        ConfigSelectorChain,
        Executor,
        Kernel,
        KernelConfig,
        PersistentCache,
        Tuner,
        device_fingerprint,
    )

    registry = KernelRegistry()
    calls = []

    @registry.register("my_kernel", Platform.TRITON, Backend.GPU, priority=100)
    def my_kernel_triton(inputs, **kwargs):
        raise AssertionError("a GPU implementation never runs on this CPU host")

    @registry.register("my_kernel", Platform.XLA, Backend.ANY, priority=50)
    def my_kernel_xla(inputs, scale=1.0, **kwargs):
        calls.append(kwargs["block"])
        return inputs * scale

    @dataclasses.dataclass(frozen=True)
    class MyConfig(KernelConfig):
        block: int = 8

    class MyKernel(Kernel[MyConfig, Array]):
        def __init__(self):
            super().__init__("my_op")

        def run(self, inputs, cfg: MyConfig, scale=1.0):
            impl = registry.get("my_kernel", cfg.platform)
            return impl(inputs, scale, **cfg.to_dict())

        def heuristic_cfg(self, inv):
            return MyConfig(block=16)

        def candidate_cfgs(self, inv):
            return [MyConfig(block=b) for b in (8, 32)]

    assert MyKernel.config_type is MyConfig and MyKernel().op_id == "my_op"
    persistent = PersistentCache(tmp_path)
    chain = ConfigSelectorChain(cache=ConfigCache(), persistent=persistent, tuner=Tuner(warmup=0, repeats=1))
    executor = Executor(chain)
    x = randn((4, 4))
    assert_close(executor(MyKernel(), x, scale=2.0), 2 * x)  # heuristics
    assert calls[-1] == 16
    assert_close(executor(MyKernel(), x, _cfg=MyConfig(block=4)), x)  # an explicit config wins, not cached
    assert calls[-1] == 4 and len(chain.memory) == 0
    tuning = Executor(ConfigSelectorChain(cache=chain.memory, persistent=persistent, policy="autotune"))
    assert_close(tuning(MyKernel(), x, scale=3.0), 3 * x)  # autotuned: both candidates timed, one stored
    assert {8, 32} <= set(calls) and len(chain.memory) == 1 and len(persistent.entries()) == 1
    key = next(iter(persistent.entries()))
    assert key.startswith("my_op|" + device_fingerprint())
    chain.memory.clear()
    calls.clear()
    executor(MyKernel(), x, scale=3.0)  # from the persistent tier now, no tuning
    assert calls == [persistent.get(key).block]
    with pytest.raises(TypeError, match=r"must be a dataclass"):

        class Bad(Kernel[int, Array]):
            pass


@pytest.mark.parametrize("with_platform", [True, False])
def test_user_config_is_any_frozen_dataclass(with_platform, tmp_path):
    """The seed's `Kernel[MyConfig, Array]` with a config that is a plain frozen dataclass (no KernelConfig
    base): heuristics, an explicit config, `platform=` and autotuning (memory tier only: no JSON form)."""
    from jax import Array

    from ejkernel import Backend, KernelRegistry, Platform
    from ejkernel.ops import ConfigCache, ConfigSelectorChain, Executor, Kernel, PersistentCache

    registry = KernelRegistry()
    registry.register("plain", Platform.XLA, Backend.ANY)(lambda inputs, scale: inputs * scale)
    fields = [("scale", float, 2.0)] + ([("platform", str, "auto")] if with_platform else [])
    MyConfig = dataclasses.make_dataclass("MyConfig", fields, frozen=True)

    class MyKernel(Kernel[MyConfig, Array]):
        def run(self, inputs, cfg):
            return registry.get("plain", getattr(cfg, "platform", None))(inputs, cfg.scale)

        def candidate_cfgs(self, inv):
            return [MyConfig()]

    persistent = PersistentCache(tmp_path)
    executor = Executor(ConfigSelectorChain(cache=ConfigCache(), persistent=persistent, policy="autotune"))
    x = randn((4,))
    assert_close(executor(MyKernel(), x), 2 * x)
    assert_close(executor(MyKernel(), x, _cfg=MyConfig(scale=3.0)), 3 * x)
    if with_platform:
        assert_close(executor(MyKernel(), x, platform="xla"), 2 * x)
    else:
        with pytest.raises(ValueError, match="MyConfig has no platform field"):
            executor(MyKernel(), x, platform="xla")
    assert persistent.entries() == {}
