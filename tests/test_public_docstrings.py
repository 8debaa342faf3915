"""The public API's docstrings: numpy style, every parameter and field documented, with a type.

Every function and class a module of ``analysis`` exports (its ``__all__``: the root namespace and
every subpackage the reference documents) is parsed with the numpy parser of griffe, the library
that renders the API reference (mkdocs.yml: ``docstring_style: auto``). A function names each
parameter of its signature, in order, each with a type, and says what it returns (with a type)
unless it returns ``None``; a dataclass or named tuple names each public field under
``Attributes``; another class names its constructor's parameters. Shapes are prose: the
descriptions give them as ``(B, heads, Q, T)``.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import logging
import pkgutil
import re

import griffe
import pytest

import analysis

GOOGLE_HEADER = re.compile(r"^\s*(Args|Arguments|Returns|Raises|Attributes|Yields|Example|Examples):\s*$", re.M)


def public_objects() -> list[tuple[str, object]]:
    """Every function and class in some ``__all__`` of ``analysis`` and its modules, once each (named
    by the first module that exports it), less the error classes (their docstrings say when they
    are raised)."""
    modules = [analysis] + [
        importlib.import_module(info.name) for info in pkgutil.walk_packages(analysis.__path__, "analysis.")
    ]
    objects, seen = [], set()
    for module in modules:
        for name in getattr(module, "__all__", ()):
            value = getattr(module, name)
            if not (inspect.isfunction(value) or (inspect.isclass(value) and not issubclass(value, BaseException))):
                continue
            if (value.__module__, value.__qualname__) not in seen:
                seen.add((value.__module__, value.__qualname__))
                objects.append((f"{module.__name__}.{name}", value))
    return objects


PUBLIC = public_objects()


def sections(docstring: str) -> dict[str, list]:
    """The numpy-style sections of ``docstring``, by kind (``"parameters"``, ``"returns"``, ...)."""
    logging.getLogger("griffe").setLevel(logging.ERROR)  # an empty docstring part warns; the asserts say what is wrong
    parsed = griffe.Docstring(docstring, parser="numpy").parse()
    found: dict[str, list] = {}
    for section in parsed:
        if isinstance(section.value, list) and section.kind.value != "examples":  # examples: (kind, text) pairs
            found.setdefault(section.kind.value, []).extend(section.value)
    return found


def signature_names(function) -> list[str]:
    """The parameter names as numpy docstrings write them: ``*args``, ``**kwargs`` with their stars."""
    stars = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    return [stars.get(p.kind, "") + p.name for p in inspect.signature(function).parameters.values()]


def public_fields(cls) -> list[str]:
    """A dataclass's or named tuple's fields that do not start with an underscore."""
    names = [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else list(cls._fields)
    return [name for name in names if not name.startswith("_")]


def constructor_names(cls) -> list[str] | None:
    """The parameters of a class's own ``__init__`` (without ``self``), or None: a dataclass or named
    tuple (its fields are the ``Attributes``), a protocol, or a class that defines no ``__init__``."""
    if dataclasses.is_dataclass(cls) or hasattr(cls, "_fields") or getattr(cls, "_is_protocol", False):
        return None
    if "__init__" not in vars(cls):
        return None
    return signature_names(cls.__init__)[1:]


def test_the_public_names_are_found():
    """The walk finds the root namespace's names and the subpackages' (a broken walk checks nothing)."""
    names = {name for name, _ in PUBLIC}
    assert {"analysis.load_vit", "analysis.AttentionRecord", "analysis.plots.mosaic"} <= names
    assert len(PUBLIC) > 500


@pytest.mark.parametrize(("name", "value"), PUBLIC, ids=[name for name, _ in PUBLIC])
def test_every_public_name_has_a_numpy_docstring_with_each_parameter_and_its_type(name, value):
    docstring = inspect.getdoc(value) or ""
    assert docstring, f"{name} has no docstring"
    assert not GOOGLE_HEADER.search(docstring), f"{name}: Google-style section header; write numpy style"
    found = sections(docstring)
    if inspect.isclass(value):
        constructor = constructor_names(value)
        kind, wanted = ("parameters", constructor) if constructor is not None else ("attributes", None)
        if wanted is None and (dataclasses.is_dataclass(value) or hasattr(value, "_fields")):
            wanted = public_fields(value)
        documented = [item.name for item in found.get(kind, [])]
        if wanted is not None:
            assert documented == wanted, f"{name}: {kind.title()} must list {wanted}, in order"
        untyped = [item.name for item in found.get(kind, []) if not item.annotation]
    else:
        documented = [item.name for item in found.get("parameters", [])]
        assert documented == signature_names(value), f"{name}: Parameters must list the signature's, in order"
        untyped = [item.name for item in found.get("parameters", []) if not item.annotation]
        returns_none = inspect.signature(value).return_annotation in (None, "None")
        if not returns_none:
            returned = found.get("returns", []) + found.get("yields", [])
            assert returned, f"{name}: no Returns (or Yields) section"
            assert all(item.annotation for item in returned), f"{name}: a Returns entry without a type"
    assert not untyped, f"{name}: no type for {untyped}"
    assert all(item.description.strip() for items in found.values() for item in items), (
        f"{name}: an entry without a description"
    )


def test_the_check_reads_a_google_docstring_as_undocumented():
    """The parse above is what fails a docstring that documents its parameters Google-style."""

    def google(a, *, b=1):
        """Do it.

        Args:
            a: the a.
            b: the b.

        Returns:
            The sum.
        """

    assert GOOGLE_HEADER.search(inspect.getdoc(google))
    assert sections(inspect.getdoc(google)).get("parameters", []) == []
