"""timm model names (``vit_base_patch16_224.augreg2_in21k_ft_in1k``) and ``hf-hub:`` ids."""

from __future__ import annotations

import difflib

import timm
import torch.nn as nn

from ...base.errors import ModelLoadError
from .families import check_supported_architecture
from .hub import create_timm_model, ensure_hub_reachable, ensure_pretrained_available

__all__ = ["model_from_timm_name"]


def model_from_timm_name(name: str, pretrained: bool, model_kwargs: dict) -> nn.Module:
    """Build a timm model by name, failing fast (in seconds) when pretrained weights are neither
    cached nor downloadable.

    Parameters
    ----------
    name : str
        A timm model name with an optional pretrained ``.tag``
        (``vit_base_patch16_224.augreg2_in21k_ft_in1k``), or an ``hf-hub:org/name`` id.
    pretrained : bool
        Load the pretrained weights; ``False``, random ones.
    model_kwargs : dict
        Extra ``timm.create_model`` arguments.

    Returns
    -------
    torch.nn.Module
        The timm model (not yet in eval mode).

    Raises
    ------
    ModelLoadError
        An unknown timm name (close names suggested) or pretrained tag, or timm cannot build it.
    UnsupportedModelError
        An architecture this tool cannot inspect.
    WeightsUnavailableError
        The pretrained weights are not cached and the hub cannot be reached.
    """
    if name.startswith("hf-hub:"):
        if pretrained:
            ensure_hub_reachable(name.removeprefix("hf-hub:").split("@")[0], name)
        return create_timm_model(name, pretrained=pretrained, **model_kwargs)
    architecture, _, tag = name.partition(".")
    if not timm.is_model(architecture):
        close = difflib.get_close_matches(architecture, timm.list_models(), n=5, cutoff=0.6)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise ModelLoadError(
            f"Unknown timm model {name!r}.{hint} List ViTs with timm.list_models('vit_*'); "
            "for your own weights pass a folder or a file path."
        )
    check_supported_architecture(architecture)
    if tag:
        tags = [n.partition(".")[2] for n in timm.list_pretrained(f"{architecture}.*")]
        if tag not in tags:
            raise ModelLoadError(
                f"{architecture!r} has no pretrained tag {tag!r}. Available: {', '.join(tags) or 'none'}."
            )
    if pretrained:
        ensure_pretrained_available(name)
    return create_timm_model(name, pretrained=pretrained, **model_kwargs)
