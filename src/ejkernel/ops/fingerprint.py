"""Device fingerprint: what a measured config depends on, so a cache never crosses devices or versions."""

from __future__ import annotations

import functools
import hashlib

import jax
import jaxlib

from ejkernel import version
from ejkernel.registry import current_backend


def _runtime_version(device) -> str:
    try:
        return str(device.client.platform_version)
    except AttributeError:
        return "unknown"


def _memory_bytes(device) -> int:
    try:
        stats = device.memory_stats() or {}
    except (AttributeError, RuntimeError, NotImplementedError):
        stats = {}
    return int(stats.get("bytes_limit", 0))


def get_device_platform(device=None) -> str:
    """`"gpu"`, `"tpu"` or `"cpu"`: the kind of `device` (default: JAX's default device)."""
    return current_backend(device).value


def describe_device(device=None) -> dict[str, str]:
    """The fields of the fingerprint, readable (shown by `ejkernel info`)."""
    device = device if device is not None else jax.devices()[0]
    return {
        "platform": str(device.platform),
        "device_kind": str(device.device_kind),
        "memory_bytes": str(_memory_bytes(device)),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "runtime": _runtime_version(device),
        "ejkernel": version.__version__,
    }


def device_fingerprint(device=None) -> str:
    """A short stable id of (device kind, memory, platform, jax/jaxlib/runtime and ejkernel versions).

    The readable device kind leads, so cache files stay legible: `NVIDIA_H100_80GB_HBM3-1a2b3c4d5e6f`.
    """
    if device is None:
        return _default_fingerprint()
    fields = describe_device(device)
    digest = hashlib.sha256("|".join(f"{k}={v}" for k, v in sorted(fields.items())).encode()).hexdigest()
    kind = "".join(c if c.isalnum() else "_" for c in fields["device_kind"])
    return f"{kind}-{digest[:12]}"


@functools.cache
def _default_fingerprint() -> str:
    return device_fingerprint(jax.devices()[0])
