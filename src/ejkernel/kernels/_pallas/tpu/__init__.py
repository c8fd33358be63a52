"""Pallas Mosaic TPU kernels, one folder per op; importing an op folder registers it."""
