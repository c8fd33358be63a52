"""Pallas Mosaic kernels: TPU kernels (`tpu/`) and Mosaic GPU kernels for Hopper-class GPUs (`gpu/`)."""
