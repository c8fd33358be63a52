"""The framework: kernels, invocations, config selection, autotuning, caches and device fingerprints."""

from ejkernel.ops.autotune import AutotunePolicy, Tuner, forward_autotune_only, policy_override
from ejkernel.ops.cache import ConfigCache, PersistentCache, overlay_cache
from ejkernel.ops.config import BwdParams, ConfigBase, FwdParams, KernelConfig
from ejkernel.ops.executor import (
    ConfigSelectorChain,
    Executor,
    create_default_executor,
    reset_caches,
)
from ejkernel.ops.fingerprint import device_fingerprint, get_device_platform
from ejkernel.ops.kernel import Invocation, Kernel

__all__ = [
    "AutotunePolicy",
    "BwdParams",
    "ConfigBase",
    "ConfigCache",
    "ConfigSelectorChain",
    "Executor",
    "FwdParams",
    "Invocation",
    "Kernel",
    "KernelConfig",
    "PersistentCache",
    "Tuner",
    "create_default_executor",
    "device_fingerprint",
    "forward_autotune_only",
    "get_device_platform",
    "overlay_cache",
    "policy_override",
    "reset_caches",
]
