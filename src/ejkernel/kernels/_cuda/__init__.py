"""Routes to vendor libraries reached through XLA (cuDNN fused attention, ...)."""
