"""`FwdParams` and `BwdParams` at upstream's module path; they accept upstream's field names too."""

from ejkernel.ops.config import BwdParams, FwdParams

__all__ = ["BwdParams", "FwdParams"]
