"""Adding and removing ``nn.Module`` hooks while other threads run the same module.

One loaded model serves every browser session, so one thread may add or remove a hook on a
module while another thread runs that module's forward. When a forward raises, torch walks the
module's forward hooks in Python on the way out (``Module._call_impl`` runs the ``always_call``
hooks before re-raising); a hook added or removed by another thread at that moment replaces the
forward's own exception with ``RuntimeError: OrderedDict mutated during iteration``. A read that
stops its forward early (:class:`analysis.engine.activations.run.StopForward`) raises in every forward
it makes.

So the hooks of this package are added and removed under one process-wide lock, and a hook that
raises on the thread that added it takes that lock before its exception leaves it: no hook of
this package is added or removed anywhere while the exception travels out through the modules.
The thread gives the lock back when it removes its hooks (the caller of the forward always does,
in ``finally``, once the exception has been caught). Hooks are registered with torch's own
``register_forward_hook`` / ``register_forward_pre_hook``, in place, so a user's hooks and
torch's ``RemovableHandle`` behave as always.

A forward that took its snapshot of a module's hooks before another thread removed a
``with_kwargs`` pre-hook may find the hook's "with kwargs" flag gone and call it as
``hook(module, args)``: every kwargs pre-hook of this package takes ``kwargs=None`` and returns at
once on another thread than its owner.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from torch import nn
from torch.utils.hooks import RemovableHandle

__all__ = ["ModuleHook", "add_forward_hook", "add_forward_pre_hook"]

_LOCK = threading.RLock()
_HELD = threading.local()  # .count: how often this thread took the lock for a raising hook


class ModuleHook:
    """The handle of a hook added by :func:`add_forward_hook` or :func:`add_forward_pre_hook`.

    ``remove()`` takes the hook out (twice does nothing) and gives back the lock that a hook of
    this thread took when it raised. A context manager: leaving the ``with`` block removes the hook.

    Parameters
    ----------
    handle : torch.utils.hooks.RemovableHandle
        The handle torch returned when the hook was registered; its ``id`` becomes ``self.id``.
    """

    def __init__(self, handle: RemovableHandle) -> None:
        self._handle = handle
        self.id = handle.id

    def remove(self) -> None:
        with _LOCK:
            self._handle.remove()
        _release_held()

    def __enter__(self) -> ModuleHook:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def add_forward_pre_hook(module: nn.Module, hook: Callable[..., Any], *, with_kwargs: bool = False) -> ModuleHook:
    """``module.register_forward_pre_hook(hook, with_kwargs=...)``, safe while other threads
    run ``module`` (see the module docstring).

    Parameters
    ----------
    module : torch.nn.Module
        The module whose forward the hook precedes.
    hook : Callable
        ``hook(module, args)``, or ``hook(module, args, kwargs)`` with ``with_kwargs=True``, as torch calls
        pre-hooks; wrapped so that an exception it raises on the adding thread takes the lock.
    with_kwargs : bool, default False
        Pass the forward's keyword arguments to ``hook`` too.

    Returns
    -------
    ModuleHook
        The handle; ``remove()`` (or leaving its ``with`` block) takes the hook out.
    """
    with _LOCK:
        return ModuleHook(module.register_forward_pre_hook(_holding_on_raise(hook), with_kwargs=with_kwargs))


def add_forward_hook(
    module: nn.Module, hook: Callable[..., Any], *, with_kwargs: bool = False, always_call: bool = False
) -> ModuleHook:
    """``module.register_forward_hook(hook, with_kwargs=..., always_call=...)``, safe while other
    threads run ``module`` (see the module docstring).

    Parameters
    ----------
    module : torch.nn.Module
        The module whose forward the hook follows.
    hook : Callable
        ``hook(module, args, output)``, or ``hook(module, args, kwargs, output)`` with ``with_kwargs=True``,
        as torch calls forward hooks; wrapped so that an exception it raises on the adding thread takes
        the lock.
    with_kwargs : bool, default False
        Pass the forward's keyword arguments to ``hook`` too.
    always_call : bool, default False
        Run ``hook`` even when the forward raises (torch's ``always_call``).

    Returns
    -------
    ModuleHook
        The handle; ``remove()`` (or leaving its ``with`` block) takes the hook out.
    """
    with _LOCK:
        handle = module.register_forward_hook(_holding_on_raise(hook), with_kwargs=with_kwargs, always_call=always_call)
        return ModuleHook(handle)


def _holding_on_raise(hook: Callable[..., Any]) -> Callable[..., Any]:
    """``hook``, which takes the lock before an exception it raises on the adding thread leaves it."""
    owner = threading.get_ident()

    @functools.wraps(hook)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return hook(*args, **kwargs)
        except BaseException:
            if threading.get_ident() == owner:
                _LOCK.acquire()
                _HELD.count = getattr(_HELD, "count", 0) + 1
            raise

    return run


def _release_held() -> None:
    """Give back every hold this thread took for a raising hook."""
    for _ in range(getattr(_HELD, "count", 0)):
        _LOCK.release()
    _HELD.count = 0
