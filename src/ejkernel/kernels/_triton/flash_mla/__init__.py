"""The Pallas-Triton multi-head latent attention (absorbed forward kernel; XLA backward)."""

from ejkernel.kernels._triton.flash_mla._interface import flash_mla_triton

__all__ = ["flash_mla_triton"]
