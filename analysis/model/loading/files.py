"""Local weights: a folder in timm's hub layout, or a single weights file with ``arch=``."""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from ...base.errors import CheckpointError, ModelPathNotFoundError
from .checkpoints import load_state_dict_into, npz_num_classes, read_state_dict
from .families import check_supported_architecture
from .hub import create_timm_model

__all__ = [
    "SINGLE_FILE_SUFFIXES",
    "looks_like_file",
    "looks_like_path",
    "existing_model_path",
    "read_folder_config",
    "model_from_timm_folder",
    "model_from_file",
    "check_config_fits_weights",
    "weights_values",
    "values_on_meta",
    "values_beyond_weights",
]

SINGLE_FILE_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".npz")
# Sources that name a model somewhere else, although they may contain a "/".
_NAME_SCHEMES = ("hf-hub:", "hf:", "torchvision:")
_WINDOWS_DRIVE = re.compile(r"^[A-Za-z]:[\\/]")


def looks_like_file(source: str) -> bool:
    """Whether a model source is a single weights file: it ends with a weights-file suffix
    (:data:`SINGLE_FILE_SUFFIXES`) or names an existing file.

    Parameters
    ----------
    source : str
        The model source as given.

    Returns
    -------
    bool
        True for a file source.
    """
    return source.lower().endswith(SINGLE_FILE_SUFFIXES) or Path(source).is_file()


def looks_like_path(source: str) -> bool:
    """Whether a model source is written as a path on disk rather than as a model name.

    Rule: it starts with ``local-dir:``, contains a path separator (``/`` or ``\\``), starts
    with ``.``, ``~`` or a Windows drive (``C:\\``), or ends with a weights-file suffix
    (:data:`SINGLE_FILE_SUFFIXES`). Names never do: timm names are letters, digits, ``_``, ``-``
    and a ``.tag`` (``vit_base_patch16_224.augreg2_in21k_ft_in1k``), and the ``hf-hub:``,
    ``hf:`` and ``torchvision:`` names (which may hold an ``org/name``) are not paths. A bare
    word such as ``my_model`` is a name here (False), although the loader still opens a folder or file of
    that name when one exists.

    Parameters
    ----------
    source : str or os.PathLike
        The model source as given (surrounding whitespace ignored).

    Returns
    -------
    bool
        True when it is written as a path.
    """
    text = os.fspath(source).strip()
    if text.startswith(_NAME_SCHEMES):
        return False
    return (
        text.startswith("local-dir:")
        or "/" in text
        or "\\" in text
        or text.startswith((".", "~"))
        or bool(_WINDOWS_DRIVE.match(text))
        or text.lower().endswith(SINGLE_FILE_SUFFIXES)
    )


def existing_model_path(source: str) -> Path:
    """The path a path-like model source (see :func:`looks_like_path`) names, ``~`` expanded and
    any ``local-dir:`` prefix removed.

    Parameters
    ----------
    source : str or os.PathLike
        The model source as given.

    Returns
    -------
    pathlib.Path
        The existing folder or file.

    Raises
    ------
    ModelPathNotFoundError
        Nothing is there; the message names the path and, for a relative one, the absolute path it
        was looked up as.
    """
    given = os.fspath(source).strip().removeprefix("local-dir:")
    path = Path(given).expanduser()
    if path.exists():
        return path
    where = "" if path.is_absolute() else f" (that is {path.absolute()})"
    raise ModelPathNotFoundError(
        f"The path {given!r} does not exist{where}: there is no folder or file there. Check the path (it is "
        "read on the machine that runs the model). A model folder holds config.json and model.safetensors; "
        "a single weights file (.safetensors, .pth, .pt, .bin, .npz) also needs arch='<its timm architecture>'. "
        "A timm model is named without a path, e.g. vit_base_patch16_224.",
        path,
    )


def read_folder_config(folder: Path) -> dict:
    """The ``config.json`` of a model folder (timm hub layout or a Hugging Face ``save_pretrained`` folder).

    Parameters
    ----------
    folder : pathlib.Path
        The model folder.

    Returns
    -------
    dict
        The parsed JSON object.

    Raises
    ------
    CheckpointError
        The folder has no ``config.json``, or it cannot be read or does not hold a JSON object.
    """
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise CheckpointError(
            f"{folder} has no config.json. A model folder needs timm's hub layout (config.json with "
            "architecture, model_args, pretrained_cfg + model.safetensors) or a Hugging Face "
            "transformers save_pretrained folder."
        )
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"Could not read {config_path}: {exc}") from exc
    if not isinstance(config, dict):
        raise CheckpointError(f"{config_path} does not hold a JSON object.")
    return config


def model_from_timm_folder(folder: Path, config: dict, model_kwargs: dict) -> nn.Module:
    """Build from timm's hub layout: config.json (+ model.safetensors, pytorch_model.bin or model.pth).

    The config's ``model_args`` and ``num_classes`` (else ``pretrained_cfg["num_classes"]``) are the
    constructor arguments, ``model_kwargs`` overriding them; the config is checked against the
    weights' size first (:func:`check_config_fits_weights`), then the weights are loaded strictly.

    Parameters
    ----------
    folder : pathlib.Path
        The model folder.
    config : dict
        Its ``config.json`` (:func:`read_folder_config`), with ``architecture``, ``model_args``
        and ``pretrained_cfg``.
    model_kwargs : dict
        Extra ``timm.create_model`` arguments, taking precedence over the config's.

    Returns
    -------
    torch.nn.Module
        The timm model with the folder's weights (not yet in eval mode).

    Raises
    ------
    CheckpointError
        The config names no ``architecture``; the folder has no weights file; the config describes
        a larger model than the weights; the weights do not fit the model.
    UnsupportedModelError
        The architecture is one this tool cannot inspect.
    ModelLoadError
        timm does not know the architecture or cannot build it.
    """
    architecture = config.get("architecture")
    if not architecture:
        raise CheckpointError(
            f"{folder / 'config.json'} names neither an 'architecture' (a timm model name) nor a "
            "'model_type' (a Hugging Face transformers model)."
        )
    check_supported_architecture(architecture)
    kwargs = dict(config.get("model_args") or {})
    num_classes = config.get("num_classes", (config.get("pretrained_cfg") or {}).get("num_classes"))
    if num_classes is not None:
        kwargs.setdefault("num_classes", num_classes)
    kwargs.update(model_kwargs)
    pretrained_cfg = dict(config.get("pretrained_cfg") or {})
    weights = next((folder / name for name in FOLDER_WEIGHTS if (folder / name).is_file()), None)
    if weights is None:
        raise CheckpointError(f"{folder} has config.json but no model.safetensors (or pytorch_model.bin).")
    check_config_fits_weights(folder, architecture, weights, pretrained_cfg_overlay=pretrained_cfg, **kwargs)
    model = create_timm_model(architecture, pretrained=False, pretrained_cfg_overlay=pretrained_cfg, **kwargs)
    load_state_dict_into(model, read_state_dict(weights), weights)
    return model


FOLDER_WEIGHTS = ("model.safetensors", "pytorch_model.bin", "model.pth")
# A folder's model may hold this many more values than its weights file (buffers, a head left at its init)
# before its config.json is taken to describe another model.
CONFIG_SLACK_VALUES = 16 * 2**20


def weights_values(path: Path) -> int:
    """How many values (tensor elements) a weights file holds at most: counted from a safetensors
    header (no tensor is read), else the file's size in bytes over 2 (16-bit values at the least).

    Parameters
    ----------
    path : pathlib.Path
        The weights file.

    Returns
    -------
    int
        The number of values.

    Raises
    ------
    CheckpointError
        A ``.safetensors`` file whose header cannot be read (or declares more than 100 MiB).
    """
    if path.suffix == ".safetensors":
        try:
            with path.open("rb") as handle:
                size = int.from_bytes(handle.read(8), "little")
                if size > 100 * 2**20:  # the format's own bound on its header
                    raise ValueError(f"a header of {size:,} bytes")
                header = json.loads(handle.read(size))
            return sum(math.prod(entry["shape"]) for name, entry in header.items() if name != "__metadata__")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{path.name} is not a readable safetensors file ({exc}).") from exc
    return path.stat().st_size // 2


def values_on_meta(build: Callable[[], Any]) -> int | None:
    """The values of the model ``build()`` makes on PyTorch's ``meta`` device (shapes only, no
    memory): ``Σ numel(t)`` over its state dict (parameters and buffers).

    Parameters
    ----------
    build : Callable[[], torch.nn.Module]
        Builds the model (from a config, without weights); called once, on ``meta``.

    Returns
    -------
    int or None
        The number of values; ``None`` when the model cannot be built on ``meta`` (then the real
        build decides).
    """
    try:
        with torch.device("meta"):
            shapes = build().state_dict()
        return sum(t.numel() for t in shapes.values())
    except Exception:  # noqa: BLE001 - not buildable on meta: the real build decides
        return None


def values_beyond_weights(build: Callable[[], Any], weights: Sequence[Path]) -> tuple[int, int] | None:
    """The part :func:`check_config_fits_weights` and
    :func:`~analysis.model.loading.hf_transformers.check_hf_config_fits_weights` share: the values
    of the model ``build()`` makes (:func:`values_on_meta`) against those the ``weights`` files hold
    (:func:`weights_values`, read first), refused when

        values(model) > values(weights) + CONFIG_SLACK_VALUES.

    Parameters
    ----------
    build : Callable[[], torch.nn.Module]
        Builds the model the config describes; called once, on ``meta``.
    weights : Sequence of pathlib.Path
        The weights files, their values summed.

    Returns
    -------
    tuple of (int, int) or None
        ``(needed, held)``, the model's and the files' values, when the model does not fit them;
        ``None`` when it fits or cannot be built on ``meta``.

    Raises
    ------
    CheckpointError
        A weights file is an unreadable safetensors file.
    """
    held = sum(weights_values(path) for path in weights)
    needed = values_on_meta(build)
    if needed is None or needed <= held + CONFIG_SLACK_VALUES:
        return None
    return needed, held


def check_config_fits_weights(folder: Path, architecture: str, weights: Path, **kwargs: Any) -> None:
    """Refuse a ``config.json`` that describes a larger model than its weights file holds, before
    anything is allocated: the model is built on PyTorch's ``meta`` device (shapes only, no memory)
    and the values of its state dict counted,

        values(model) = Σ numel(t)  over its parameters and buffers,

    against :func:`weights_values` of the file plus :data:`CONFIG_SLACK_VALUES`. A config of depth 400
    or width 10⁶ beside a 12-block ViT's weights is refused in a second or two (it would otherwise
    allocate gigabytes before the weights' shapes refuse it). A model that cannot be built on ``meta`` is
    left to the ordinary load.

    Parameters
    ----------
    folder : pathlib.Path
        The model folder, as the error names its ``config.json``.
    architecture : str
        The timm architecture the config names.
    weights : pathlib.Path
        The folder's weights file.
    **kwargs : Any
        The ``timm.create_model`` arguments the config gives.

    Raises
    ------
    CheckpointError
        The model holds more than the file's values plus :data:`CONFIG_SLACK_VALUES`, or the file is
        an unreadable safetensors file.
    """
    beyond = values_beyond_weights(lambda: create_timm_model(architecture, pretrained=False, **kwargs), [weights])
    if beyond is not None:
        needed, held = beyond
        raise CheckpointError(
            f"{folder / 'config.json'} describes a {architecture} of {needed / 1e6:,.1f} M values, but "
            f"{weights.name} holds {held / 1e6:,.1f} M: the config does not fit its weights (check model_args: "
            "depth, embed_dim, ...). Nothing was built."
        )


def model_from_file(path: Path, arch: str | None, model_kwargs: dict) -> nn.Module:
    """Build the timm model ``arch`` and load a single weights file into it.

    A Google ViT ``.npz`` is loaded by timm's ``load_pretrained`` (its ``num_classes`` read from the
    archive); any other file is read as a state dict (:func:`read_state_dict`), ``num_classes``
    taken from its ``head.weight`` (0 without one) unless given, and loaded strictly.

    Parameters
    ----------
    path : pathlib.Path
        The weights file (:data:`SINGLE_FILE_SUFFIXES`).
    arch : str or None
        The timm architecture it was trained with; required.
    model_kwargs : dict
        Extra ``timm.create_model`` arguments.

    Returns
    -------
    torch.nn.Module
        The timm model with the file's weights (not yet in eval mode).

    Raises
    ------
    CheckpointError
        The file does not exist, no ``arch`` was given, or the file is unreadable or does not fit.
    UnsupportedModelError
        ``arch`` is one this tool cannot inspect.
    ModelLoadError
        timm does not know ``arch`` or cannot build it.
    """
    if not path.is_file():
        raise CheckpointError(f"Checkpoint file not found: {path}. Check the path (it is read on the server).")
    if not arch:
        raise CheckpointError(
            f"{path.name} is a bare weights file: pass the timm architecture it was trained with, "
            "e.g. load_vit(path, arch='vit_base_patch16_224') (in the app: the 'architecture' field)."
        )
    check_supported_architecture(arch)
    if path.suffix.lower() == ".npz":
        kwargs = dict(model_kwargs)
        if "num_classes" not in kwargs:
            kwargs["num_classes"] = npz_num_classes(path)
        model: Any = create_timm_model(arch, pretrained=False, **kwargs)  # a timm ViT: load_pretrained
        try:
            model.load_pretrained(str(path))  # timm's loader for Google's original ViT .npz files
        except Exception as exc:  # noqa: BLE001 - any failure means the file does not fit
            raise CheckpointError(f"{path.name} is not a Google ViT .npz checkpoint for {arch}: {exc}") from exc
        return model
    state_dict = read_state_dict(path)
    kwargs = dict(model_kwargs)
    head = state_dict.get("head.weight")
    if "num_classes" not in kwargs and isinstance(head, torch.Tensor) and head.ndim == 2:
        kwargs["num_classes"] = head.shape[0]
    if "num_classes" not in kwargs and "head.weight" not in state_dict:
        kwargs["num_classes"] = 0
    model = create_timm_model(arch, pretrained=False, **kwargs)
    load_state_dict_into(model, state_dict, path)
    return model
