"""Pieces shared by the Hugging Face converters (:mod:`.hf_transformers` for ViTs, :mod:`.hf_swin`
for Swin, :mod:`.two_tower` and :mod:`analysis.mae.loading`): the optional ``transformers``
import, attribute lookup across the layouts of transformers' versions, and the 4.x MLP.

They sit below every converter, so that none imports another for them.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from ...base.errors import ModelLoadError

__all__ = ["require_transformers", "first_attribute", "from_folder", "IntermediateOutput"]


def require_transformers():
    """The ``transformers`` module (an optional dependency), imported.

    Returns
    -------
    module
        ``transformers``.

    Raises
    ------
    ModelLoadError
        ``transformers`` is not installed; the message says ``pip install transformers``.
    """
    try:
        import transformers
    except ImportError as exc:
        raise ModelLoadError(
            "This is a Hugging Face transformers model, but transformers is not installed: pip install transformers"
        ) from exc
    return transformers


def from_folder(model_class, folder):
    """``model_class.from_pretrained(folder)`` for a local folder, without transformers' "Loading
    weights" progress bar: reading a folder takes a moment, and in a notebook the bar is a widget
    that stays in the saved output (at 0% where the widget state is not kept). The bar's switch is
    transformers' own global one, set back as it was.

    Parameters
    ----------
    model_class : type
        A transformers model class (or auto class) with ``from_pretrained``.
    folder : str or pathlib.Path
        The ``save_pretrained`` folder.

    Returns
    -------
    transformers.PreTrainedModel
        What ``from_pretrained`` returns.
    """
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        return model_class.from_pretrained(str(folder))
    finally:
        if shown:
            hf_logging.enable_progress_bar()


def first_attribute(obj, *paths):
    """The first attribute path (``"a.b"``) that exists on ``obj`` and is not ``None``, else
    ``None``: one lookup over the names that transformers' versions and model types use.

    Parameters
    ----------
    obj : Any
        The object to read (a model or one of its modules).
    *paths : str
        Dotted attribute paths, tried in order.

    Returns
    -------
    Any or None
        The first value found, or ``None``.
    """
    for path in paths:
        value = obj
        for part in path.split("."):
            value = getattr(value, part, None)
            if value is None:
                break
        if value is not None:
            return value
    return None


class IntermediateOutput(nn.Module):
    """transformers 4.x ViT/DeiT/Swin MLP: ``intermediate`` (dense + act) then ``output.dense``
    and its dropout (the residual add is left to the timm block); ``(B, T, D) → (B, T, D)``.

    Parameters
    ----------
    intermediate : torch.nn.Module
        The layer's ``intermediate`` (dense + activation).
    output : Any
        The layer's ``output``, with its ``dense`` and ``dropout`` modules (its own forward, which
        adds the residual, is not called).
    """

    def __init__(self, intermediate: nn.Module, output: Any) -> None:  # output: .dense and .dropout
        super().__init__()
        self.intermediate: nn.Module = intermediate
        self.output: Any = output

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B, T, D)
        return self.output.dropout(self.output.dense(self.intermediate(x)))
