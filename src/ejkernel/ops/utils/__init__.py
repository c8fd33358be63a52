"""Upstream's module path for the tiling parameter carriers (`ejkernel.ops.utils.datacarrier`)."""
