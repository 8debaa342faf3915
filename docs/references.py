"""Cross-references in the docstrings of ``analysis`` and ``vizapp``: every Sphinx-style role
(:func:`name`, :class:`name`, :mod:`name`, ...) must name something that exists.

``mkdocs build --strict`` runs this through ``docs/griffe_roles.py`` (each reference becomes a
link or code); ``tests/test_docs_examples.py`` runs :func:`broken_references` directly.

    .venv/bin/python docs/references.py      # lists the broken references, exit code 1 if any
"""

from __future__ import annotations

import ast
import importlib
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROLE = re.compile(r":(?:py:)?(mod|func|class|data|meth|attr|obj|exc|const)?:`~?\.?([A-Za-z_][\w.]*)(?:\(\))?`")


def _lookup(root, dotted: str):
    """``getattr`` along ``dotted`` from ``root``, or raise AttributeError."""
    value = root
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def import_dotted(name: str):
    """The object that the fully qualified ``name`` names: its longest importable module prefix,
    then attributes. Raises LookupError when nothing of that name exists."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        try:
            return _lookup(module, ".".join(parts[cut:])) if parts[cut:] else module
        except AttributeError:
            break
    raise LookupError(name)


def resolve(name: str, module: str, scopes: tuple[str, ...] = ()) -> str | None:
    """The fully qualified name ``name`` means when written in ``module`` (inside the classes or
    functions ``scopes``, innermost last), or None when it names nothing.

    Tried in order: as written; inside each enclosing scope; in the module; in its package; in
    ``analysis``; a builtin."""
    candidates = [name]
    for depth in range(len(scopes), 0, -1):
        candidates.append(".".join((module, *scopes[:depth], name)))
    candidates += [f"{module}.{name}", f"{module.rsplit('.', 1)[0]}.{name}", f"analysis.{name}", f"builtins.{name}"]
    for candidate in candidates:
        if _exists(candidate):
            return candidate
    return None


def _exists(name: str) -> bool:
    """``name`` is importable, or an attribute a class declares (a dataclass field without a
    default, an annotated instance attribute) that ``getattr`` on the class cannot see."""
    try:
        import_dotted(name)
        return True
    except Exception:  # noqa: BLE001 - an import that fails names nothing here
        pass
    if "." not in name:
        return False
    owner, attribute = name.rsplit(".", 1)
    try:
        cls = import_dotted(owner)
    except Exception:  # noqa: BLE001
        return False
    return isinstance(cls, type) and any(attribute in getattr(base, "__annotations__", {}) for base in cls.__mro__)


def _docstrings(tree: ast.Module):
    """(scopes, docstring) of the module, its classes and functions, nested."""
    yield (), ast.get_docstring(tree) or ""

    def walk(node, scopes):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = (*scopes, child.name)
                yield inner, ast.get_docstring(child) or ""
                yield from walk(child, inner)

    yield from walk(tree, ())


def broken_references(packages=("analysis", "vizapp")) -> list[str]:
    """``path:line: name`` for every role in a docstring that names nothing."""
    broken = []
    for package in packages:
        for path in sorted((REPO / package).rglob("*.py")):
            relative = path.relative_to(REPO)
            module = ".".join(relative.with_suffix("").parts).removesuffix(".__init__")
            if package == "vizapp" and relative.parts[1] == "views":
                continue  # Streamlit page scripts: they run a page when imported
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for scopes, docstring in _docstrings(tree):
                for match in ROLE.finditer(docstring):
                    if resolve(match.group(2), module, scopes) is None:
                        broken.append(f"{relative}: {'.'.join(scopes) or '<module>'}: {match.group(0)}")
    return broken


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    found = broken_references()
    print("\n".join(found) or "every reference resolves")
    raise SystemExit(1 if found else 0)
