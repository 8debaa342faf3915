"""The public API's docstrings: numpy style, every parameter and field documented, with a type.

Every function and class the root namespace exports (``analysis.__all__``, the names the reference
lists first) is parsed with the numpy parser of griffe, the library that renders the API reference
(mkdocs.yml: ``docstring_style: auto``). A function names each parameter of its signature, in order,
each with a type, and says what it returns (with a type) unless it returns ``None``; a class (a
dataclass or a named tuple) names each public field under ``Attributes``. Shapes are prose: the
descriptions give them as ``(B, heads, Q, T)``.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import re

import griffe
import pytest

import analysis

GOOGLE_HEADER = re.compile(r"^\s*(Args|Arguments|Returns|Raises|Attributes|Yields|Example|Examples):\s*$", re.M)


def public_objects() -> list[tuple[str, object]]:
    """``analysis.__all__``'s functions and classes, less the error classes (their docstrings say
    when they are raised)."""
    objects = []
    for name in analysis.__all__:
        value = getattr(analysis, name)
        if inspect.isfunction(value) or (inspect.isclass(value) and not issubclass(value, BaseException)):
            objects.append((name, value))
    return objects


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


@pytest.mark.parametrize(("name", "value"), public_objects(), ids=[name for name, _ in public_objects()])
def test_every_public_name_has_a_numpy_docstring_with_each_parameter_and_its_type(name, value):
    docstring = inspect.getdoc(value) or ""
    assert docstring, f"analysis.{name} has no docstring"
    assert not GOOGLE_HEADER.search(docstring), f"analysis.{name}: Google-style section header; write numpy style"
    found = sections(docstring)
    if inspect.isclass(value):
        documented = [item.name for item in found.get("attributes", [])]
        assert documented == public_fields(value), f"analysis.{name}: Attributes must list the fields, in order"
        untyped = [item.name for item in found.get("attributes", []) if not item.annotation]
    else:
        documented = [item.name for item in found.get("parameters", [])]
        assert documented == signature_names(value), f"analysis.{name}: Parameters must list the signature's, in order"
        untyped = [item.name for item in found.get("parameters", []) if not item.annotation]
        returns_none = inspect.signature(value).return_annotation in (None, "None")
        if not returns_none:
            returned = found.get("returns", [])
            assert returned, f"analysis.{name}: no Returns section"
            assert all(item.annotation for item in returned), f"analysis.{name}: a Returns entry without a type"
    assert not untyped, f"analysis.{name}: no type for {untyped}"
    assert all(item.description.strip() for items in found.values() for item in items), (
        f"analysis.{name}: an entry without a description"
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
