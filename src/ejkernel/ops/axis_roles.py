"""Which axes of an op's tensors a mesh may split, checked before a sharded call runs.

A kernel names the role of each axis of its tensors (`Kernel.axis_roles`): "batch", "heads", "queries",
"features" (axes each shard computes alone), a role the op computes across ("dim", "seq", "state", ...),
or None (left to the op's own checks). "role/n": that role in units of n entries that a shard must
hold whole (K and V heads interleaved along one axis: "heads/2"). Under `shard_map` every shard runs the
op on its block, so a split of the second kind, axes of one role split unlike each other (query heads but
not key/value heads: the grouped-query pairing shifts), or out_specs that place the result otherwise than
the inputs decide would each give a silent wrong answer. Here they are errors that name the argument, the
axis and the fix.
"""

from __future__ import annotations

import math
from typing import Any

import jax
from jax.sharding import PartitionSpec

SPLITTABLE = ("batch", "heads", "queries", "features")
WHY = {
    "dim": "the op contracts it (every shard would see a part of each dot product)",
    "seq": "the op relates positions along it (each shard would see only its own part of the sequence)",
    "state": "the recurrent state's products run along it (each shard would see a part of each)",
    "tokens": "packed sequences index across it (each shard would read other sequences' tokens)",
    "pages": "page tables index it globally (each shard would read the wrong pages)",
    "shared": "each value serves every head (split, most heads would read the wrong one)",
    "norm": "the gated RMS norm averages over it (each shard would normalise by its own part)",
    "taps": "the convolution sums over its taps (each shard would see a part of each sum)",
    "packed": "quantized codes and their scales are packed along it (a split would cut words and groups)",
}


def sink_roles(sinks, num_heads: int) -> tuple[str]:
    """The role of a 1-D sinks array: one logit per head (split with the heads), else shared by all."""
    return ("heads",) if sinks.shape[0] == num_heads else ("shared",)


def _axes(entry) -> tuple[str, ...]:
    """A spec entry as the mesh axes it names: None -> (), "x" -> ("x",), ("x", "y") -> itself."""
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, tuple | list) else (entry,)


def _padded(spec, rank: int) -> tuple:
    return tuple(spec) + (None,) * (rank - len(tuple(spec)))


def strip_unit_axes(spec: Any, mesh) -> Any:
    """`spec` without the mesh axes of size 1 (None stays None)."""
    if spec is None or mesh is None:
        return spec
    entries = []
    for entry in spec:
        names = tuple(name for name in _axes(entry) if mesh.shape[name] > 1)
        entries.append(None if not names else names[0] if len(names) == 1 else names)
    return PartitionSpec(*entries)


def splits(spec: Any) -> bool:
    """Whether a spec splits any axis (None, `P()` and `P(None, ...)` split nothing)."""
    return spec is not None and any(entry is not None for entry in spec)


def follow_roles(by_slot: dict[int, Any], roles) -> dict[int, Any]:
    """`by_slot` with every spec not given (None) filled in: each axis of a role each shard computes alone
    split as the given specs split that role (a per-head sinks array follows the query heads), every other
    axis unsplit."""
    inputs = roles[0] if roles is not None else {}
    seen: dict[str, Any] = {}
    for position, (_, axis_roles) in inputs.items():
        spec = by_slot.get(position) if not isinstance(position, str) else None
        if spec is None:
            continue
        for role, entry in zip(axis_roles, _padded(spec, len(axis_roles)), strict=False):
            if role is not None and entry is not None and role.split()[0] in SPLITTABLE:
                seen.setdefault(role.partition("/")[0], entry)
    filled = {}
    for position, spec in by_slot.items():
        if spec is None:
            axis_roles = inputs.get(position, (None, ()))[1]
            role_of = lambda role: None if role is None else role.partition("/")[0]
            spec = PartitionSpec(*(seen.get(role_of(role)) for role in axis_roles))
        filled[position] = spec
    return filled


def check_axis_roles(
    op_id: str, mesh: jax.sharding.Mesh, args, kwargs, by_slot: dict[int, Any], roles, out_specs, kwarg_specs=None
):
    """`roles = (inputs, output)`: inputs `{position or keyword: (name, (role or None per axis))}` (array
    keyword options laid out as `kwarg_specs` says, `Kernel.kwarg_specs`; replicated where it names none),
    output a pytree of role tuples matching `out_specs` (or None: unchecked). Raises ValueError on any split
    that would change the answer."""
    inputs, output = roles
    kwarg_specs = kwarg_specs or {}
    seen: dict[str, tuple[tuple[str, ...], str]] = {}
    for position, (name, axis_roles) in inputs.items():
        keyword = isinstance(position, str)
        array = kwargs.get(position) if keyword else args[position]
        if array is None or (not keyword and position not in by_slot):
            continue
        spec = _padded(kwarg_specs.get(position, PartitionSpec()) if keyword else by_slot[position], len(axis_roles))
        for axis, role in enumerate(axis_roles):
            entry = _axes(spec[axis])
            if role is None:
                continue
            role, _, unit = role.partition("/")
            unit = int(unit or 1)
            where = f"{name}'s axis {axis} ({role})"
            if entry and role.split()[0] not in SPLITTABLE:  # "features 2": one of several feature axes
                raise ValueError(
                    f"{op_id}: in_specs split {where} over {entry}, but {WHY.get(role, 'the op computes across it')}; "
                    "leave it unsplit"
                )
            shards = math.prod(mesh.shape[a] for a in entry)
            if array.shape[axis] % (shards * unit):
                whole = f" into whole groups of {unit}" if unit > 1 else ""
                raise ValueError(
                    f"{op_id}: in_specs split {where}, of size {array.shape[axis]}, over {entry} "
                    f"({shards} shards), which do not divide it{whole}"
                )
            first = seen.setdefault(role, (entry, where))
            if first[0] != entry:
                split = lambda axes: f"split over {axes}" if axes else "unsplit"
                raise ValueError(
                    f"{op_id}: in_specs have {where} {split(entry)} but {first[1]} {split(first[0])}; "
                    f"every {role} axis must be split alike"
                )
    if output is None:
        return
    is_roles = lambda x: isinstance(x, tuple) and all(r is None or isinstance(r, str) for r in x)
    expected = jax.tree_util.tree_map(
        lambda r: PartitionSpec(*(seen.get(role, ((),))[0] or None for role in r)), output, is_leaf=is_roles
    )
    given = jax.tree_util.tree_leaves(out_specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
    wanted = jax.tree_util.tree_leaves(expected, is_leaf=lambda x: isinstance(x, PartitionSpec))
    for i, (got, want) in enumerate(zip(given, wanted, strict=False)):
        got = strip_unit_axes(got, mesh)
        rank = max(len(tuple(got)), len(tuple(want)))
        if [_axes(e) for e in _padded(got, rank)] != [_axes(e) for e in _padded(want, rank)]:
            which = "out_specs" if len(wanted) == 1 else f"out_specs[{i}]"
            raise ValueError(
                f"{op_id}: {which} = {got}, but the inputs' specs lay the result out as {want}; "
                "give that (shard_map would otherwise place the shards' results wrongly)"
            )
