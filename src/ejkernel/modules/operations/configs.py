"""Every operation's config class at upstream's module path, and `BaseOperationConfig`, their base.

The list follows `ejkernel.modules.operations.__all__`, so a new op's config appears here by itself.
"""

import ejkernel.modules.operations as _operations
from ejkernel.ops.config import KernelConfig as BaseOperationConfig

__all__ = ["BaseOperationConfig", *(name for name in _operations.__all__ if name.endswith("Config"))]
globals().update({name: getattr(_operations, name) for name in __all__[1:]})
