"""Pallas Mosaic GPU kernels for Hopper-class GPUs, one folder per op (imported when an op first uses its kernel)."""
