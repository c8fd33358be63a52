"""What the GPU kernels ask of the device they trace for: its SM count and whether it is a Hopper GPU."""

import jax

DEFAULT_SMS = 132
"""An H100 SXM's and an H200's SM count: the count used off a GPU (CPU tests, CUDA lowering) or where the device
does not say."""


def num_sms() -> int:
    """The first device's SM count (`DEFAULT_SMS` off a GPU, or where the device does not say): kernels size their
    grids and splits to it."""
    device = jax.devices()[0]
    return int(getattr(device, "core_count", 0) or DEFAULT_SMS) if device.platform == "gpu" else DEFAULT_SMS


def is_hopper() -> bool:
    """Whether the first device is a Hopper GPU (compute capability 9.x), which the Mosaic GPU kernels need."""
    device = jax.devices()[0]
    return device.platform == "gpu" and str(getattr(device, "compute_capability", "")).startswith("9.")
