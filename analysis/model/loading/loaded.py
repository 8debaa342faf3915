"""``LoadedViT``: the one object every analysis sees, whatever library the model came from."""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn as nn
from PIL import Image

from ...base.errors import AnalysisError, ModelLoadError, UnsupportedModelError
from ...base.preprocessing import Preprocessing
from ..adapters import block_sites
from ..geometry import ViTSpec, patch_embedding_module
from ..spec import spec_from_model
from .families import SUPPORTED_FAMILIES

__all__ = [
    "LoadedModel",
    "LoadedViT",
    "wrap_model",
    "class_names_for",
    "place_model",
    "class_probabilities",
    "PROBABILITY_RULES",
]

_CPU_COPY_LOCK = threading.Lock()


#: probability rule -> what it computes from the logits (:func:`class_probabilities`)
PROBABILITY_RULES = {
    "softmax": "softmax over the prompts (CLIP) or the classes",
    "sigmoid": "a sigmoid per prompt (SigLIP) or class",
}


def class_probabilities(logits: torch.Tensor, rule: str = "softmax") -> torch.Tensor:
    """``(B, classes)`` probabilities of ``logits`` ``(B, classes)`` by a model's own ``rule``: ``"softmax"``
    (an image classifier trained with cross-entropy; CLIP over its prompts, Radford et al. 2021) or
    ``"sigmoid"`` (each class on its own, SigLIP's pairwise loss, Zhai et al. 2023), in float32.
    The one implementation every analysis and page uses (:meth:`LoadedModel.probabilities`).

    Parameters
    ----------
    logits : torch.Tensor
        ``(B, classes)`` scores (any floating dtype; computed in float32).
    rule : str, default "softmax"
        A key of :data:`PROBABILITY_RULES`: ``"softmax"`` over the last axis, or ``"sigmoid"`` per entry.

    Returns
    -------
    torch.Tensor
        ``(B, classes)`` float32 probabilities, on the device of ``logits``.

    Raises
    ------
    AnalysisError
        For an unknown ``rule``.
    """
    if rule == "softmax":
        return logits.float().softmax(-1)
    if rule == "sigmoid":
        return logits.float().sigmoid()
    raise AnalysisError(f"Unknown probability rule {rule!r}: one of {', '.join(PROBABILITY_RULES)}.")


def top_classes(scores, k: int | None = None) -> list[int]:
    """The indices of the ``k`` highest of ``scores``, highest first; equal scores in class order
    (a stable sort). The one ranking every page and analysis uses.

    Parameters
    ----------
    scores : torch.Tensor, numpy.ndarray or list of float
        ``(classes,)`` one image's probabilities or logits.
    k : int or None, default None
        How many indices to return (at least 0); ``None``: every class.

    Returns
    -------
    list of int
        Class indices, at most ``k`` of them (every class for ``k=None``), highest score first.

    Raises
    ------
    AnalysisError
        For ``scores`` that are not one-dimensional, or a negative ``k``.
    """
    values = np.asarray(torch.as_tensor(scores).detach().float().cpu())
    if values.ndim != 1:
        raise AnalysisError(f"top_classes ranks one image's scores, shape (classes,); got shape {values.shape}.")
    if k is not None and k < 0:
        raise AnalysisError(f"top_classes: k must be at least 0, got {k}.")
    order = np.argsort(-values, kind="stable")
    return [int(i) for i in order[: len(order) if k is None else k]]


def class_label(class_names, index: int) -> str:
    """The name of class ``index``: ``class_names[index]``, or ``"class {index}"`` when the
    model has no names (``class_names`` None or empty).

    Parameters
    ----------
    class_names : sequence of str or None
        One name per class (e.g. ``vit.class_names``), or ``None`` / empty for a model without names.
    index : int
        The class index.

    Returns
    -------
    str
        The class's name, or ``"class {index}"``.

    Raises
    ------
    AnalysisError
        For an ``index`` outside ``0..len(class_names) - 1`` when the model has names.
    """
    if class_names and not 0 <= int(index) < len(class_names):
        raise AnalysisError(
            f"Class {index} is not one of the model's {len(class_names)} classes (0 to {len(class_names) - 1})."
        )
    return str(class_names[index]) if class_names else f"class {index}"


@dataclass(eq=False)
class LoadedModel:
    """A loaded image model with its preprocessing: what feeding it needs, for a ViT
    (:class:`LoadedViT`) and for a comparison CNN (:class:`~analysis.robustness.LoadedCNN`).

    Its class attribute ``probability_rule`` (``"softmax"`` unless a subclass says otherwise, a key
    of :data:`PROBABILITY_RULES`) says how its logits become class probabilities.

    Attributes
    ----------
    model : torch.nn.Module
        The model, eval mode, on ``device``.
    name : str
        The source it was loaded from.
    device : torch.device
        Where the model lives.
    spec : ViTSpec
        Its geometry (for a ViT: tokens, position-embedding kind and head kind).
    class_names : list of str or None
        One name per output class, or ``None`` (also for models without classes).
    preprocessing : Preprocessing
        Resize / crop / normalise at ``spec.img_size``.
    data_config : dict, default {}
        timm's data config it was built from.
    """

    model: nn.Module
    name: str
    device: torch.device
    spec: ViTSpec
    class_names: list[str] | None
    preprocessing: Preprocessing
    data_config: dict = field(default_factory=dict)

    #: how its logits become class probabilities (a key of :data:`PROBABILITY_RULES`)
    probability_rule = "softmax"

    def preprocess(self, image: Image.Image, *, cropped: bool = False) -> torch.Tensor:
        """PIL image -> ``(1, 3, H, W)`` float tensor (CPU) at the model's input size. ``cropped``: the
        image is already what :meth:`model_input_image` gives (resized and centre-cropped to
        ``spec.img_size``), so it is only normalised, not resized again."""
        if not cropped:
            return self.preprocessing(image)
        height, width = self.spec.img_size
        if image.size != (width, height):
            raise AnalysisError(
                f"A cropped input must be the model's input size {width}x{height} (W x H), not "
                f"{image.size[0]}x{image.size[1]}: pass model_input_image's output."
            )
        unit = torch.from_numpy(np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0).permute(2, 0, 1)
        return self.preprocessing.normalise(unit).unsqueeze(0)

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """``(B, classes)`` float32 class probabilities of its ``logits`` by its own rule
        (:func:`class_probabilities` with :attr:`probability_rule`)."""
        return class_probabilities(logits, self.probability_rule)

    def top1(self, images, *, batch_size: int = 32, cropped: bool = False) -> np.ndarray:
        """``(N,)`` int64: each image's most probable class (``argmax`` of the logits), the PIL or uint8
        ``(H, W, 3)`` ``images`` fed through its own preprocessing and forward in batches, no gradients.
        The one prediction rule of the robustness measures, the command line and the pages.
        ``cropped``: the images are already what :meth:`model_input_image` gives (the model's resized,
        centre-cropped input at ``spec.img_size``), so they are only normalised, not resized again."""
        classes = []
        with torch.no_grad():
            for start in range(0, len(images), int(batch_size)):
                pictures = [
                    i if isinstance(i, Image.Image) else Image.fromarray(np.asarray(i, dtype=np.uint8))
                    for i in images[start : start + int(batch_size)]
                ]
                pixels = torch.cat([self.preprocess(picture, cropped=cropped) for picture in pictures])
                classes.append(self.model(pixels.to(self.device, torch.float32)).argmax(-1).cpu().numpy())
        return np.concatenate(classes) if classes else np.zeros(0, dtype=np.int64)

    def model_input_image(self, image: Image.Image) -> Image.Image:
        """The resized, centre-cropped RGB image (W, H) the model sees: draw overlays on this."""
        return self.preprocessing.crop(image)

    def minimum_input_side(self) -> int:
        """The smallest image side (px) worth feeding: the larger of the patch side and the
        grid side. Below it, a patch holds less than one original pixel, or the whole image
        is smaller than one patch."""
        return max(*self.spec.patch_size, *self.spec.grid_size)

    def small_input_note(self, width: int, height: int) -> str | None:
        """A warning for an image too small to say anything about (see
        :meth:`minimum_input_side`), else ``None``. The model still runs on it: the image is
        upsampled to the model's input like any other."""
        minimum = self.minimum_input_side()
        if min(width, height) >= minimum:
            return None
        input_h, input_w = self.spec.img_size
        return (
            f"The image is only {width}×{height} px: it is upsampled to the model's "
            f"{input_w}×{input_h} px input, so each {self.spec.patch_size[1]}×{self.spec.patch_size[0]} px "
            f"patch holds about {min(width, height) / min(self.spec.grid_size):.2g} original pixels across "
            f"and the maps and the prediction say little about the image. Use an image of at least "
            f"{minimum}×{minimum} px."
        )


@dataclass(eq=False)
class LoadedViT(LoadedModel):
    """A loaded ViT with everything needed to feed it and read it (the fields of
    :class:`LoadedModel`, and :attr:`source_library`).

    Attributes
    ----------
    model : torch.nn.Module
        A timm ViT-like model (``VisionTransformer``, ``Eva``, ``Beit``, ...), eval mode, on
        ``device``. Hugging Face and torchvision models are assembled into the equivalent timm
        model from their own modules (weights are shared, not copied).
    name : str
        The source it was loaded from.
    device : torch.device
        Where the model lives.
    spec : ViTSpec
        Token geometry at the configured input size, position-embedding kind and head kind.
    class_names : list of str or None
        One name per output class, or ``None`` (also for models without classes).
    preprocessing : Preprocessing
        Resize / crop / normalise at ``spec.img_size``.
    data_config : dict
        timm's data config it was built from (``input_size`` is ``(3, H, W)`` of ``spec.img_size``).
    source_library : str, default "timm"
        ``"timm"``, ``"transformers"``, ``"torchvision"``, or ``"open_clip"`` (the image tower of an
        open_clip model, :func:`~analysis.model.loading.two_tower.load_clip`).
    """

    source_library: str = "timm"
    _cpu_copy: nn.Module | None = field(default=None, repr=False)

    def cpu_model(self) -> nn.Module:
        """A private float32 CPU copy of the model (made once), for out-of-memory fallbacks:
        the shared model stays on its device, where other sessions are using it."""
        if self.device.type == "cpu":
            return self.model
        with _CPU_COPY_LOCK:
            if self._cpu_copy is None:
                self._cpu_copy = copy.deepcopy(self.model).float().to("cpu")
            return self._cpu_copy

    @property
    def num_classes(self) -> int:
        """Number of classes of a classification head (0 for embedding towers and headless models)."""
        return self.spec.num_outputs if self.spec.has_classifier else 0

    def __repr__(self) -> str:
        s = self.spec
        return (
            f"LoadedViT({self.name!r}, {s.family}, device={self.device.type}, img_size={s.img_size}, "
            f"patch={s.patch_size}, grid={s.grid_size}, prefix_tokens={s.num_prefix_tokens}, "
            f"layers={s.num_layers}, heads={s.num_heads}, positions={s.position_embedding}, head={s.head})"
        )


def class_names_for(model: nn.Module, label_names: list[str] | None) -> list[str] | None:
    """One name per class of ``model``: ``label_names`` when it names each of ``model.num_classes``,
    else timm's ImageNet descriptions for a 1000 / 11821 / 21841 / 21843-class head whose subset
    timm infers, else ``None`` (never an error).

    Parameters
    ----------
    model : torch.nn.Module
        The classifier (its ``num_classes`` is read).
    label_names : list of str or None
        The names its source gives (e.g. a transformers config's ``id2label``).

    Returns
    -------
    list of str or None
        The names, or ``None``.
    """
    num_classes = int(getattr(model, "num_classes", 0) or 0)
    if label_names and len(label_names) == num_classes:
        return [str(n) for n in label_names]
    if num_classes in (1000, 11821, 21841, 21843):
        try:
            from timm.data import ImageNetInfo, infer_imagenet_subset

            subset = infer_imagenet_subset(model)
            if subset:
                return list(ImageNetInfo(subset).label_descriptions())
        except Exception:  # noqa: BLE001 - class names are a nicety, never a failure
            return None
    return None


def _timm_data_config(model: nn.Module) -> dict:
    from timm.data import resolve_data_config

    return dict(resolve_data_config({}, model=model))


def wrap_model(
    model: nn.Module,
    name: str,
    device: torch.device | None,
    label_names: list[str] | None = None,
    *,
    embedding_output: bool = False,
    data_config: dict | None = None,
    source_library: str = "timm",
    default_img_size: tuple[int, int] | None = None,
    freeze: bool = True,
) -> LoadedViT:
    """Check that ``model`` is a ViT the adapters can read, then wrap it: its spec read off it
    (:func:`~analysis.model.spec.spec_from_model`), placed on ``device`` in eval mode, its
    preprocessing built at ``spec.img_size``.

    Parameters
    ----------
    model : torch.nn.Module
        A timm ViT-like model (or one assembled from another library's modules).
    name : str
        The source it was loaded from.
    device : torch.device or None
        Where to put it; ``None`` leaves the model where it is (model objects from a notebook).
    label_names : list of str or None, default None
        Class names from the source (:func:`class_names_for`); kept only for a classifier.
    embedding_output : bool, default False
        The head projects to an image-text embedding (CLIP/SigLIP/PE towers), not to classes.
    data_config : dict or None, default None
        timm-style data config (mean, std, interpolation, crop); ``None``: timm's
        ``resolve_data_config`` for the model. Its ``input_size`` is set to ``(3, H, W)`` of ``spec.img_size``.
    source_library : str, default "timm"
        :attr:`LoadedViT.source_library`.
    default_img_size : tuple of int or None, default None
        ``(H, W)`` input size of a model whose patch embedding has none (NaFlex); ``None``: its
        ``pretrained_cfg``'s ``input_size``, else 224.
    freeze : bool, default True
        Turn off ``requires_grad``; ``False`` leaves it untouched (the caller's own module).

    Returns
    -------
    LoadedViT
        The wrapped model.

    Raises
    ------
    UnsupportedModelError
        No patch embedding; a block whose attention no adapter knows; windowed and global layers
        mixed, or a windowed model with ``dynamic_img_size``; an ``img_size`` that is not a multiple
        of the patch size.
    ModelLoadError
        The model cannot move to ``device``.
    """
    if patch_embedding_module(model) is None:
        raise UnsupportedModelError(
            f"{name!r} ({type(model).__name__}) has no patch embedding: it is not a ViT this tool can inspect. "
            f"Supported: {SUPPORTED_FAMILIES}."
        )
    block_sites(model, name)  # every block's attention must have an adapter
    if default_img_size is None and patch_embedding_module(model) is getattr(model, "embeds", None):
        input_size = (getattr(model, "pretrained_cfg", None) or {}).get("input_size") or (3, 224, 224)
        default_img_size = tuple(input_size[-2:])
    spec = spec_from_model(model, embedding_output=embedding_output, default_img_size=default_img_size)
    embed = patch_embedding_module(model)
    declared = getattr(embed, "img_size", None)
    declared = tuple(int(v) for v in declared) if declared else None
    if declared and declared != spec.img_size and not spec.dynamic_img_size:
        ph, pw = spec.patch_size
        raise UnsupportedModelError(
            f"img_size {declared[0]}x{declared[1]} is not a multiple of the patch size {ph}x{pw}: "
            f"use e.g. img_size={spec.img_size[0]} or {spec.img_size[0] + ph}."
        )
    model, device = place_model(model, device)
    model.eval()
    if freeze:
        model.requires_grad_(False)
    config = dict(data_config) if data_config is not None else _timm_data_config(model)
    config["input_size"] = (3, *spec.img_size)  # the model's actual size wins over the pretrained default
    return LoadedViT(
        model=model,
        name=name,
        device=device,
        spec=spec,
        class_names=class_names_for(model, label_names) if spec.has_classifier else None,
        preprocessing=Preprocessing.from_data_config(config, spec.img_size),
        data_config=config,
        source_library=source_library,
    )


def place_model(model: nn.Module, device: torch.device | None) -> tuple[nn.Module, torch.device]:
    """``(model on device, device)``; ``device=None`` keeps it where its parameters are.

    Parameters
    ----------
    model : torch.nn.Module
        The model.
    device : torch.device or None
        Where to move it; ``None``: the device of its first parameter (the CPU without parameters).

    Returns
    -------
    tuple of (torch.nn.Module, torch.device)
        The moved model and its device.

    Raises
    ------
    ModelLoadError
        The model cannot move (e.g. no such GPU); the message says to use the CPU.
    """
    if device is None:
        return model, next((p.device for p in model.parameters()), torch.device("cpu"))
    try:
        return model.to(device), device
    except (RuntimeError, AssertionError) as exc:
        raise ModelLoadError(f"Cannot move the model to {device}: {exc}. Use device='cpu'.") from exc
