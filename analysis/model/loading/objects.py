"""Model objects a notebook already holds: timm, Hugging Face transformers or torchvision.

The module is wrapped, never copied: a timm model is used as it is, and a Hugging Face or
torchvision model is assembled into the equivalent timm model *from its own submodules and
parameters*, so both share every weight tensor. The module is put in eval mode; its
``requires_grad`` flags and its device are left as they are (pass ``device=`` to move it).
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn as nn

from ...base.errors import ModelLoadError
from ...base.preprocessing import Preprocessing
from ..geometry import as_pair
from .families import check_supported_module
from .loaded import LoadedViT, wrap_model

__all__ = ["wrap_module", "apply_overrides"]


def wrap_module(
    module: nn.Module,
    *,
    device: torch.device | None = None,
    img_size=None,
    mean=None,
    std=None,
    **unknown,
) -> LoadedViT:
    """Wrap a model object a notebook already holds (module docstring): a timm model as it is, a
    Hugging Face or torchvision model assembled into the equivalent timm model from its own modules.

    Its ``requires_grad`` flags are left as they are (not frozen), and its device too unless
    ``device`` is given.

    Parameters
    ----------
    module : torch.nn.Module
        A timm ViT-like model, a transformers vision model or a torchvision ViT / Swin.
    device : torch.device or None, default None
        Where to move it; ``None`` leaves it where it is.
    img_size : int, tuple of int or None, default None
        Input size ``H`` or ``(H, W)``: a torchvision Swin is built at it, a transformers model's
        position table resized to it; other models take it only when built with ``dynamic_img_size``.
    mean : sequence of float or None, default None
        Per-channel normalisation mean, overriding the model's.
    std : sequence of float or None, default None
        Per-channel normalisation std, overriding the model's.
    **unknown : Any
        Refused: any other option.

    Returns
    -------
    LoadedViT
        Named ``"<module.Class object>"``.

    Raises
    ------
    ModelLoadError
        An unknown option; an ``img_size`` the model cannot take.
    UnsupportedModelError
        A model (or timm family) this tool cannot inspect.
    """
    if unknown:
        raise ModelLoadError(
            f"Unexpected options for a model object: {', '.join(sorted(unknown))}. A module is wrapped as "
            "it is; only img_size=, mean= and std= (preprocessing) and device= are accepted."
        )
    from . import hf_transformers, torchvision_source, torchvision_swin

    name = f"<{type(module).__module__}.{type(module).__name__} object>"
    if type(module).__module__.startswith("torchvision.models"):
        swin = torchvision_swin.is_torchvision_swin(module)  # any input size: built at img_size (default 224/256)
        vit = torchvision_source.wrap_torchvision(
            module, name, device, freeze=False, img_size=img_size if swin else None
        )
        img_size = None if swin else img_size
    elif hf_transformers.is_hf_model(module):  # its position table is resized the way transformers does
        return hf_transformers.wrap_hf(module, name, device, freeze=False, img_size=img_size, mean=mean, std=std)
    else:
        check_supported_module(module)  # a refused timm family: the reason its name would get
        vit = wrap_model(module, name, device, getattr(module, "pretrained_cfg", {}).get("label_names"), freeze=False)
    return apply_overrides(vit, img_size=img_size, mean=mean, std=std)


def apply_overrides(vit: LoadedViT, *, img_size=None, mean=None, std=None) -> LoadedViT:
    """The same model with another input size (dynamic-size models only) or normalisation.

    Parameters
    ----------
    vit : LoadedViT
        The wrapped model.
    img_size : int, tuple of int or None, default None
        Input size ``H`` or ``(H, W)``, whole patches; ``None`` keeps ``spec.img_size``.
    mean : sequence of float or None, default None
        Per-channel normalisation mean; ``None`` keeps the model's.
    std : sequence of float or None, default None
        Per-channel normalisation std; ``None`` keeps the model's.

    Returns
    -------
    LoadedViT
        ``vit`` itself when nothing changes, else a copy with the new spec, data config and
        preprocessing (the same ``nn.Module``).

    Raises
    ------
    ModelLoadError
        Another ``img_size`` for a model without ``dynamic_img_size``, or one that is not whole patches.
    """
    spec = vit.spec
    if img_size is not None:
        height, width = as_pair(img_size)
        ph, pw = spec.patch_size
        if (height, width) != spec.img_size:
            if not spec.dynamic_img_size:
                raise ModelLoadError(
                    f"This model object was built for {spec.img_size[0]}x{spec.img_size[1]} inputs and cannot "
                    f"take img_size={img_size}: rebuild it at that size (or with dynamic_img_size=True)."
                )
            if height % ph or width % pw:
                raise ModelLoadError(f"img_size={img_size} is not a whole number of {ph}x{pw} patches.")
            spec = spec.with_image_size(height, width)
    if spec is vit.spec and mean is None and std is None:
        return vit
    config = dict(vit.data_config)
    config["input_size"] = (3, *spec.img_size)
    if mean is not None:
        config["mean"] = tuple(float(m) for m in mean)
    if std is not None:
        config["std"] = tuple(float(s) for s in std)
    return replace(
        vit, spec=spec, data_config=config, preprocessing=Preprocessing.from_data_config(config, spec.img_size)
    )
