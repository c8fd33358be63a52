"""Plain-JAX implementations: run on every device, memory-linear where it matters."""
