"""The import graph of the library: no cycle, no private name borrowed across modules, no app.

The graph is built from the source with :mod:`ast` (nothing is imported): one node per module of
``analysis/``, one edge per ``import`` / ``from ... import`` that names another module of the
package, with relative imports resolved. ``from package import name`` is an edge to the submodule
``package.name`` when there is one, else to ``package`` itself (its ``__init__``). Importing a
submodule also runs its parents' ``__init__``; like import-linter's graph (grimp), that implicit
step is not an edge.

Which imports count:

* **Module-level imports** run when the module is imported: a cycle among them is the classic
  partially-initialised-module error, or works only by the order in which modules happen to be
  imported.
* **Imports inside functions** ("lazy") count too. A lazy import is fine for what it is for: to
  defer a heavy or optional dependency (``transformers``, ``open_clip``, the command line's
  subcommands). It is not a way to hide a cycle: two modules that each need the other are one
  module in two files, whichever of them defers its import, and the cycle comes back the day
  someone moves the import to the top. So the graph with the lazy imports added must be acyclic
  as well (``test_no_function_level_import_closes_a_cycle``), and the contract in
  ``pyproject.toml`` (``lint-imports``, which also sees imports inside functions) orders them.
* Imports under ``if TYPE_CHECKING:`` never run and are left out: an annotation may name a type
  it does not otherwise need (``adapters.probabilities`` names ``adapters.base.AttentionInputs``,
  while ``adapters.base`` imports ``probabilities`` to run it).

Run ``python tests/test_import_graph.py`` to print the cycles and every lazy intra-package import.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PROJECT_PACKAGES = ("analysis", "vizapp")
FORBIDDEN_IN_LIBRARY = ("vizapp", "streamlit")


@dataclass(frozen=True)
class Import:
    """One import statement's edge: ``importer`` imports ``imported`` (both dotted module names)
    at ``path:line``; ``name`` is the imported name for ``from X import name`` (else ``None``);
    ``lazy``: inside a function; ``target``: the dotted name as written, resolved."""

    importer: str
    imported: str | None  # the project module it lands on, None for an outside package
    target: str
    name: str | None
    path: str
    line: int
    lazy: bool
    bound_as: str | None = None  # the local name the statement binds to it, when that name is the module

    def where(self) -> str:
        return f"{self.path}:{self.line}"


def module_names(root: Path, packages=PROJECT_PACKAGES) -> dict[str, Path]:
    """``{dotted module name: file}`` of every ``.py`` file of ``packages`` under ``root``."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _base_of(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module that ``from <dots><module> import ...`` in ``module`` names."""
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    package = package[: len(package) - (node.level - 1)]
    return ".".join(package + ([node.module] if node.module else []))


def _land(target: str, modules: dict[str, Path]) -> str | None:
    """The deepest project module that ``target`` names (``analysis.engine.capture.X`` -> ``analysis.engine.capture``)."""
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def imports_of(module: str, path: Path, modules: dict[str, Path], root: Path = REPO) -> list[Import]:
    """Every import statement of one module that runs (``TYPE_CHECKING`` blocks left out)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    relative = str(path.relative_to(root))
    found: list[Import] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for other in child.orelse:
                    visit_statement(other, lazy)
                continue
            visit_statement(child, lazy)

    def visit_statement(node: ast.AST, lazy: bool) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append(
                    Import(
                        module, _land(alias.name, modules), alias.name, None, relative, node.lineno, lazy, alias.asname
                    )
                )
        elif isinstance(node, ast.ImportFrom):
            base = _base_of(module, path, node)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                target = submodule if submodule in modules else base
                found.append(
                    Import(
                        module,
                        _land(target, modules),
                        target,
                        alias.name,
                        relative,
                        node.lineno,
                        lazy,
                        (alias.asname or alias.name) if target == submodule else None,
                    )
                )
        visit(node, lazy or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return found


def all_imports(root: Path = REPO, packages=PROJECT_PACKAGES) -> list[Import]:
    modules = module_names(root, packages)
    return [edge for module, path in modules.items() for edge in imports_of(module, path, modules, root)]


def graph_of(edges: list[Import], *, lazy: bool) -> dict[str, dict[str, Import]]:
    """``{importer: {imported: first such import}}`` over the project modules (module-level
    imports, and the lazy ones too when ``lazy``); self-imports are no edge."""
    graph: dict[str, dict[str, Import]] = {}
    for edge in edges:
        if edge.imported is None or edge.imported == edge.importer or (edge.lazy and not lazy):
            continue
        graph.setdefault(edge.importer, {}).setdefault(edge.imported, edge)
    return graph


def find_cycles(graph: dict[str, dict[str, Import]]) -> list[list[Import]]:
    """One cycle (as its edges, in order) per strongly connected component of more than one
    module (Tarjan's algorithm, iterative), then the shortest cycle through its first module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    nodes = sorted(set(graph) | {target for targets in graph.values() for target in targets})
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, {}))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return [_shortest_cycle(graph, component) for component in components]


def _shortest_cycle(graph: dict[str, dict[str, Import]], component: list[str]) -> list[Import]:
    """Breadth-first from the component's first module back to itself, inside the component."""
    start, members = component[0], set(component)
    previous: dict[str, Import] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target, edge in sorted(graph.get(node, {}).items()):
                if target not in members:
                    continue
                if target == start:
                    path = [edge]
                    while path[0].importer != start:
                        path.insert(0, previous[path[0].importer])
                    return path
                if target not in previous:
                    previous[target] = edge
                    following.append(target)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {component}")  # pragma: no cover


def describe(cycle: list[Import]) -> str:
    """``a -> b (analysis/a.py:12) -> ... -> a``, lazy imports marked."""
    steps = [cycle[0].importer]
    for edge in cycle:
        steps.append(f"{edge.imported} ({edge.where()}{', in a function' if edge.lazy else ''})")
    return " -> ".join(steps)


def private_imports(edges: list[Import], modules: dict[str, Path], root: Path = REPO) -> list[str]:
    """``path:line: module imports _name from other`` for every private name (``_x``, not
    ``__x__``) or private module imported from another module of the project."""
    found = []
    for edge in edges:
        if edge.imported is None or edge.imported == edge.importer:
            continue
        private_module = [part for part in edge.target.split(".") if part.startswith("_") and not part.startswith("__")]
        if private_module:
            found.append(f"{edge.where()}: {edge.importer} imports private module {edge.target}")
        elif edge.name and _is_private(edge.name):
            found.append(f"{edge.where()}: {edge.importer} imports {edge.name} from {edge.imported}")
    return found + private_attribute_reads(modules, root)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_attribute_reads(modules: dict[str, Path], root: Path = REPO) -> list[str]:
    """``module._name`` reads where ``module`` is a project module bound by an import (``from
    analysis import capture; capture._resolve_layers``): the same borrowing, spelled differently."""
    found = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        bound = {
            edge.bound_as: edge.imported
            for edge in imports_of(module, path, modules, root)
            if edge.bound_as and edge.imported == edge.target
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in bound
                and _is_private(node.attr)
                and bound[node.value.id] != module
            ):
                found.append(
                    f"{path.relative_to(root)}:{node.lineno}: {module} reads {node.attr} of {bound[node.value.id]}"
                )
    return found


# --- the tests -------------------------------------------------------------------------------


def test_the_graph_covers_the_library():
    """The walk really sees the package: every module, and edges that are known to exist."""
    modules = module_names(REPO, ("analysis",))
    assert len(modules) >= 120 and "analysis.engine.capture" in modules and "analysis.model.adapters" in modules
    graph = graph_of(all_imports(REPO, ("analysis",)), lazy=True)
    assert "analysis.engine.activations.run" in graph["analysis.engine.capture"]  # from .activations.run import ...
    assert "analysis.base.errors" in graph["analysis.model.spec"]  # from .errors import ...
    assert "analysis.model.loading.hub" in graph["analysis.model.loading.two_tower"]  # lazy: inside a function


def test_no_import_cycle_at_module_level():
    cycles = find_cycles(graph_of(all_imports(REPO, ("analysis",)), lazy=False))
    if cycles:
        pytest.fail("import cycles in analysis/:\n" + "\n".join(describe(cycle) for cycle in cycles), pytrace=False)


def test_no_function_level_import_closes_a_cycle():
    """A lazy import may defer a cost; it may not hide a cycle (see the module docstring)."""
    cycles = find_cycles(graph_of(all_imports(REPO, ("analysis",)), lazy=True))
    if cycles:
        pytest.fail(
            "import cycles in analysis/ once the imports inside functions are counted (move the shared "
            "code down a layer instead of deferring the import):\n" + "\n".join(describe(cycle) for cycle in cycles),
            pytrace=False,
        )


def test_the_app_has_no_import_cycle():
    cycles = find_cycles(graph_of(all_imports(REPO, ("vizapp",)), lazy=True))
    if cycles:
        pytest.fail("import cycles in vizapp/:\n" + "\n".join(describe(cycle) for cycle in cycles), pytrace=False)


def test_no_private_name_is_imported_across_modules():
    """A name that starts with ``_`` belongs to its module. Shared code is public (named,
    documented) or lives in the module that uses it. tests/ may reach in; the library and the
    app may not."""
    modules = module_names(REPO)
    found = private_imports(all_imports(REPO), modules)
    if found:
        pytest.fail("private names imported across modules:\n" + "\n".join(found), pytrace=False)


def test_the_library_never_imports_the_app_or_streamlit():
    """Also inside functions (the import contract of pyproject.toml checks the same in CI)."""
    found = [
        f"{edge.where()}: {edge.target}"
        for edge in all_imports(REPO, ("analysis",))
        if edge.target.split(".")[0] in FORBIDDEN_IN_LIBRARY
    ]
    assert not found, found


def _write_package(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_the_checks_find_a_hidden_cycle_and_a_borrowed_private_name(tmp_path):
    """The checks above can fail: a toy package with a cycle closed inside a function, a
    module-level cycle through a package ``__init__``, and a private name borrowed two ways."""
    _write_package(
        tmp_path,
        {
            "analysis/__init__.py": "",
            "analysis/low.py": "def f():\n    from .high import g\n    return g\n",
            "analysis/high.py": "from typing import TYPE_CHECKING\nfrom .low import f\nif TYPE_CHECKING:\n"
            "    from .typed import T\ndef g():\n    return f\n",
            "analysis/typed.py": "from .high import g\nT = int\n",
            "analysis/sub/__init__.py": "from .leaf import x\n",
            "analysis/sub/leaf.py": "from analysis.other import _y as x\n",
            "analysis/other.py": "from . import sub\n_y = 1\n",
            "analysis/reader.py": "from analysis import other\nz = other._y\n",
        },
    )
    edges = all_imports(tmp_path, ("analysis",))
    strict = [describe(cycle) for cycle in find_cycles(graph_of(edges, lazy=True))]
    loose = [describe(cycle) for cycle in find_cycles(graph_of(edges, lazy=False))]
    assert len(strict) == 2 and any("analysis.high (analysis/low.py:2, in a function)" in c for c in strict), strict
    assert not any("analysis.typed" in c for c in strict), strict  # a TYPE_CHECKING import is no edge
    assert loose == [
        (
            "analysis.other -> analysis.sub (analysis/other.py:1) -> analysis.sub.leaf "
            "(analysis/sub/__init__.py:1) -> analysis.other (analysis/sub/leaf.py:1)"
        )
    ], loose
    private = private_imports(edges, module_names(tmp_path, ("analysis",)), tmp_path)
    assert private == [
        "analysis/sub/leaf.py:1: analysis.sub.leaf imports _y from analysis.other",
        "analysis/reader.py:2: analysis.reader reads _y of analysis.other",
    ], private


if __name__ == "__main__":
    edges = all_imports(REPO, ("analysis",))
    for cycle in find_cycles(graph_of(edges, lazy=True)):
        print("cycle:", describe(cycle))
    for line in private_imports(all_imports(REPO), module_names(REPO)):
        print("private:", line)
    if "--lazy" in sys.argv:
        for edge in edges:
            if edge.lazy and edge.imported is not None:
                print(f"lazy: {edge.where()}: {edge.importer} -> {edge.imported}")
