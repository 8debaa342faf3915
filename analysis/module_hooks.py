"""Adding and removing ``nn.Module`` hooks while other threads run the same module.

One loaded model serves every browser session, so one thread may add or remove a hook on a
module while another thread runs that module's forward. ``Module.register_forward_hook`` and
``RemovableHandle.remove`` change the module's hook dictionaries in place, and torch iterates
those dictionaries in Python when a forward raises (``Module._call_impl`` runs the
``always_call`` hooks before re-raising): a hook added or removed by another thread at that
moment replaces the forward's own exception with ``RuntimeError: OrderedDict mutated during
iteration``. A read that stops its forward early (:class:`analysis.activations.run.StopForward`)
raises in every forward it makes.

Here a hook is added and removed *copy-on-write*: under one process-wide lock, the dictionary is
copied, the copy changed, and the module's attribute pointed at the copy. A forward on another
thread keeps iterating the dictionary it started with, which no one changes any more.

Order of the swaps: a hook's "with kwargs" and "always call" flags go in before the hook and come
out after it, so no forward sees the hook without its flags. A forward that took its snapshot of
the hooks before a removal may still find the flags gone: every kwargs pre-hook of this package
takes ``kwargs=None`` and returns at once on another thread than its owner.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from torch import nn
from torch.utils.hooks import RemovableHandle

__all__ = ["ModuleHook", "add_forward_hook", "add_forward_pre_hook"]

_LOCK = threading.Lock()


class ModuleHook:
    """The handle of a hook added by :func:`add_forward_hook` or :func:`add_forward_pre_hook`:
    ``remove()`` takes the hook out copy-on-write (removing twice does nothing)."""

    def __init__(self, module: nn.Module, hooks: str, flags: tuple[str, ...], hook_id: int) -> None:
        self.module = module
        self.id = hook_id
        self._hooks = hooks
        self._flags = flags

    def remove(self) -> None:
        with _LOCK:
            for name in (self._hooks, *self._flags):  # the hook first, its flags after
                _swap(self.module, name, lambda entries: entries.pop(self.id, None))

    def __enter__(self) -> ModuleHook:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def add_forward_pre_hook(module: nn.Module, hook: Callable[..., Any], *, with_kwargs: bool = False) -> ModuleHook:
    """``module.register_forward_pre_hook(hook, with_kwargs=...)``, safe while other threads
    run ``module`` (see the module docstring)."""
    flags = {"_forward_pre_hooks_with_kwargs": with_kwargs}
    return _add(module, "_forward_pre_hooks", hook, flags)


def add_forward_hook(
    module: nn.Module, hook: Callable[..., Any], *, with_kwargs: bool = False, always_call: bool = False
) -> ModuleHook:
    """``module.register_forward_hook(hook, with_kwargs=..., always_call=...)``, safe while other
    threads run ``module`` (see the module docstring)."""
    flags = {"_forward_hooks_with_kwargs": with_kwargs, "_forward_hooks_always_called": always_call}
    return _add(module, "_forward_hooks", hook, flags)


def _add(module: nn.Module, hooks: str, hook: Callable[..., Any], flags: dict[str, bool]) -> ModuleHook:
    with _LOCK:
        hook_id = RemovableHandle(OrderedDict()).id  # torch's own id counter: unique among all hooks
        set_flags = tuple(name for name, on in flags.items() if on)
        for name in set_flags:  # the flags before the hook
            _swap(module, name, lambda entries: entries.__setitem__(hook_id, True))
        _swap(module, hooks, lambda entries: entries.__setitem__(hook_id, hook))
    return ModuleHook(module, hooks, set_flags, hook_id)


def _swap(module: nn.Module, name: str, change: Callable[[OrderedDict], object]) -> None:
    """Point ``module.<name>`` at a changed copy of its dictionary (the old one is left as it was)."""
    entries = OrderedDict(module.__dict__[name])
    change(entries)
    module.__dict__[name] = entries
