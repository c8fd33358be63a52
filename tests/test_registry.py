"""The kernel registry: priorities, replacement, filters, errors, listings and the op modules' declarations."""

import importlib
import inspect
import json
import pkgutil

import pytest

from ejkernel import Backend, KernelRegistry, Platform, kernel_registry
from ejkernel.ops import Kernel
from ejkernel.registry import current_backend, declared_implementations, implementations

pytestmark = pytest.mark.lowest


def _tagged(tag):
    """A distinct implementation function that says which registration it is."""

    def fn(*args, **kwargs):
        return tag

    fn.tag = tag
    return fn


@pytest.fixture
def registry():
    return KernelRegistry()


def test_host_is_cpu():
    # The filters below assume this CPU-only host; a GPU host runs the GPU suite instead.
    assert current_backend() is Backend.CPU


def test_register_is_a_decorator_returning_the_function(registry):
    fn = _tagged("xla")
    assert registry.register("algo", Platform.XLA, Backend.ANY)(fn) is fn
    assert registry.get("algo") is fn


def test_register_accepts_strings(registry):
    fn = _tagged("xla")
    registry.register("algo", "xla", "any")(fn)
    impl = registry.list_implementations("algo")[0]
    assert impl.platform is Platform.XLA and impl.backend is Backend.ANY


def test_register_rejects_unknown_platform_and_backend(registry):
    with pytest.raises(ValueError):
        registry.register("algo", "opencl", "any")
    with pytest.raises(ValueError):
        registry.register("algo", "xla", "npu")


def test_higher_priority_wins(registry):
    low, high = _tagged("low"), _tagged("high")
    registry.register("algo", Platform.XLA, Backend.ANY, priority=1)(low)
    registry.register("algo", Platform.PALLAS, Backend.CPU, priority=5)(high)
    assert registry.get("algo") is high
    # Registration order does not matter, only the priority.
    other = KernelRegistry()
    other.register("algo", Platform.PALLAS, Backend.CPU, priority=5)(high)
    other.register("algo", Platform.XLA, Backend.ANY, priority=1)(low)
    assert other.get("algo") is high
    assert [i.fn for i in other.list_implementations("algo")] == [high, low]


def test_negative_priority_loses_to_default(registry):
    neg, default = _tagged("neg"), _tagged("default")
    registry.register("algo", Platform.PALLAS, Backend.CPU, priority=-3)(neg)
    registry.register("algo", Platform.XLA, Backend.ANY)(default)
    assert registry.get("algo") is default


def test_reregister_replaces_same_platform_and_backend(registry):
    first, second = _tagged("first"), _tagged("second")
    registry.register("algo", Platform.XLA, Backend.ANY, priority=7)(first)
    registry.register("algo", Platform.XLA, Backend.ANY, priority=0)(second)
    impls = registry.list_implementations("algo")
    assert len(impls) == 1
    assert impls[0].fn is second and impls[0].priority == 0
    assert registry.get("algo") is second


def test_reregister_with_new_priority_reorders(registry):
    xla, pallas, pallas2 = _tagged("xla"), _tagged("pallas"), _tagged("pallas2")
    registry.register("algo", Platform.XLA, Backend.ANY, priority=5)(xla)
    registry.register("algo", Platform.PALLAS, Backend.CPU, priority=1)(pallas)
    assert registry.get("algo") is xla
    registry.register("algo", Platform.PALLAS, Backend.CPU, priority=9)(pallas2)
    assert registry.get("algo") is pallas2
    assert [i.fn for i in registry.list_implementations("algo")] == [pallas2, xla]


def test_same_platform_different_backend_are_distinct(registry):
    tpu, gpu = _tagged("tpu"), _tagged("gpu")
    registry.register("algo", Platform.PALLAS, Backend.TPU)(tpu)
    registry.register("algo", Platform.PALLAS, Backend.GPU)(gpu)
    assert len(registry.list_implementations("algo")) == 2
    assert registry.get("algo", backend="tpu") is tpu
    assert registry.get("algo", backend=Backend.GPU) is gpu


def test_get_filters_by_platform(registry):
    xla, triton, pallas = _tagged("xla"), _tagged("triton"), _tagged("pallas")
    registry.register("algo", Platform.XLA, Backend.ANY, priority=0)(xla)
    registry.register("algo", Platform.TRITON, Backend.GPU, priority=10)(triton)
    registry.register("algo", Platform.PALLAS, Backend.ANY, priority=5)(pallas)
    assert registry.get("algo", platform="xla") is xla
    assert registry.get("algo", platform=Platform.PALLAS) is pallas
    assert registry.get("algo", platform="triton", backend="gpu") is triton


def test_get_filters_by_backend(registry):
    xla, triton, tpu = _tagged("xla"), _tagged("triton"), _tagged("tpu")
    registry.register("algo", Platform.XLA, Backend.ANY, priority=0)(xla)
    registry.register("algo", Platform.TRITON, Backend.GPU, priority=10)(triton)
    registry.register("algo", Platform.PALLAS, Backend.TPU, priority=20)(tpu)
    assert registry.get("algo", backend="gpu") is triton
    assert registry.get("algo", backend="tpu") is tpu
    # An ANY implementation serves every backend; a GPU one does not serve the CPU.
    assert registry.get("algo", backend="cpu") is xla
    assert registry.get("algo", backend="any") is xla


def test_get_without_filters_never_returns_gpu_only_impl_on_cpu(registry):
    xla, triton, cuda, tpu = _tagged("xla"), _tagged("triton"), _tagged("cuda"), _tagged("tpu")
    registry.register("algo", Platform.TRITON, Backend.GPU, priority=100)(triton)
    registry.register("algo", Platform.CUDA, Backend.GPU, priority=50)(cuda)
    registry.register("algo", Platform.PALLAS, Backend.TPU, priority=40)(tpu)
    registry.register("algo", Platform.XLA, Backend.ANY, priority=0)(xla)
    assert registry.get("algo") is xla
    assert [i.fn for i in registry.candidates("algo")] == [xla]


def test_get_prefers_cpu_specific_over_any_by_priority(registry):
    xla, cpu = _tagged("xla"), _tagged("cpu")
    registry.register("algo", Platform.XLA, Backend.ANY, priority=0)(xla)
    registry.register("algo", Platform.PALLAS, Backend.CPU, priority=3)(cpu)
    assert registry.get("algo") is cpu


def test_get_platform_filter_alone_still_respects_current_device(registry):
    registry.register("algo", Platform.XLA, Backend.ANY)(_tagged("xla"))
    registry.register("algo", Platform.TRITON, Backend.GPU)(_tagged("triton"))
    with pytest.raises(ValueError, match="triton") as err:
        registry.get("algo", platform="triton")
    assert "cpu" in str(err.value)  # says what the current device is


def test_only_gpu_impls_on_cpu_is_value_error_listing_them(registry):
    registry.register("gpu_only", Platform.TRITON, Backend.GPU, priority=10)(_tagged("triton"))
    registry.register("gpu_only", Platform.CUDA, Backend.GPU, priority=2)(_tagged("cuda"))
    with pytest.raises(ValueError) as err:
        registry.get("gpu_only")
    message = str(err.value)
    assert "gpu_only" in message
    assert "triton/gpu" in message and "cuda/gpu" in message


def test_unknown_algorithm_lists_registered_algorithms(registry):
    registry.register("alpha", Platform.XLA, Backend.ANY)(_tagged("a"))
    registry.register("beta", Platform.XLA, Backend.ANY)(_tagged("b"))
    with pytest.raises(ValueError) as err:
        registry.get("gamma")
    message = str(err.value)
    assert "gamma" in message and "alpha" in message and "beta" in message


def test_unknown_algorithm_in_empty_registry(registry):
    with pytest.raises(ValueError, match="gamma"):
        registry.get("gamma")


def test_no_match_lists_every_registered_implementation(registry):
    registry.register("algo", Platform.XLA, Backend.ANY, priority=0)(_tagged("xla"))
    registry.register("algo", Platform.TRITON, Backend.GPU, priority=10)(_tagged("triton"))
    with pytest.raises(ValueError) as err:
        registry.get("algo", platform="cuda")
    message = str(err.value)
    assert "xla/any" in message and "triton/gpu" in message
    assert "cuda" in message
    with pytest.raises(ValueError, match="xla/any"):
        registry.get("algo", platform="pallas", backend="tpu")


def test_list_algorithms_sorted(registry):
    assert registry.list_algorithms() == []
    registry.register("zeta", Platform.XLA, Backend.ANY)(_tagged("z"))
    registry.register("alpha", Platform.XLA, Backend.ANY)(_tagged("a"))
    registry.register("alpha", Platform.TRITON, Backend.GPU)(_tagged("a2"))
    assert registry.list_algorithms() == ["alpha", "zeta"]


def test_list_implementations_includes_every_device_best_first(registry):
    xla, triton = _tagged("xla"), _tagged("triton")
    registry.register("algo", Platform.XLA, Backend.ANY, priority=0)(xla)
    registry.register("algo", Platform.TRITON, Backend.GPU, priority=10)(triton)
    impls = registry.list_implementations("algo")
    assert [(i.platform, i.backend, i.priority, i.fn) for i in impls] == [
        (Platform.TRITON, Backend.GPU, 10, triton),
        (Platform.XLA, Backend.ANY, 0, xla),
    ]
    assert all(i.algorithm == "algo" for i in impls)
    assert impls[0].describe() == "triton/gpu (priority 10)"
    # The listing is a copy: changing it does not change the registry.
    impls.clear()
    assert len(registry.list_implementations("algo")) == 2
    assert registry.list_implementations("missing") == []


def test_registries_are_independent(registry):
    registry.register("toy_registry_private_algo", Platform.XLA, Backend.ANY)(_tagged("x"))
    assert "toy_registry_private_algo" not in kernel_registry.list_algorithms()


def test_global_registry_has_mean_pooling():
    import ejkernel.modules  # noqa: F401  (registers every implementation)

    assert "mean_pooling" in kernel_registry.list_algorithms()
    pairs = {(i.platform, i.backend) for i in kernel_registry.list_implementations("mean_pooling")}
    assert (Platform.XLA, Backend.ANY) in pairs
    assert (Platform.TRITON, Backend.GPU) in pairs
    # On this CPU host the unfiltered choice is the XLA one, never the GPU kernel.
    xla = next(i for i in kernel_registry.list_implementations("mean_pooling") if i.platform is Platform.XLA)
    assert kernel_registry.get("mean_pooling") is xla.fn


def test_declared_implementations_rank_by_position_load_lazily_and_keep_registrations():
    declared = implementations(
        "algo",
        (Platform.TRITON, Backend.GPU, "no_such_module:kernel"),
        (Platform.XLA, Backend.ANY, "json:dumps"),
        (Platform.PALLAS, Backend.TPU, "json:loads"),
    )
    assert [i.priority for i in declared] == [100, 90, 80]
    registry = KernelRegistry(loader=lambda: declared)
    mine, cpu = _tagged("mine"), _tagged("cpu")
    registry.register("algo", Platform.PALLAS, Backend.TPU, priority=5)(mine)  # before the first lookup: kept
    registry.register("algo", Platform.PALLAS, Backend.CPU, priority=95)(cpu)  # between the declared ones
    impls = registry.list_implementations("algo")  # nothing imported: the Triton target does not exist
    assert [(i.platform, i.backend, i.priority) for i in impls] == [
        (Platform.TRITON, Backend.GPU, 100),
        (Platform.PALLAS, Backend.CPU, 95),
        (Platform.XLA, Backend.ANY, 90),
        (Platform.PALLAS, Backend.TPU, 5),
    ]
    assert registry.get("algo") is cpu
    assert registry.get("algo", "xla") is json.dumps
    assert registry.get("algo", "pallas", "tpu") is mine
    with pytest.raises(ModuleNotFoundError, match="no_such_module"):
        registry.get("algo", "triton", "gpu")
    with pytest.raises(ValueError, match="declared twice"):
        implementations("algo", (Platform.XLA, Backend.ANY, "json:dumps"), (Platform.XLA, Backend.ANY, "json:loads"))


def test_every_declared_target_imports_and_is_callable():
    declared = list(declared_implementations())
    assert len(declared) > 40  # every op module was found
    for impl in declared:
        assert isinstance(impl.target, str) and callable(impl.fn), impl


def test_declared_order_is_the_priority_order():
    declared = list(declared_implementations())
    for algorithm in {i.algorithm for i in declared}:
        order = [(i.platform, i.backend) for i in declared if i.algorithm == algorithm]
        registered = kernel_registry.list_implementations(algorithm)
        assert [(i.platform, i.backend) for i in registered] == order, algorithm
        assert [i.priority for i in registered] == list(range(100, 100 - 10 * len(order), -10)), algorithm


def test_each_op_module_declares_the_algorithms_of_its_kernels():
    operations = importlib.import_module("ejkernel.modules.operations")
    for info in pkgutil.iter_modules(operations.__path__, f"{operations.__name__}."):
        module = importlib.import_module(info.name)
        op_ids = {
            cls.op_id
            for cls in vars(module).values()
            if inspect.isclass(cls) and issubclass(cls, Kernel) and cls.__module__ == info.name and "op_id" in vars(cls)
        }
        assert {i.algorithm for i in getattr(module, "IMPLEMENTATIONS", ())} == op_ids, info.name
