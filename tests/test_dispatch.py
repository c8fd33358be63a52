"""Dispatch around config selection, with the toy ops of `selection_toys`: `platform="auto"` falling through
implementations, `platform=` with cached configs, mesh / in_specs / out_specs, custom VJPs, call signatures
and shipped tuned configs."""

import dataclasses
import functools
import json
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import custom_derivatives
from jax.sharding import Mesh, PartitionSpec

import ejkernel
from ejkernel import Backend, Platform, kernel_registry
from ejkernel.ops import (
    FwdParams,
    Invocation,
    Kernel,
    KernelConfig,
    overlay_cache,
)
from selection_toys import (
    HEURISTIC,
    OVERRIDE,
    TOY_OP,
    ToyKernel,
    ToySelectConfig,
    factor,
    make_executor,
    toy_cfg,
    toy_input,
    toy_key,
)

pytestmark = pytest.mark.lowest

# --- platform "auto": falling through implementations ------------------------------------------------

FALL_OP = "toy_fallthrough_op"
NONE_OP = "toy_no_accepting_impl_op"


def _never_on_cpu(*args, **kwargs):
    raise AssertionError("a GPU-only implementation was called on the CPU")


def _refuses(reason):
    def impl(x, cfg):
        raise NotImplementedError(reason)

    return impl


kernel_registry.register(FALL_OP, Platform.CUDA, Backend.GPU, priority=100)(_never_on_cpu)
kernel_registry.register(FALL_OP, Platform.TRITON, Backend.ANY, priority=10)(_refuses("needs head_dim 128"))
kernel_registry.register(FALL_OP, Platform.PALLAS, Backend.CPU, priority=5)(_refuses("no float32 support"))
kernel_registry.register(FALL_OP, Platform.XLA, Backend.ANY, priority=0)(lambda x, cfg: x * 7)
kernel_registry.register(NONE_OP, Platform.CUDA, Backend.GPU, priority=100)(_never_on_cpu)
kernel_registry.register(NONE_OP, Platform.TRITON, Backend.ANY, priority=10)(_refuses("reason one"))
kernel_registry.register(NONE_OP, Platform.XLA, Backend.ANY, priority=0)(_refuses("reason two"))


@dataclasses.dataclass(frozen=True)
class ToyConfig(KernelConfig):
    """The config of this module's toy ops (none of them is tiled)."""


class FallKernel(Kernel):
    op_id = FALL_OP
    config_type = ToyConfig


class NoneKernel(Kernel):
    op_id = NONE_OP
    config_type = ToyConfig


def test_auto_falls_through_not_implemented_to_next():
    x = toy_input()
    assert factor(make_executor()(FallKernel(), x), x) == 7
    assert factor(make_executor()(FallKernel(), x, platform="xla"), x) == 7


class PreferringKernel(FallKernel):
    """Its heuristic prefers the Triton implementation, which declines every call."""

    def heuristic_cfg(self, inv):
        return ToyConfig(platform="triton") if inv.platform == "auto" else ToyConfig(platform=inv.platform)


def test_a_preferred_platform_that_declines_falls_back_to_auto_order(caplog):
    x = toy_input()
    with caplog.at_level("DEBUG", logger="ejkernel.dispatch"):
        assert factor(make_executor()(PreferringKernel(), x), x) == 7
    expected = "xla serves the call (platform='triton' preferred); declined first: triton: needs head_dim 128"
    assert any(expected in message for message in caplog.messages), caplog.messages


def test_a_platform_the_caller_names_does_not_fall_back():
    with pytest.raises(NotImplementedError, match="needs head_dim 128"):
        make_executor()(PreferringKernel(), toy_input(), cfg=ToyConfig(platform="triton"))


def test_explicit_platform_does_not_fall_through():
    with pytest.raises(NotImplementedError, match="needs head_dim 128"):
        make_executor()(FallKernel(), toy_input(), platform="triton")


def test_explicit_platform_without_implementation_lists_what_exists():
    with pytest.raises(ValueError, match="xla/any"):
        make_executor()(FallKernel(), toy_input(), platform="cuda")


def test_auto_with_no_accepting_impl_lists_every_reason():
    """The error is upstream's `EjkernelRuntimeError` and a `NotImplementedError` (how an implementation declines)."""
    from ejkernel import EjkernelRuntimeError

    with pytest.raises(NotImplementedError) as err:
        make_executor()(NoneKernel(), toy_input())
    assert isinstance(err.value, EjkernelRuntimeError)
    message = str(err.value)
    assert NONE_OP in message
    assert "reason one" in message and "reason two" in message
    assert "triton" in message and "xla" in message


# --- platform= with configs from the caches -----------------------------------------------------------

PLAT_OP = "toy_two_platform_op"
kernel_registry.register(PLAT_OP, Platform.TRITON, Backend.ANY, priority=10)(lambda x, cfg: x * 3)
kernel_registry.register(PLAT_OP, Platform.XLA, Backend.ANY, priority=0)(lambda x, cfg: x * 5)


class TwoPlatformKernel(Kernel):
    op_id = PLAT_OP
    config_type = ToyConfig


def test_platform_argument_picks_the_implementation():
    x = toy_input()
    assert factor(make_executor()(TwoPlatformKernel(), x), x) == 3
    assert factor(make_executor()(TwoPlatformKernel(), x, platform="xla"), x) == 5
    assert factor(make_executor()(TwoPlatformKernel(), x, cfg=ToyConfig(platform="xla")), x) == 5
    assert factor(make_executor()(TwoPlatformKernel(), x, cfg=ToyConfig(), platform="xla"), x) == 5


def test_platform_argument_is_honoured_with_an_overlay_config():
    """An op-wide overlay config with platform "auto" must not undo `platform="xla"` of the call."""
    x = toy_input()
    with overlay_cache({PLAT_OP: ToyConfig()}):
        assert factor(make_executor()(TwoPlatformKernel(), x, platform="xla"), x) == 5


# --- mesh / in_specs / out_specs ---------------------------------------------------------------------


def _mesh():
    return Mesh(np.array(jax.devices()[:2]), ("x",))


@pytest.mark.parametrize(
    "given",
    [
        ("mesh",),
        ("in_specs",),
        ("out_specs",),
        ("mesh", "in_specs"),
        ("mesh", "out_specs"),
        ("in_specs", "out_specs"),
    ],
)
def test_partial_sharding_arguments_are_value_error(given):
    values = {"mesh": _mesh(), "in_specs": (PartitionSpec("x"),), "out_specs": PartitionSpec("x")}
    kwargs = {name: values[name] for name in given}
    with pytest.raises(ValueError, match="mesh, in_specs and out_specs") as err:
        make_executor()(ToyKernel(), toy_input(), **kwargs)
    tail = str(err.value).split("got only", 1)[1]
    for name in ("mesh", "in_specs", "out_specs"):
        assert (name in tail) == (name in given), (name, str(err.value))


def test_full_sharding_arguments_run_under_shard_map():
    x = jnp.arange(1.0, 9.0, dtype=jnp.float32)
    spec = PartitionSpec("x")
    executor = make_executor()
    out = executor(ToyKernel(), x, cfg=toy_cfg(OVERRIDE), mesh=_mesh(), in_specs=(spec,), out_specs=spec)
    assert factor(out, x) == OVERRIDE
    with pytest.raises(ValueError, match="in_specs"):
        make_executor()(ToyKernel(), x, mesh=_mesh(), in_specs=(spec, spec), out_specs=spec)


# --- custom VJP --------------------------------------------------------------------------------------

VJP_OP = "toy_vjp_op"
kernel_registry.register(VJP_OP, Platform.XLA, Backend.ANY)(lambda x, cfg: x * 2)


class VjpKernel(Kernel):
    """Forward doubles; the custom backward says 3·g, which autodiff of the forward never would."""

    op_id = VJP_OP
    config_type = ToyConfig

    def __init__(self):
        self.bwd_cfgs = []

    def fwd_with_residuals(self, x, *, cfg):
        return self.run(x, cfg=cfg), None

    def vjp(self, residuals, g, *, cfg):
        self.bwd_cfgs.append(cfg)
        return (3 * g,)


class ForwardOnlyKernel(Kernel):
    op_id = VJP_OP
    config_type = ToyConfig

    def fwd_with_residuals(self, x, *, cfg):
        raise AssertionError("without a vjp the custom rule must not be wired")


def test_custom_vjp_is_used_by_grad():
    kernel, executor, x = VjpKernel(), make_executor(), toy_input()
    cfg = ToyConfig(platform="xla")
    assert factor(executor(kernel, x), x) == 2
    grad = jax.grad(lambda v: executor(kernel, v, cfg=cfg).sum())(x)
    np.testing.assert_allclose(grad, 3 * np.ones(4))
    assert kernel.bwd_cfgs == [cfg]  # the backward gets the config the forward ran with
    grad = jax.jit(jax.grad(lambda v: (executor(kernel, v) * v).sum()))(x)
    np.testing.assert_allclose(grad, 3 * np.asarray(x) + 2 * np.asarray(x))


def test_custom_vjp_with_vjp_function():
    kernel, executor, x = VjpKernel(), make_executor(), toy_input()
    cotangent = jnp.asarray([0.5, -1.0, 2.0, 3.0])
    out, pullback = jax.vjp(lambda v: executor(kernel, v), x)
    np.testing.assert_allclose(out, 2 * np.asarray(x))
    np.testing.assert_allclose(pullback(cotangent)[0], 3 * np.asarray(cotangent))


def test_without_vjp_autodiff_of_run_is_used():
    grad = jax.grad(lambda v: make_executor()(ForwardOnlyKernel(), v).sum())(toy_input())
    np.testing.assert_allclose(grad, 2 * np.ones(4))


def test_signature_describes_arrays_by_shape_and_dtype():
    # The invocation signature describes arrays by shape and dtype only: equal shapes share a key.
    a, b = toy_input(), toy_input() * 3
    assert toy_key(a) == toy_key(b)
    assert toy_key(a) != toy_key(a.astype(jnp.bfloat16))
    sig = json.loads(Invocation(TOY_OP, (a,), {"scale": 0.5}).signature)
    assert sig["args"] == [[[4], "float32"]] and sig["kwargs"] == {"scale": 0.5}


def test_shipped_tuned_config_beats_the_heuristic(monkeypatch):
    """Tier 6: a config shipped for this device kind (ops/tuned/<kind>.json) is used before heuristic_cfg."""
    import ejkernel.ops.executor as executor_module

    x = toy_input()
    shipped = ToySelectConfig(platform="auto", fwd_params=FwdParams(block_q=8))
    signature = Invocation(TOY_OP, (x,), {}, "auto").signature
    monkeypatch.setattr(executor_module, "_shipped_configs", lambda kind: {f"{TOY_OP}|{signature}": shipped.to_json()})
    assert factor(make_executor()(ToyKernel(), x), x) == 8
    other = jnp.arange(1.0, 9.0, dtype=jnp.float32)  # another signature: not shipped, heuristics
    assert factor(make_executor()(ToyKernel(), other), other) == HEURISTIC


# --- check once: the public functions' executor marks its calls checked ------------------------------------


def _rand(i: int, *shape):
    return jax.random.normal(jax.random.PRNGKey(i), shape, jnp.float32)


def _decay(i: int, *shape):
    return -jax.nn.softplus(_rand(i, *shape))


def _strength(i: int, *shape):
    return jax.nn.sigmoid(_rand(i, *shape))


_QKV = (_rand(1, 1, 8, 2, 4), _rand(2, 1, 8, 2, 4), _rand(3, 1, 8, 2, 4))
_SSM1 = (_rand(4, 1, 8, 3), _decay(5, 3, 2), _rand(6, 1, 8, 2), _rand(7, 1, 8, 2), _rand(8, 3), _strength(9, 1, 8, 3))
LINEAR_CHECK = "ejkernel.kernels._common.linear_attention.checks.check_qkv"  # inside check_linear_call
STATE_SPACE_CHECK = "ejkernel.kernels._common.state_space._check_options"  # inside check_v1 and check_v2

# op id: (public function name, its arguments, keyword options, a function every check calls). One op per entry
# path: the gated linear ops (GLA, lightning, recurrent) share one entry, the delta rules another, the two state
# space ops one check.
CHECKED_ONCE = {
    "gla": ("gla_attention", (*_QKV, _decay(10, 1, 8, 2, 4)), {}, LINEAR_CHECK),
    "gated_delta_rule": ("gated_delta_rule", (*_QKV, _strength(10, 1, 8, 2)), {}, LINEAR_CHECK),
    "state_space_v1": ("state_space_v1", _SSM1, {}, STATE_SPACE_CHECK),
}


@pytest.mark.parametrize("op", sorted(CHECKED_ONCE))
def test_a_public_call_is_checked_once(op, monkeypatch):
    """The public function checks the call; the implementation the executor reaches for it does not again
    (forward, or differentiated), while the same implementation called directly checks it."""
    import ejkernel.modules as modules

    name, args, options, check = CHECKED_ONCE[op]
    module, _, function = check.rpartition(".")
    checked = getattr(__import__(module, fromlist=[function]), function)
    calls = []
    monkeypatch.setattr(check, lambda *a, **k: calls.append(1) or checked(*a, **k))
    public = getattr(modules, name)
    first = lambda out: out[0] if isinstance(out, tuple) else out
    out = first(public(*args, platform="xla", **options))
    jax.grad(lambda x: jnp.sum(first(public(x, *args[1:], platform="xla", **options))))(args[0])
    assert len(calls) == 2  # one per public call
    direct = first(kernel_registry.get(op, "xla")(*args, **options))
    assert len(calls) == 3
    np.testing.assert_allclose(direct, out, rtol=1e-6, atol=1e-6)


def test_the_gla_scale_is_resolved_once(monkeypatch):
    """The public function resolves `softmax_scale`; the entry it reaches takes it as given, while the same entry
    called directly resolves it."""
    import importlib

    from ejkernel.kernels._common.linear_attention import entries
    from ejkernel.modules import gla_attention

    calls, resolve = [], entries.resolve_scale
    counted = lambda *a: calls.append(1) or resolve(*a)
    monkeypatch.setattr(importlib.import_module("ejkernel.modules.operations.gla_attention"), "resolve_scale", counted)
    monkeypatch.setattr(entries, "resolve_scale", counted)
    args = CHECKED_ONCE["gla"][1]
    out = gla_attention(*args, platform="xla")
    assert len(calls) == 1
    direct = kernel_registry.get("gla", "xla")(*args)
    assert len(calls) == 2
    np.testing.assert_allclose(direct, out, rtol=1e-6, atol=1e-6)


class _KernelReached(Exception):
    pass


def _frames_to_kernel_vjp(monkeypatch, public, *args, **options) -> list[str]:
    """The ejkernel frames from `public`'s own to the one that calls its kernel's custom VJP (the first
    `jax.custom_vjp` outside the executor, whose per-mode VJP is not the kernel's), stopped there."""
    root = str(pathlib.Path(ejkernel.__file__).parent)
    path, call = [], custom_derivatives.custom_vjp.__call__

    def reached(self, *a, **k):
        fun = self.fun
        while isinstance(fun, functools.partial):
            fun = fun.func
        if fun.__module__ == "ejkernel.ops.executor":  # the executor's per-mode VJP
            return call(self, *a, **k)
        frame = sys._getframe(1)
        while frame.f_code.co_name != public.__name__ or "modules/operations" not in frame.f_code.co_filename:
            if frame.f_code.co_filename.startswith(root):
                path.append(frame.f_code.co_name)
            frame = frame.f_back
        path.append(public.__name__)
        raise _KernelReached

    monkeypatch.setattr(custom_derivatives.custom_vjp, "__call__", reached)
    with pytest.raises(_KernelReached):
        public(*args, **options)
    return path[::-1]


@pytest.mark.parametrize("platform", ["xla", "triton"])
def test_gla_reaches_its_kernel_in_seven_frames(platform, monkeypatch):
    """From `gla_attention` to its kernel's custom VJP: 7 frames, flash attention's count (issue 41): the public
    function, the executor's three (`__call__`, `_run`, `Kernel.run`), the entry, the family's driver and the
    engine's form that calls the kernel. The Triton path is traced as on a GPU and stopped at the custom VJP,
    before any kernel."""
    from ejkernel.modules import flash_attention, gla_attention

    if platform == "triton":
        monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    q, k, v, g = (_rand(i, 1, 32, 2, 16) for i in range(4))  # head dims the Triton kernels take
    gla = _frames_to_kernel_vjp(monkeypatch, gla_attention, q, k, v, -jax.nn.softplus(g), platform=platform)
    engine_form = {"xla": "chunked", "triton": "gated"}[platform]
    assert gla == ["gla_attention", "__call__", "_run", "run", "gla_attention", "linear_attention", engine_form]
    assert len(_frames_to_kernel_vjp(monkeypatch, flash_attention, *_QKV, platform="xla")) == len(gla)


@pytest.mark.parametrize("op", ["flash_attention", "blocksparse_attention", "grouped_matmul", "gla_attention"])
def test_a_trainable_call_traces_one_custom_vjp_its_implementations(op, monkeypatch):
    """Issue 41: one custom VJP per trainable call. Where a call's forward and training modes select one config
    (no tuning), its gradient traces the implementation's custom VJP alone, none of the executor's per-mode one
    (the demo's call of each op whose configs tile a backward; `test_selection` covers the modes that differ)."""
    from ejkernel.demo import demo_cases

    case = next(c for c in demo_cases() if c.op == op)
    args, options = case.make_inputs(jax.random.PRNGKey(0))
    floats = [i for i, a in enumerate(args) if hasattr(a, "dtype") and jnp.issubdtype(a.dtype, jnp.floating)]
    call, traced, vjp_call = case.call({**options, "platform": "xla"}), [], custom_derivatives.custom_vjp.__call__

    def loss(diff):
        return jnp.sum(call(*(diff.get(i, a) for i, a in enumerate(args))).astype(jnp.float32))

    def tracing(self, *a, **k):
        fun = self.fun
        while isinstance(fun, functools.partial):
            fun = fun.func
        traced.append(fun.__module__)
        return vjp_call(self, *a, **k)

    monkeypatch.setattr(custom_derivatives.custom_vjp, "__call__", tracing)
    jax.make_jaxpr(jax.grad(loss))({i: args[i] for i in floats})
    assert traced and traced[0].startswith("ejkernel.kernels.") and "ejkernel.ops.executor" not in traced


MARK_OP = "toy_checked_mark_op"


def test_only_the_public_functions_executor_marks_calls_checked():
    """`arguments_checked` names one op, and holds only while a `checked` executor runs it."""
    from ejkernel.checked_calls import arguments_checked
    from ejkernel.ops import Executor

    seen = []

    def impl(x, cfg):
        seen.append((arguments_checked(MARK_OP), arguments_checked(TOY_OP)))
        return x

    kernel_registry.register(MARK_OP, Platform.XLA, Backend.ANY)(impl)
    kernel = Kernel(MARK_OP)
    Executor(checked=True)(kernel, toy_input())
    Executor()(kernel, toy_input())
    assert seen == [(True, False), (False, False)] and not arguments_checked(MARK_OP)
