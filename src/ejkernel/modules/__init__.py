"""The public index: every operation's function, `Kernel` class and config."""

import ejkernel.kernels  # noqa: F401  (registers every implementation)
from ejkernel.modules.operations.mean_pooling import MeanPooling, MeanPoolingConfig, mean_pooling
from ejkernel.ops import create_default_executor

__all__ = ["MeanPooling", "MeanPoolingConfig", "create_default_executor", "mean_pooling"]
