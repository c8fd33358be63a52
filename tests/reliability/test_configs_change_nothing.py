"""A config chooses how an op computes, never what: no tunable field changes any op's output.

For every op function in `ejkernel.modules.operations.__all__`: one small float32 call on the xla platform, then the
same call under configs (given as an overlay, which reaches ops without a `cfg` argument too) that set each field
but platform/backend to another legal value (a few for tilings), and under every candidate the op's Kernel offers
the autotuner for this call (but the config the call chose itself). Outputs must agree to float32 rounding (tilings
and chunk sizes change the order of sums); for the ops whose configs tile the backward too (`Kernel.tune_argnums`),
so must the gradients under the backward tilings and the candidates. NSA's `block_size`, a field kept for upstream's
configs, must equal the call's or be refused.
"""

import dataclasses
import functools
import inspect
import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ejkernel.modules import (
    CausalConv1dTritonTiling,
    GLAttentionTritonTiling,
    MultiLatentRaggedPageAttentionTritonTiling,
    operations,
)
from ejkernel.ops import BwdParams, FwdParams, overlay_cache
from ejkernel.ops.executor import ConfigSelectorChain
from ejkernel.quantization import prepack_quantized_weights
from flash_mla.test_flash_mla import mla_inputs
from harness import randn, relative_error
from linear_attention.linear_cases import log_decay, write_strength
from linear_attention.linear_cases import qkv as linear_qkv
from serving_attention.paged_cases import CASES as PAGED_CASES
from serving_attention.test_cascade_attention import case as cascade_case
from serving_attention.test_mla_ragged_paged import make_case as mla_ragged_case
from sparse_attention.sparse_cases import qkv as heads_first_qkv
from state_space.state_space_cases import v1_inputs, v2_inputs

TOLERANCE = 1e-5  # relative: float32 rounding of sums taken in another order


def _attention(layout="bshd", **options):
    if layout == "bhsd":
        return list(heads_first_qkv(1, 4, 2, 40, 40, 16)), options
    return [randn((2, 40, 4, 16)), randn((2, 40, 2, 16)), randn((2, 40, 2, 16))], options


def _linear(gates=(), heads=4, kv_heads=2, **options):
    q, k, v = linear_qkv(seq=40, heads=heads, kv_heads=kv_heads)
    draw = {
        "g": lambda: log_decay(2, 40, heads, 8),
        "g_heads": lambda: log_decay(2, 40, heads),
        "beta": lambda: write_strength(2, 40, heads),
    }
    return [q, k, v, *(draw[name]() for name in gates)], options


def _native_sparse():
    (q, k, v), _ = _attention()
    return [q, k, v, randn((2, 40, 4)), randn((2, 40, 4)), None, 2], {"block_size": 8}


def _ragged_gated_delta_rule():
    """Padding tokens around the requests; prefill, decode and empty requests; slots no request names."""
    (q, k, v, beta), _ = _linear(("beta",), heads=2, kv_heads=2)
    q, k, v, beta = (x[0] for x in (q, k, v, beta))
    decay = log_decay(40, 2)
    state = randn((5, 2, 8, 16))
    starts = jnp.array([2, 15, 16, 16, 37], jnp.int32)
    slots = jnp.array([3, 0, 1, 4], jnp.int32)
    return [q, k, v, beta, decay, state, starts, slots], {}


def _causal_conv1d(easydel=False):
    """Packed prefill, decode and empty sequences on a state pool, padding tokens after them."""
    x, weight, pool = randn((40, 16)), randn((16, 4)), randn((5, 16, 3))
    cu, slots = jnp.array([0, 13, 14, 14, 37], jnp.int32), jnp.array([3, 0, 1, 4], jnp.int32)
    if easydel:
        return [x, pool, weight, cu, slots, jnp.array([1, 4, 4], jnp.int32)], {"d_conv": 4}
    return [x, weight, randn((16,))], {
        "activation": "silu",
        "cu_seqlens": cu,
        "conv_state": pool,
        "state_indices": slots,
    }


def _grouped_matmul():
    return [randn((64, 24)), randn((4, 24, 40)), jnp.array([10, 0, 31, 20], jnp.int32)], {}


def _quantized_matmul():
    options = dict(bits=4, mode="affine", transpose=False)
    return [randn((5, 40)), *prepack_quantized_weights(randn((40, 128)), **options)], options


def _paged(op):
    args, options = PAGED_CASES[op](np.random.default_rng(0))
    return list(args), options


CASES = {
    "attention": functools.partial(_attention, causal=True, dtype=jnp.float32),
    "blocksparse_attention": functools.partial(_attention, "bhsd", causal=True, sliding_window=(9, 0)),
    "causal_conv1d": _causal_conv1d,
    "flash_attention": functools.partial(_attention, causal=True, sliding_window=(9, 0)),
    "flash_mla": lambda: (mla_inputs(), {"causal": True}),
    "gated_delta_rule": functools.partial(_linear, ("beta", "g_heads"), kv_heads=4),
    "gla_attention": functools.partial(_linear, ("g",)),
    "grouped_matmul": _grouped_matmul,
    "kernel_delta_attention": functools.partial(_linear, ("beta", "g_heads"), kv_heads=4),
    "lightning_attention": functools.partial(_linear, layer_idx=2, num_layers=8),
    "mean_pooling": lambda: ([randn((40, 16)), jnp.array([0, 13, 40], jnp.int32)], {}),
    "cascade_attention": lambda: (cascade_case(), {}),
    "merge_attention_states": lambda: ([randn((40, 4, 16)), randn((40, 4)), randn((40, 4, 16)), randn((40, 4))], {}),
    "multi_latent_ragged_page_attention": lambda: (mla_ragged_case(), {}),
    "multi_latent_ragged_page_attention_v2": lambda: (mla_ragged_case(), {}),
    "native_sparse_attention": _native_sparse,
    "quantized_matmul": _quantized_matmul,
    "ragged_causal_conv1d": functools.partial(_causal_conv1d, easydel=True),
    "ragged_gated_delta_rule": _ragged_gated_delta_rule,
    "recurrent_attention": functools.partial(_linear, ("g_heads",)),
    "ring_attention": functools.partial(_attention, causal=True),
    "scaled_dot_product_attention": functools.partial(_attention, causal=True, sliding_window=(9, 0)),
    "state_space_v1": lambda: (list(v1_inputs()), {}),
    "state_space_v2": lambda: (list(v2_inputs()), {"n_groups": 2}),
    **{op: functools.partial(_paged, op) for op in PAGED_CASES},
}

# Legal values a field is set to (besides its default); a field not named here takes them by its type.
TILINGS = (
    dict(
        block_q=16, block_k=16, block_d=16, block_m=16, block_n=16, block_h=1, num_splits=2, num_warps=2, num_stages=1
    ),
    dict(
        block_q=64, block_k=32, block_d=32, block_m=32, block_n=64, block_h=2, num_splits=3, num_warps=8, num_stages=3
    ),
)
NAMED_VALUES = {
    "fwd_params": tuple(FwdParams(**t) for t in TILINGS),
    "bwd_params": tuple(BwdParams(**t) for t in TILINGS),
    "vmem_limit_bytes": (16 << 20, 64 << 20),
    "tpu_path": ("packed",),
    "triton_tiling": (
        GLAttentionTritonTiling(state_k=16, block_k=16, grads_warps=8),
        GLAttentionTritonTiling(num_stages=3, state_unroll=2),
        MultiLatentRaggedPageAttentionTritonTiling(block_h=16, block_k=16, num_splits=2),
        CausalConv1dTritonTiling(forward="shifted"),
        CausalConv1dTritonTiling(step_rows=1),
    ),
}
INTS = (1, 2, 8, 32)  # an int field takes the smallest of these that it accepts


def _op_functions() -> dict[str, typing.Callable]:
    """Each op function of `__all__` once, by its own name (upstream's aliases, `gdr_attention`, are the same)."""
    found = {}
    for name in operations.__all__:
        fn = getattr(operations, name)
        if inspect.isfunction(fn) and not any(fn is seen for seen in found.values()):
            found[fn.__name__] = fn
    return found


def _legal_values(field, default_cfg) -> list:
    """Configs of `default_cfg` with `field` set to a few values other than its default that the config accepts."""
    if field.name in NAMED_VALUES:
        values = NAMED_VALUES[field.name]
    elif isinstance(field.default, bool):
        values = (not field.default,)
    else:
        values = INTS
    legal = []
    for value in values:
        if value == getattr(default_cfg, field.name):
            continue
        try:
            legal.append(dataclasses.replace(default_cfg, **{field.name: value}))
        except (ValueError, TypeError):
            continue
    return legal if field.name in NAMED_VALUES else legal[:1]


def _float_leaves(result) -> list:
    return [x for x in jax.tree_util.tree_leaves(result) if jnp.issubdtype(x.dtype, jnp.floating)]


def _compiled(fn, args):
    """`fn(*args)` under a fresh `jax.jit` (the config is chosen while tracing), the non-array arguments held static:
    one program a config, where the eager call compiled a program for each op of the op's glue."""
    traced = [i for i, a in enumerate(args) if isinstance(a, jax.Array)]

    def with_arrays(*arrays):
        full = list(args)
        for i, a in zip(traced, arrays, strict=True):
            full[i] = a
        return fn(*full)

    return jax.jit(with_arrays)(*(args[i] for i in traced))


def _results(call, args, argnums, with_grads: bool) -> list:
    """The float outputs of `call(*args)`, then (`with_grads`) its gradients in `argnums` for a fixed random
    cotangent (the same for every config: drawn from the shapes alone)."""
    if not with_grads:
        return _float_leaves(_compiled(call, args))

    def outputs_and_grads(*args):
        diff = lambda *d: call(*[d[argnums.index(i)] if i in argnums else a for i, a in enumerate(args)])
        out, vjp = jax.vjp(diff, *(args[i] for i in argnums))
        keys = jax.random.split(jax.random.PRNGKey(0), len(jax.tree_util.tree_leaves(out)))
        leaves, tree = jax.tree_util.tree_flatten(out)
        cotangent = [jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves, strict=True)]
        return _float_leaves(out) + _float_leaves(vjp(jax.tree_util.tree_unflatten(tree, cotangent)))

    return _compiled(outputs_and_grads, args)


def test_every_op_function_has_a_case():
    assert sorted(_op_functions()) == sorted(CASES)


@pytest.mark.parametrize("op", sorted(CASES))
def test_no_config_field_changes_the_output(op, monkeypatch):
    fn = _op_functions()[op]
    args, options = CASES[op]()
    if "platform" in inspect.signature(fn).parameters:
        options = {**options, "platform": "xla"}
    call = lambda *a: fn(*a, **options)

    seen = []  # (kernel, invocation, config) of each config selection the call makes
    select = ConfigSelectorChain.select

    def record(self, kernel, inv, *rest):
        seen.append((kernel, inv, select(self, kernel, inv, *rest)))
        return seen[-1][2]

    monkeypatch.setattr(ConfigSelectorChain, "select", record)
    expected = _results(call, args, (), False)
    assert seen, f"{op} chose no config"
    kernel, inv, chosen = seen[0]
    argnums = kernel.tune_argnums
    if argnums:
        expected = _results(call, args, argnums, True)
    default_cfg = kernel.config_type(platform="xla")

    configs = {f"candidate {cfg}": cfg for cfg in kernel.candidate_cfgs(dataclasses.replace(inv, platform="xla"))}
    refused = []
    for field in dataclasses.fields(kernel.config_type):
        if field.name in ("platform", "backend"):
            continue
        if op == "native_sparse_attention" and field.name == "block_size":
            configs["block_size = the call's"] = dataclasses.replace(default_cfg, block_size=options["block_size"])
            refused.append(dataclasses.replace(default_cfg, block_size=2 * options["block_size"]))
            continue
        for cfg in _legal_values(field, default_cfg):
            configs[f"{field.name}={getattr(cfg, field.name)!r}"] = cfg
    assert configs, f"{op}: nothing to try"

    for label, cfg in configs.items():
        if cfg == chosen:
            continue  # what `expected` was computed under
        with_grads = bool(argnums) and label.startswith(("candidate", "bwd_params"))
        with overlay_cache({kernel.op_id: cfg}):
            got = _results(call, args, argnums, with_grads)
        for i, (a, e) in enumerate(zip(got, expected, strict=False)):
            what = "output" if i < len(_float_leaves(expected)) else "gradient"
            assert a.shape == e.shape, f"{op} under {label}: {what} {i} shape {a.shape} != {e.shape}"
            err = relative_error(a, e)
            assert err <= TOLERANCE, f"{op} under {label}: {what} {i} changed by {err:.3g} (relative)"
    for cfg in refused:
        with overlay_cache({kernel.op_id: cfg}), pytest.raises(ValueError, match="block_size"):
            call(*args)
