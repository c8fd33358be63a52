"""Pallas Mosaic GPU kernels for Hopper-class GPUs, one folder per op; importing an op folder registers it."""
