"""Pallas kernels lowered through Triton (CUDA GPUs; interpret mode elsewhere)."""
