"""Where the modules of the flat layout went when ``analysis/`` was laid out in layer folders, and
the import aliases that keep each old path working for one release.

``import analysis.rollout`` (or ``from analysis.rollout import attention_rollout``) still works: it
gives the module now at ``analysis.attention.rollout`` itself (the same object, so a monkeypatch
or an ``isinstance`` check agrees) and warns with a :class:`DeprecationWarning` naming the new
path. ``analysis.rollout`` as an attribute of the package does the same
(:func:`moved_module_attribute`). ``analysis.records`` stayed a name: it is the records package,
which re-exports what the old module held.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

__all__ = [
    "MOVED_MODULES",
    "PackageKeepingItsNames",
    "install_moved_module_aliases",
    "moved_module_attribute",
    "new_module_name",
]

# old dotted path -> new dotted path (a package's submodules follow their package)
MOVED_MODULES: dict[str, str] = {
    "analysis.activations": "analysis.engine.activations",
    "analysis.adapters": "analysis.model.adapters",
    "analysis.archives": "analysis.base.archives",
    "analysis.arguments": "analysis.base.arguments",
    "analysis.assets": "analysis.base.assets",
    "analysis.attention_maps": "analysis.attention.maps",
    "analysis.attention_view": "analysis.views.attention_view",
    "analysis.capture": "analysis.engine.capture",
    "analysis.checks": "analysis.records.checks",
    "analysis.devices": "analysis.base.devices",
    "analysis.distance": "analysis.attention.distance",
    "analysis.errors": "analysis.base.errors",
    "analysis.filters": "analysis.embedding.filters",
    "analysis.geometry": "analysis.model.geometry",
    "analysis.image_ops": "analysis.base.image_ops",
    "analysis.images": "analysis.base.images",
    "analysis.label_space": "analysis.base.label_space",
    "analysis.loading": "analysis.model.loading",
    "analysis.map_scaling": "analysis.maps.scaling",
    "analysis.mass": "analysis.attention.mass",
    "analysis.module_hooks": "analysis.base.module_hooks",
    "analysis.oom": "analysis.base.oom",
    "analysis.position": "analysis.embedding.position",
    "analysis.preprocessing": "analysis.base.preprocessing",
    "analysis.progress": "analysis.base.progress",
    "analysis.queries": "analysis.records.queries",
    "analysis.record_memory": "analysis.base.record_memory",
    "analysis.rollout": "analysis.attention.rollout",
    "analysis.rollout_rules": "analysis.attention.rollout_rules",
    "analysis.spec": "analysis.model.spec",
    "analysis.streaming": "analysis.attention.streaming",
    "analysis.upsampling": "analysis.maps.upsampling",
    "analysis.widgets": "analysis.views.widgets",
    "analysis.windowed": "analysis.records.windowed",
    "analysis.windowed_position": "analysis.embedding.windowed_position",
    "analysis.windowed_rollout": "analysis.attention.windowed_rollout",
    "analysis.windowed_support": "analysis.model.windowed_support",
}


def new_module_name(old: str) -> str | None:
    """The new dotted path of ``old`` (a moved module, or a submodule of a moved package), or ``None``."""
    for moved, new in MOVED_MODULES.items():
        if old == moved or old.startswith(moved + "."):
            return new + old[len(moved) :]
    return None


def _warn_moved(old: str, new: str, stacklevel: int) -> None:
    warnings.warn(
        f"{old} moved to {new}: import it from there (the old path is removed in the next release)",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


class _MovedModuleLoader(importlib.abc.Loader):
    """Loads an old path as the module at its new path (the same object)."""

    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        _warn_moved(spec.name, self.new, stacklevel=3)
        module = importlib.import_module(self.new)
        self.own_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self.own_spec  # the import system set the old path's spec on it: give its own back


class _MovedModuleFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = new_module_name(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _MovedModuleLoader(new))


class PackageKeepingItsNames(ModuleType):
    """The type of the ``analysis`` package. Importing a submodule binds it to its package under its
    name; for an old path that is also a function the package exports (``analysis.windowed_rollout``,
    ``analysis.label_space``), that binding would replace the function with the module. A module
    never replaces a name of another kind here."""

    def __setattr__(self, name: str, value: object) -> None:
        current = self.__dict__.get(name)
        if isinstance(value, ModuleType) and current is not None and not isinstance(current, ModuleType):
            return
        super().__setattr__(name, value)


def install_moved_module_aliases(package: ModuleType) -> None:
    """Make ``package`` (``analysis``) a :class:`PackageKeepingItsNames`, and put the old paths'
    finder first on ``sys.meta_path`` (once per process): first, so that a submodule of a moved
    package (``analysis.adapters.registry``) is not found again at its old parent's folder as a
    second module."""
    package.__class__ = PackageKeepingItsNames
    if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedModuleFinder())


def moved_module_attribute(name: str) -> ModuleType:
    """``analysis.<name>`` for an old top-level module name (the package's ``__getattr__``), with the
    deprecation warning; :class:`AttributeError` for any other name."""
    new = MOVED_MODULES.get(f"analysis.{name}")
    if new is None:
        raise AttributeError(f"module 'analysis' has no attribute {name!r}")
    _warn_moved(f"analysis.{name}", new, stacklevel=4)
    return importlib.import_module(new)
