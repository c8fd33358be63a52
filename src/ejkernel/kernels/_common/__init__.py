"""Numerics shared by the implementations of every platform (plain `jnp` code that also runs in Pallas kernels)."""

SMEM_BYTES = 227 * 1024  # shared memory one thread block may use on Hopper (H100, H200)
