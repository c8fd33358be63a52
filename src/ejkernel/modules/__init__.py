"""The public index: every operation's function, `Kernel` class and config, and the default executor."""

from ejkernel.modules.operations import *  # noqa: F403  (the ops, listed once in operations/__init__.py)
from ejkernel.modules.operations import __all__ as _operations
from ejkernel.ops import create_default_executor

__all__ = [*_operations, "create_default_executor"]
