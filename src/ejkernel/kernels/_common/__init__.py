"""Numerics shared by the implementations of every platform (plain `jnp` code that also runs in Pallas kernels)."""
