"""The import rules of `docs/design.md` ("One home per op family"), checked over the source's static import
graph (every `import` statement, at module level or inside a function).

`PENDING` lists the edges that still break a rule, each beside the step that removes it (empty now: issue 41
removed the last ones): the test fails on any other breach, and on a listed edge that no longer exists (so the
list only shrinks).
Beside them, the naming rules of the same section: no two modules define a top-level class of one name, and no
module imports another's underscore name.
"""

import ast
import pathlib

SRC = pathlib.Path(__file__).resolve().parents[1] / "src"
BACKENDS = ("_xla", "_triton", "_pallas", "_cuda")

PENDING: set[tuple[str, str]] = set()  # empty since issue 41's last two edges went


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The package modules an import statement names (a `from m import x` names `m.x` where that is a module)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if MODULES[module].name == "__init__.py" else module.split(".")[:-1]
        package = package[: len(package) - node.level + 1]
        base = ".".join(package + ([node.module] if node.module else []))
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]


def _owner(name: str) -> str | None:
    """The package module a dotted import target lives in (None outside the package)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    graph = {}
    for module, path in MODULES.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                edges.update(t for t in map(_owner, _targets(module, node)) if t and t != module)
        graph[module] = edges
    return graph


def _room(module: str) -> str:
    """`reference`, `common`, `backend:<name>` (`_pallas.tpu` and `_pallas.gpu` apart), `ops`, `modules`, or
    `other`."""
    parts = module.split(".")
    if parts[1:2] == ["kernels"] and len(parts) > 2:
        if parts[2] == "_common":
            return "common"
        backend = ".".join(parts[2:4]) if parts[2] == "_pallas" else parts[2]  # _pallas.tpu, _pallas.gpu
        return f"backend:{backend}" if parts[2] in BACKENDS else "other"
    return parts[1] if len(parts) > 1 and parts[1] in ("reference", "ops", "modules") else "other"


def breaches(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Edges that break a rule: `reference/` imports only itself; `kernels/_common` nothing of the
    framework or the public layer (`ops`, `modules`, `registry`); a backend no other backend; the public
    layer no backend."""
    found = set()
    for source, targets in graph.items():
        room = _room(source)
        for target in targets:
            other = _room(target)
            if (
                (room == "reference" and other != "reference")
                or (room == "common" and (other in ("ops", "modules") or target == "ejkernel.registry"))
                or (room.startswith("backend:") and other.startswith("backend:") and other != room)
                or (room == "modules" and other.startswith("backend:"))
            ):
                found.add((source, target))
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_breaks_a_rule():
    found = breaches(import_graph())
    assert not found - PENDING, f"imports that break the rules of docs/design.md: {sorted(found - PENDING)}"
    assert not PENDING - found, f"edges gone: remove them from PENDING: {sorted(PENDING - found)}"


def test_no_import_circle():
    assert cycles(import_graph()) == []


def test_the_rules_catch_a_breach():
    graph = {
        "ejkernel.reference.x": {"ejkernel.kernels._common.y"},
        "ejkernel.kernels._triton.a": {"ejkernel.kernels._xla.b"},
    }
    graph |= {"ejkernel.a": {"ejkernel.b"}, "ejkernel.b": {"ejkernel.a"}}
    assert breaches(graph) == {
        ("ejkernel.reference.x", "ejkernel.kernels._common.y"),
        ("ejkernel.kernels._triton.a", "ejkernel.kernels._xla.b"),
    }
    assert cycles(graph) == [["ejkernel.a", "ejkernel.b"]]


def top_level_classes() -> dict[str, list[str]]:
    """Every class defined at the top level of a package module, by name: the modules that define it."""
    found: dict[str, list[str]] = {}
    for module, path in sorted(MODULES.items()):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(module)
    return found


def test_no_two_classes_share_a_name():
    """A class's name tells its family and job (`TritonFlashStatic`, `TpuGroupedMatmulTiling`): no two
    modules define a top-level class of one name, so a name read in a traceback or a review is one class."""
    shared = {name: modules for name, modules in top_level_classes().items() if len(modules) > 1}
    assert not shared, f"classes of one name in several modules: {shared}"


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports() -> set[tuple[str, str]]:
    """`(module, other.name)` for each underscore name a module takes from another package module: by
    `from other import _name`, or as `alias._name` of a module it imported (module names do not count)."""
    found = set()
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for alias, target in zip(node.names, _targets(module, node), strict=True):
                    if target in MODULES and target.rpartition(".")[2] == alias.name:
                        aliases[alias.asname or alias.name] = target
                    elif _private(alias.name) and _owner(target) not in (None, module):
                        found.add((module, f"{target}.{alias.name}"))
            elif isinstance(node, ast.Import):
                aliases.update({a.asname: a.name for a in node.names if a.asname and a.name in MODULES})
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and _private(node.attr):
                target = aliases.get(node.value.id)
                if target and target != module and f"{target}.{node.attr}" not in MODULES:
                    found.add((module, f"{target}.{node.attr}"))
    return found


def test_no_module_imports_an_underscore_name():
    """A name used across files is public in the module that defines it."""
    assert not private_imports(), f"underscore names imported across modules: {sorted(private_imports())}"
