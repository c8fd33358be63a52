"""The code examples of the seed documents (`../shared/seeds/`, upstream ejkernel 0.0.80's README, API
docs and reports), run as written and compared with the float32 reference.

Each test holds one example, copied from its document; the lines a test adds around it (inputs the
document leaves undefined, the comparison) are marked `# test:`. On this CPU host a GPU-only platform
is replaced by `xla`, and the GPU-only call is checked to fail with an error naming the device.
Examples of operations that do not exist yet are skipped, naming the issue that brings them.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ejkernel.reference.flash_attention import flash_attention_reference
from harness import assert_close


def reference(q, k, v, **kw):
    return flash_attention_reference(q, k, v, softmax_scale=q.shape[-1] ** -0.5, **kw)


def inputs(shape=(2, 128, 4, 32)):  # test: inputs the documents leave undefined
    kq, kk, kv = jax.random.split(jax.random.PRNGKey(7), 3)
    return tuple(jax.random.normal(x, shape, jnp.float32) for x in (kq, kk, kv))


# ---- 000: the README (reStructuredText) -----------------------------------------------------------


def test_000_quick_start():
    query, key, value = inputs()  # test:
    from ejkernel.modules import flash_attention

    # Basic usage - automatic configuration selection
    output = flash_attention(query, key, value, causal=True, dropout_prob=0.1)
    assert_close(output, reference(query, key, value, causal=True, dropout_prob=0.1, dropout_seed=0))  # test:

    # With advanced features
    output = flash_attention(
        query,
        key,
        value,
        causal=True,
        sliding_window=128,  # Local attention window
        logits_soft_cap=30.0,  # Gemma-2 style soft capping
    )
    expected = reference(query, key, value, causal=True, sliding_window=(128, 128), logits_soft_cap=30.0)  # test:
    assert_close(output, expected)  # test:


# ---- 001: the analysis reports' README ------------------------------------------------------------


def test_001_adding_a_new_kernel(monkeypatch):
    import dataclasses  # test: MyConfig and triton_implementation are left undefined by the document

    from jax import Array

    from ejkernel import Backend, Platform, kernel_registry
    from ejkernel.modules import create_default_executor
    from ejkernel.ops import Kernel, KernelConfig

    @dataclasses.dataclass(frozen=True)  # test:
    class MyConfig(KernelConfig):  # test:
        pass  # test:

    kernel_registry.list_algorithms()  # test: loaded, then copied, so that my_kernel leaves no trace
    monkeypatch.setattr(kernel_registry, "_impls", dict(kernel_registry._impls))  # test:
    executor = create_default_executor()  # test:
    triton_implementation = lambda inputs, **kwargs: inputs * 2.0  # test:

    # 1. Register implementation (on this CPU host: XLA for the document's Triton/GPU)
    @kernel_registry.register("my_kernel", Platform.XLA, Backend.ANY)
    def my_kernel_triton(inputs, **kwargs):
        return triton_implementation(inputs, **kwargs)

    # 2. Create module wrapper
    class MyKernel(Kernel[MyConfig, Array]):
        def run(self, inputs, cfg: MyConfig):
            impl = kernel_registry.get("my_kernel", cfg.platform)
            return impl(inputs, **cfg.to_dict())

    # 3. Provide convenience function
    def my_kernel(inputs, cfg=None):
        return executor(MyKernel(), inputs, _cfg=cfg)

    x = jnp.arange(6.0)  # test:
    assert_close(my_kernel(x), 2 * x)  # test:
    kernel_registry.register("my_kernel", Platform.TRITON, Backend.GPU)(my_kernel_triton)  # test: as written
    with pytest.raises(ValueError, match=r"platform='triton'.*current device backend: cpu"):  # test:
        my_kernel(x, cfg=MyConfig(platform="triton"))


def test_001_using_flash_attention():
    query, key, value = inputs()  # test:
    from ejkernel.modules import flash_attention

    # Basic usage with automatic optimization
    output = flash_attention(query, key, value, causal=True)
    assert_close(output, reference(query, key, value, causal=True))  # test:

    # With custom configuration
    from ejkernel.modules import FlashAttentionConfig
    from ejkernel.ops.utils.datacarrier import FwdParams

    config = FlashAttentionConfig(
        fwd_params=FwdParams(q_blocksize=256, kv_blocksize=256),
        platform="xla",  # the document's "triton" is a GPU platform: checked below
    )
    output = flash_attention(query, key, value, cfg=config)
    assert_close(output, reference(query, key, value))  # test:
    gpu_only = FlashAttentionConfig(fwd_params=FwdParams(q_blocksize=256, kv_blocksize=256), platform="triton")
    with pytest.raises(ValueError, match="current device backend: cpu"):  # test:
        flash_attention(query, key, value, cfg=gpu_only)


# ---- 002: the README (Markdown) -------------------------------------------------------------------


def test_002_basic_flash_attention():
    from ejkernel.modules import FlashAttention, create_default_executor

    # Initialize
    executor = create_default_executor()
    attention = FlashAttention()

    # Create inputs
    batch, seq_len, num_heads, head_dim = 2, 1024, 8, 64
    key = jax.random.PRNGKey(0)
    q = k = v = jax.random.normal(key, (batch, seq_len, num_heads, head_dim))

    # Execute attention
    output = executor(attention, q, k, v, causal=True, dropout_prob=0.1)
    assert_close(output, reference(q, k, v, causal=True, dropout_prob=0.1, dropout_seed=0))  # test:


def test_002_kernel_registry_directly():
    query, key, value = inputs()  # test:
    from ejkernel import Backend, Platform, kernel_registry

    # Get specific implementation (on this CPU host: XLA for the document's Triton/GPU)
    flash_attn_gpu = kernel_registry.get(algorithm="flash_attention", platform=Platform.XLA, backend=Backend.ANY)

    # Execute kernel
    output = flash_attn_gpu(query, key, value, causal=True)
    assert_close(output, reference(query, key, value, causal=True))  # test:
    triton = kernel_registry.get(algorithm="flash_attention", platform=Platform.TRITON, backend=Backend.GPU)  # test:
    with pytest.raises(RuntimeError, match="this device is cpu"):  # test:
        triton(query, key, value, causal=True)


def test_002_page_attention_for_inference():
    """The document imports upstream's private `ejkernel.kernels._xla.page_attention` with keywords that
    API.md's `page_attention` does not have (`scale`, `block_size`): where the seeds and API.md disagree,
    API.md stands. The same call through the public op, with API.md's names and layouts."""
    from ejkernel.modules import page_attention
    from ejkernel.reference.paged_attention import page_attention_reference

    num_blocks, num_heads, head_dim = 8, 4, 32  # test: sizes the document leaves undefined
    query = jax.random.normal(jax.random.PRNGKey(1), (2, num_heads, head_dim))  # test: one token per sequence

    # Setup KV cache
    max_blocks, block_size = 256, 16  # noqa: F841 (as written)
    key_cache = jax.random.normal(jax.random.PRNGKey(2), (num_blocks, num_heads, block_size, head_dim))  # test:
    value_cache = jax.random.normal(jax.random.PRNGKey(3), (num_blocks, num_heads, block_size, head_dim))  # test:

    # Block tables for sequence mapping
    block_tables = jnp.array([[0, 1, 2, 3], [4, 5, 6, 7]])
    context_lens = jnp.array([48, 32])

    # Run paged attention
    output = page_attention(query, key_cache, value_cache, context_lens, block_tables, attn_scale=0.125)
    expected = page_attention_reference(query, key_cache, value_cache, context_lens, block_tables, attn_scale=0.125)
    assert_close(output, expected)  # test:


def test_002_kernel_registry_system():
    from ejkernel import Backend, KernelRegistry, Platform

    kernel_registry = KernelRegistry()  # test: a private registry, so the global one stays clean

    @kernel_registry.register("my_kernel", Platform.TRITON, Backend.GPU, priority=100)
    def my_kernel_triton(x, y):
        # Triton implementation
        ...

    @kernel_registry.register("my_kernel", Platform.XLA, Backend.ANY, priority=50)
    def my_kernel_xla(x, y):
        # XLA fallback implementation
        ...

    # Automatic selection based on hardware
    impl = kernel_registry.get("my_kernel")  # Selects best available
    assert impl is my_kernel_xla  # test: on a CPU host, never the GPU kernel


# ---- 003: the API documentation -------------------------------------------------------------------


def test_003_basic_attention():
    from ejkernel.modules import flash_attention

    # Create query, key, value tensors
    q = jnp.ones((2, 128, 8, 64))  # (batch, seq_len, heads, head_dim)
    k = jnp.ones((2, 128, 8, 64))
    v = jnp.ones((2, 128, 8, 64))

    # Run flash attention
    output = flash_attention(q, k, v, causal=True)
    assert_close(output, reference(q, k, v, causal=True))  # test:


def test_003_with_masking():
    """As written, the segment ids (1 x 6) do not fit the previous example's q (2 x 128): a seed defect,
    refused with a clear error; the same call with inputs of the ids' shape matches the reference."""
    from ejkernel.modules import flash_attention
    from ejkernel.types import MaskInfo

    q = k = v = jnp.ones((2, 128, 8, 64))  # test: the previous example's inputs
    # Create mask from segment IDs
    segment_ids = jnp.array([[1, 1, 2, 2, -1, -1]])  # -1 = padding
    mask_info = MaskInfo.from_segments(segment_ids)

    with pytest.raises(ValueError, match="segment ids"):  # test:
        flash_attention(q, k, v, mask_info=mask_info)
    q, k, v = inputs((1, 6, 8, 64))  # test:
    # Use with attention
    output = flash_attention(q, k, v, mask_info=mask_info)
    seg = {"q_segment_ids": segment_ids, "kv_segment_ids": segment_ids}  # test:
    assert_close(output, reference(q, k, v, **seg))  # test:
    assert bool((output[0, 4:] == 0).all())  # test: padded query rows are zeros


def test_003_distributed_execution():
    """As written, `jax.devices().reshape` fails (a list has no reshape): a seed defect; with
    `np.array(jax.devices())` the example runs on the 8 simulated devices."""
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    from ejkernel.modules import flash_attention

    q, k, v = inputs((4, 64, 8, 32))  # test:
    devices = np.array(jax.devices())  # test: the document's jax.devices() is a list
    mesh = Mesh(devices.reshape(2, 4), axis_names=("dp", "tp"))

    with mesh:
        output = flash_attention(
            q,
            k,
            v,
            mesh=mesh,
            in_specs=(P("dp", None, "tp", None),) * 3,
            out_specs=P("dp", None, "tp", None),
        )
    assert_close(output, reference(q, k, v))  # test:


def test_003_packed_sequence_batching():
    from ejkernel.modules import flash_attention
    from ejkernel.types import MaskInfo

    q, k, v = inputs((1, 10, 4, 32))  # test:
    # Pack multiple sequences into one batch
    segment_ids = jnp.array(
        [
            [1, 1, 1, 2, 2, 3, 3, 3, 3, -1]  # 3 sequences, 1 padding
        ]
    )
    mask_info = MaskInfo.from_segments(segment_ids)

    # Each sequence only attends within itself
    output = flash_attention(q, k, v, mask_info=mask_info)
    assert_close(output, reference(q, k, v, q_segment_ids=segment_ids, kv_segment_ids=segment_ids))  # test:


def test_003_inference_with_kv_cache():
    """The document's shape comments (query `[batch, 1, heads, dim]`, caches `[blocks, block_size, kv_heads,
    dim]`) are another op's; API.md's `page_attention` takes query `[batch, heads, dim]` and caches
    `[blocks, kv_heads, block_size, dim]`, and API.md stands. The call itself runs as written."""
    from ejkernel.modules import page_attention
    from ejkernel.reference.paged_attention import page_attention_reference

    keys = jax.random.split(jax.random.PRNGKey(4), 3)  # test: inputs the document leaves undefined
    query = jax.random.normal(keys[0], (3, 8, 64), jnp.bfloat16)  # test:
    key_cache, value_cache = (jax.random.normal(x, (12, 2, 16, 64), jnp.bfloat16) for x in keys[1:])  # test:
    context_lens = jnp.array([1, 40, 64])  # test:
    block_tables = jnp.array([[5, 0, 0, 0], [2, 9, 7, 0], [11, 3, 1, 4]])  # test:
    output = page_attention(
        query,  # (batch, 1, heads, dim) - single token
        key_cache,  # (num_blocks, block_size, kv_heads, dim)
        value_cache,
        context_lens,  # (batch,) - current context length
        block_tables,  # (batch, max_blocks) - page table
    )
    expected = page_attention_reference(query, key_cache, value_cache, context_lens, block_tables)  # test:
    assert_close(output, expected, jnp.bfloat16)  # test:


def test_003_long_sequence_training():
    from ejkernel.modules import ring_attention

    q, k, v = inputs((1, 64, 4, 32))  # test: divisible by 2 x 8 devices (the causal ring's chunks)
    from jax.sharding import Mesh

    # Distribute very long sequences across devices
    mesh = Mesh(jax.devices(), axis_names=("sp",))

    with mesh:
        output = ring_attention(
            q,
            k,
            v,
            axis_name="sp",
            causal=True,
        )
    assert_close(output, reference(q, k, v, causal=True))  # test:


def test_003_force_a_platform():
    from ejkernel.modules import flash_attention

    q, k, v = inputs((1, 16, 2, 32))  # test:
    with pytest.raises(ValueError, match="current device backend: cpu"):  # test: GPU only
        output = flash_attention(q, k, v, platform="triton")  # GPU
    with pytest.raises(ValueError, match="current device backend: cpu"):  # test: TPU (and Hopper GPUs) only
        output = flash_attention(q, k, v, platform="pallas")  # TPU
    output = flash_attention(q, k, v, platform="xla")  # Fallback
    assert_close(output, reference(q, k, v))  # test:
