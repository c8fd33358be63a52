"""Varying-manual-axes typing inside `shard_map`: what a kernel needs to run under `check_vma=True`.

Inside `jax.shard_map` every value carries the set of mesh axes over which it varies between devices.
Loop carries and branch results built from constants start out varying over none, and must be cast to
the type of the values computed from the inputs; the cotangent of an input replicated over an axis
must be summed over that axis. Outside `shard_map` (or with `check_vma=False`) every set is empty and
these helpers do nothing.
"""

from __future__ import annotations

import jax
from jax import lax


def varying_axes(*xs) -> frozenset:
    """Mesh axes over which any of `xs` varies (None and non-arrays count as varying over none)."""
    axes = frozenset()
    for x in xs:
        if x is None or not isinstance(x, jax.Array | jax.core.Tracer):
            continue
        manual = getattr(jax.typeof(x), "manual_axis_type", None)
        if manual is not None:
            axes |= manual.varying
    return axes


def vary(x, axes: frozenset):
    """`x` typed as varying over `axes` as well (None stays None)."""
    if x is None:
        return None
    missing = tuple(sorted(axes - varying_axes(x)))
    return lax.pcast(x, missing, to="varying") if missing else x


def sum_to_vma(ct, primal):
    """The cotangent of `primal`, summed over the axes it varies over but `primal` does not: the gradient
    of a value replicated across devices is the sum of every device's contribution."""
    if ct is None or primal is None:
        return ct
    extra = tuple(sorted(varying_axes(ct) - varying_axes(primal)))
    return lax.psum(ct, extra) if extra else ct


def out_struct(shape, dtype, *inputs) -> jax.ShapeDtypeStruct:
    """A `pallas_call` output shape, typed varying over every axis any of `inputs` varies over (inside
    `shard_map` with `check_vma=True`, Pallas needs to be told; elsewhere the type is ignored)."""
    axes = varying_axes(*inputs)
    manual = None
    for x in inputs:
        if x is not None and isinstance(x, jax.Array | jax.core.Tracer):
            manual = getattr(jax.typeof(x), "manual_axis_type", None)
            if manual is not None and manual.varying == axes:
                break
    if manual is not None and manual.varying != axes:
        manual = type(manual)(varying=axes)
    return jax.ShapeDtypeStruct(shape, dtype, manual_axis_type=manual)
