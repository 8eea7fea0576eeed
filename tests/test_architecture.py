"""The packages' import graph: no cycles, and dependencies point one way (cli -> dashboard -> planner -> memprof).

The graph is read from the source with :mod:`ast`, imports inside functions included (a lazy import still
ties two modules together), and so are the modules a package's ``_LAZY`` map names (loaded by its
``__getattr__``) and the imports under ``if TYPE_CHECKING:``: they never run, but a type one module names from
another ties them as much (a cycle there is a pair of modules that cannot be read apart).
``cli`` (the console command) may import all three packages; none of them imports it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("memprof", "planner", "dashboard", "cli")
#: package -> packages it must not import (``cli``, the top layer, may import every one).
FORBIDDEN = {"memprof": ("planner", "dashboard", "cli"), "planner": ("dashboard", "cli"), "dashboard": ("cli",)}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported(tree: ast.AST, module: str, is_package: bool, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``module`` imports at run time.

    ``from a import b`` imports ``a.b`` when that is a module, else reads ``b`` from ``a`` (an edge to
    ``a``, whose ``__init__`` must have bound it). Parent packages that Python runs first on the way to a
    submodule are not edges: they run whoever imports. The string values of a ``_LAZY = {name: module}``
    map (a package's lazy ``__getattr__``) count as imports.
    """
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
        elif (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
              and any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets)):
            found.update(v.value for v in node.value.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {name for name in found if name in modules and name != module}


def import_graph() -> dict[str, set[str]]:
    """Module -> the project's modules it imports, over the packages of ``PACKAGES`` that exist."""
    sources = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")) if (ROOT / package).is_dir() else []:
            sources[_module_name(path)] = path
    return {module: _imported(ast.parse(path.read_text(encoding="utf-8")), module, path.name == "__init__.py",
                              set(sources))
            for module, path in sources.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def test_no_import_cycles() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles (break them: move the shared name to a module both can import):\n" + "\n".join(
        " <-> ".join(c) for c in found)


def test_subpackages_do_not_import_each_other_in_a_cycle() -> None:
    """Between the parts of a package too (``memprof.capture``, ``memprof.analysis``, ``memprof.trace``;
    ``planner.solvers`` and the planner's own modules): the trace's contract (``memprof/schema.py``) sits where
    both the analysis and the trace read it, store-all's baseline (``planner/simulation/baseline.py``) where the
    discretisation and the solvers read it."""
    parts: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        for target in targets:
            if _part(target) != _part(module) and target.split(".")[0] == module.split(".")[0]:
                parts.setdefault(_part(module), set()).add(_part(target))
    assert not cycles(parts), cycles(parts)


def _part(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_dependencies_point_one_way() -> None:
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in import_graph().items()
        for target in targets
        if target.split(".")[0] in FORBIDDEN.get(module.split(".")[0], ())
    )
    assert not wrong, "dependencies must point dashboard -> planner -> memprof:\n" + "\n".join(wrong)


def test_the_graph_sees_lazy_imports() -> None:
    """The reader catches imports inside functions, lazy maps, relative imports and those for type checking."""
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from b import B\n"
              "def f():\n    from c import C, d\n    import e.f\n_LAZY = {'G': 'g'}\nfrom . import h\n")
    modules = {"p", "p.a", "b", "c", "c.d", "e", "e.f", "g", "p.h"}
    assert _imported(ast.parse(source), "p.a", False, modules) == {"b", "c", "c.d", "e.f", "g", "p.h"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


#: The planner's parts in the order of its flow: each imports only parts before it (``planner/__init__.py``,
#: the public API, imports them all). ``docs/architecture.md`` draws the same order.
PLANNER_LAYERS = ("planner.errors", "planner.model", "planner.simulation", "planner.solvers", "planner.executor",
                  "planner.discovery", "planner.fronts", "planner.export", "planner.measure")


def test_the_planner_parts_import_only_those_before_them() -> None:
    graph = import_graph()
    parts = sorted({_part(module) for module in graph if module.startswith("planner.")})
    assert parts == sorted(PLANNER_LAYERS), "a new part of the planner needs its place in PLANNER_LAYERS"
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in graph.items() if module.startswith("planner.")
        for target in targets if target.startswith("planner.")
        and PLANNER_LAYERS.index(_part(target)) > PLANNER_LAYERS.index(_part(module))
    )
    assert not wrong, "the planner's parts import only those before them in PLANNER_LAYERS:\n" + "\n".join(wrong)


def test_the_planner_top_level_holds_only_its_api() -> None:
    """Every module of the planner lives in the part its name says; only the API and the errors sit at the top."""
    top = sorted(path.name for path in (ROOT / "planner").glob("*.py"))
    assert top == ["__init__.py", "errors.py"], top
