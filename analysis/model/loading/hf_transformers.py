"""Hugging Face ``transformers`` vision models: ViT, DeiT, DINOv2 (with and without
registers), CLIP vision, SigLIP vision.

Converted once, at the boundary, into the equivalent timm ``VisionTransformer`` built from
the Hugging Face model's *own* modules and parameters (see :mod:`.assemble`; nothing is
copied): its patch projection, class/distillation/register tokens and position table, each
layer's LayerNorms, MLP and layer scales, and its head. The separate q/k/v projections
become timm's ``qkv`` through :class:`~.assemble.ConcatLinear`, so the timm attention
adapter reads ``softmax(q·kᵀ/√d)``, the same probabilities that transformers returns with
``output_attentions=True`` under eager attention. Swin and Swin V2 classifiers become timm's
Swin the same way, in :mod:`.hf_swin`.

``transformers`` is optional: without it these sources raise a ModelLoadError that says
``pip install transformers``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from timm.models.deit import VisionTransformerDistilled
from timm.models.vision_transformer import VisionTransformer

from ...base.errors import CheckpointError, ModelLoadError, UnsupportedModelError, WeightsUnavailableError
from . import hf_swin
from .assemble import ConcatLinear, finish, shared_linear, skeleton
from .hf_parts import IntermediateOutput, first_attribute, from_folder, require_transformers
from .loaded import LoadedViT, wrap_model

__all__ = [
    # Third-party models and their layers are annotated ``Any`` where their submodules are read by name: torch's
    # ``nn.Module.__getattr__`` types every such attribute as ``Tensor | Module``, whatever the library put there.
    "SUPPORTED_MODEL_TYPES",
    "is_hf_model",
    "wrap_hf",
    "load_hf_folder",
    "load_hf",
    "hf_snapshot",
    "preprocessing_config",
    "read_preprocessor",
    "check_hf_config_fits_weights",
]

SUPPORTED_MODEL_TYPES = (
    "vit",
    "deit",
    "dinov2",
    "dinov2_with_registers",
    "clip",
    "clip_vision_model",
    "siglip",
    "siglip_vision_model",
    "swin",
    "swinv2",
)
_IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
_CLIP = ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))
_HALF = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
# The image processors' defaults per model type (used when there is no preprocessor_config.json).
_DEFAULT_PREPROCESSING = {
    "vit": dict(mean=_HALF[0], std=_HALF[1], interpolation="bilinear", crop_pct=1.0, crop_mode="squash"),
    "deit": dict(mean=_IMAGENET[0], std=_IMAGENET[1], interpolation="bicubic", crop_pct=224 / 256, crop_mode="center"),
    "dinov2": dict(
        mean=_IMAGENET[0], std=_IMAGENET[1], interpolation="bicubic", crop_pct=224 / 256, crop_mode="center"
    ),
    "clip": dict(mean=_CLIP[0], std=_CLIP[1], interpolation="bicubic", crop_pct=1.0, crop_mode="center"),
    "siglip": dict(mean=_HALF[0], std=_HALF[1], interpolation="bicubic", crop_pct=1.0, crop_mode="squash"),
    "swin": dict(mean=_IMAGENET[0], std=_IMAGENET[1], interpolation="bicubic", crop_pct=1.0, crop_mode="squash"),
    "swinv2": dict(mean=_IMAGENET[0], std=_IMAGENET[1], interpolation="bicubic", crop_pct=1.0, crop_mode="squash"),
    "vit_mae": dict(mean=_IMAGENET[0], std=_IMAGENET[1], interpolation="bicubic", crop_pct=1.0, crop_mode="squash"),
}
_PIL_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}


def is_hf_model(module: nn.Module) -> bool:
    """Whether ``module`` is a Hugging Face ``transformers`` model (its class lives in ``transformers.*``).

    Parameters
    ----------
    module : torch.nn.Module
        A model object.

    Returns
    -------
    bool
        True for a transformers class.
    """
    return type(module).__module__.startswith("transformers.")


class _ClassAndMeanPatchHead(nn.Module):
    """DINOv2 classifiers: ``classifier(cat(x[:, 0], mean(patch tokens)))``."""

    def __init__(self, classifier: nn.Module, num_prefix_tokens: int) -> None:
        super().__init__()
        self.classifier, self.num_prefix_tokens = classifier, num_prefix_tokens

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B, classes)
        patches = tokens[:, self.num_prefix_tokens :].mean(dim=1)
        return self.classifier(torch.cat([tokens[:, 0], patches], dim=1))


def _model_type(model: Any) -> str:
    config = model.config
    model_type = str(getattr(config, "model_type", ""))
    if model_type in ("clip", "siglip"):  # the full image-text model: use its vision tower
        return model_type
    return model_type.removesuffix("_vision_model")


def _parts(model: Any) -> dict:
    """The pieces of any supported model: backbone, vision config, head and its kind."""
    model_type = _model_type(model)
    if model_type not in {t.removesuffix("_vision_model") for t in SUPPORTED_MODEL_TYPES}:
        raise UnsupportedModelError(
            f"A transformers {type(model).__name__} (model_type {model.config.model_type!r}) is not a supported "
            f"vision transformer. Supported model types: {', '.join(SUPPORTED_MODEL_TYPES)}."
        )
    name = type(model).__name__
    if model_type in ("clip", "siglip"):
        backbone = first_attribute(model, "vision_model") or model
        config = getattr(model.config, "vision_config", model.config)
        projection = first_attribute(model, "visual_projection")
        return dict(
            type=model_type,
            backbone=backbone,
            config=config,
            head=projection,
            head_kind="embedding" if projection is not None else "none",
        )
    backbone = first_attribute(model, "vit", "deit", "dinov2", "dinov2_with_registers") or model
    config = model.config
    if name.endswith("WithTeacher"):
        return dict(
            type=model_type,
            backbone=backbone,
            config=config,
            head=model.cls_classifier,
            head_dist=model.distillation_classifier,
            head_kind="classifier",
        )
    classifier = first_attribute(model, "classifier")
    if isinstance(classifier, nn.Identity):
        classifier = None
    return dict(
        type=model_type,
        backbone=backbone,
        config=config,
        head=classifier,
        head_kind="classifier" if classifier is not None else "none",
    )


def _layers(backbone: Any) -> list[Any]:
    layers = first_attribute(backbone, "encoder.layer", "encoder.layers", "layers", "layer")
    if layers is None:
        raise UnsupportedModelError(f"Could not find the transformer layers of {type(backbone).__name__}.")
    return list(layers)


def _attention_parts(layer: Any) -> tuple[nn.Module, nn.Module, nn.Module, nn.Module]:
    attention = first_attribute(layer, "attention", "self_attn")
    q = first_attribute(attention, "q_proj", "attention.query", "query")
    k = first_attribute(attention, "k_proj", "attention.key", "key")
    v = first_attribute(attention, "v_proj", "attention.value", "value")
    out = first_attribute(attention, "o_proj", "out_proj", "output.dense")
    if None in (q, k, v, out):
        raise UnsupportedModelError(f"Unrecognised attention layout in {type(layer).__name__}.")
    return q, k, v, out


def _position_table(embeddings: Any, prefix: int, grid: tuple[int, int], patch: int, native: tuple[int, int]):
    """``(1, prefix + N, D)`` positions the Hugging Face model adds at this input size: its own
    table at the native size (shared), else its own ``interpolate_pos_encoding`` result."""
    table = first_attribute(embeddings, "position_embeddings", "position_embedding.weight")
    if table.ndim == 2:  # nn.Embedding weight (prefix + N, D)
        table = nn.Parameter(table.data.unsqueeze(0), requires_grad=table.requires_grad)  # a view: shared storage
    if tuple(grid) == tuple(native):
        return table
    height, width = grid[0] * patch, grid[1] * patch
    zeros = torch.zeros(1, prefix + grid[0] * grid[1], table.shape[-1], dtype=table.dtype, device=table.device)
    with torch.no_grad():
        resized = embeddings.interpolate_pos_encoding(zeros, height, width)
    return nn.Parameter(resized.detach().clone(), requires_grad=False)


def to_timm(model: Any, img_size: tuple[int, int] | None = None) -> tuple[nn.Module, str]:
    """The timm model made of ``model``'s own modules, and its head kind."""
    parts = _parts(model)
    config, backbone, kind = parts["config"], parts["backbone"], parts["type"]
    embeddings = backbone.embeddings
    patch = int(config.patch_size)
    native_side = int(config.image_size)
    native = (native_side // patch, native_side // patch)
    size = img_size or (native_side, native_side)
    if size[0] % patch or size[1] % patch:
        raise ModelLoadError(f"img_size={size} is not a whole number of {patch}-pixel patches.")
    grid = (size[0] // patch, size[1] // patch)
    layers = _layers(backbone)
    registers = int(getattr(config, "num_register_tokens", 0) or 0) if kind == "dinov2_with_registers" else 0
    distilled = kind == "deit"
    teacher = "head_dist" in parts
    head = parts["head"]
    dinov2_classifier = kind.startswith("dinov2") and head is not None
    pooler = first_attribute(backbone, "pooler") if head is None and kind in ("vit", "deit") else None
    num_classes = int(head.out_features) if isinstance(head, nn.Linear) else 0
    options = dict(
        img_size=size,
        patch_size=patch,
        embed_dim=int(config.hidden_size),
        depth=len(layers),
        num_heads=int(config.num_attention_heads),
        qkv_bias=True,
        num_classes=num_classes,
        class_token=kind != "siglip",
        pre_norm=kind == "clip",
        reg_tokens=registers + (1 if distilled and not teacher else 0),
        no_embed_class=registers > 0,
        global_pool=""
        if dinov2_classifier or pooler is not None
        else (
            "map"
            if kind == "siglip" and first_attribute(backbone, "head") is not None
            else ("avg" if kind == "siglip" else "token")
        ),
    )
    model_class = VisionTransformerDistilled if teacher else VisionTransformer
    timm_model = skeleton(model_class, **options)
    timm_model.patch_embed.proj = first_attribute(embeddings, "patch_embeddings.projection", "patch_embedding")
    prefix_in_table = 0 if kind == "siglip" else (2 if distilled else 1)
    positions = _position_table(embeddings, prefix_in_table, grid, patch, native)
    if kind == "clip":
        timm_model.cls_token = nn.Parameter(embeddings.class_embedding.data.view(1, 1, -1))
    elif kind != "siglip":
        timm_model.cls_token = embeddings.cls_token
    if distilled:
        target = "dist_token" if teacher else "reg_token"
        setattr(timm_model, target, embeddings.distillation_token)
    if registers:  # registers get no position: the class position is folded into the class token
        timm_model.reg_token = embeddings.register_tokens
        timm_model.cls_token = nn.Parameter((embeddings.cls_token + positions[:, :1]).detach(), requires_grad=False)
        positions = nn.Parameter(positions.data[:, 1:])
    timm_model.pos_embed = positions
    timm_model.pos_drop = first_attribute(embeddings, "dropout") or nn.Identity()
    if kind == "clip":
        timm_model.norm_pre = backbone.pre_layrnorm
    for block, layer in zip(timm_model.blocks, layers, strict=True):
        q, k, v, out = _attention_parts(layer)
        block.norm1 = first_attribute(layer, "layernorm_before", "norm1", "layer_norm1")
        block.attn.qkv = ConcatLinear(q, k, v)
        block.attn.proj = out
        block.ls1 = first_attribute(layer, "layer_scale1") or nn.Identity()
        block.norm2 = first_attribute(layer, "layernorm_after", "norm2", "layer_norm2")
        mlp = first_attribute(layer, "mlp")
        block.mlp = mlp if mlp is not None else IntermediateOutput(layer.intermediate, layer.output)
        block.ls2 = first_attribute(layer, "layer_scale2") or nn.Identity()
    timm_model.norm = first_attribute(backbone, "layernorm", "post_layernorm")
    if kind == "siglip" and timm_model.attn_pool is not None:
        _fill_attention_pool(timm_model.attn_pool, backbone.head)
    if dinov2_classifier:
        timm_model.head = _ClassAndMeanPatchHead(head, 1 + registers)
    elif pooler is not None:  # ViTModel's pooler (dense + tanh on the class token): its pooler_output
        timm_model.head = pooler
    elif head is not None:
        timm_model.head = head
    else:
        timm_model.head = nn.Identity()
    if teacher:
        timm_model.head_dist = parts["head_dist"]
    timm_model.num_classes = int(getattr(head, "out_features", 0) or 0)
    return finish(timm_model, "transformers"), parts["head_kind"]


def _fill_attention_pool(pool: Any, head: Any) -> None:
    """timm's ``AttentionPoolLatent`` from SigLIP's pooling head (``nn.MultiheadAttention`` with a probe)."""
    attention = head.attention
    dim = attention.embed_dim
    weight, bias = attention.in_proj_weight, attention.in_proj_bias
    pool.latent = head.probe
    pool.q = shared_linear(nn.Parameter(weight.data[:dim]), nn.Parameter(bias.data[:dim]))  # views: shared storage
    pool.kv = shared_linear(nn.Parameter(weight.data[dim:]), nn.Parameter(bias.data[dim:]))
    pool.proj = attention.out_proj
    pool.norm = head.layernorm
    pool.mlp = head.mlp


def preprocessing_config(model_type: str, preprocessor: dict | None) -> tuple[dict, tuple[int, int] | None]:
    """timm-style data config and input size from a ``preprocessor_config.json`` (or the
    image processor's defaults for the model type).

    A ``crop_size`` (with ``do_center_crop``) gives a centre crop of ``crop_pct`` = crop side over
    ``shortest_edge``; a ``size`` of ``height`` and ``width`` a squash; a ``shortest_edge`` alone a
    square centre crop of that side.

    Parameters
    ----------
    model_type : str
        The transformers ``model_type`` (``"vit"``, ``"deit"``, ``"dinov2"``, ``"clip"``,
        ``"siglip"``, ``"swin"``, ``"swinv2"``, ``"vit_mae"``; a ``_with_registers`` suffix is dropped).
    preprocessor : dict or None
        The parsed ``preprocessor_config.json`` (``image_mean``, ``image_std``, ``resample``,
        ``size``, ``crop_size``, ``do_center_crop``); ``None`` or empty: the defaults only.

    Returns
    -------
    tuple of (dict, tuple of int or None)
        The data config (``mean``, ``std``, ``interpolation``, ``crop_pct``, ``crop_mode``) and the
        ``(H, W)`` input size, ``None`` for the model's own.

    Raises
    ------
    KeyError
        ``model_type`` has no defaults.
    """
    config = dict(_DEFAULT_PREPROCESSING[model_type.removesuffix("_with_registers")])
    if not preprocessor:
        return config, None
    if "image_mean" in preprocessor:
        config["mean"] = tuple(float(m) for m in preprocessor["image_mean"])
    if "image_std" in preprocessor:
        config["std"] = tuple(float(s) for s in preprocessor["image_std"])
    resample = preprocessor.get("resample")
    if isinstance(resample, int):
        config["interpolation"] = _PIL_RESAMPLE.get(resample, "bicubic")
    elif isinstance(resample, str):
        config["interpolation"] = resample.lower()
    size = preprocessor.get("size") or {}
    crop = preprocessor.get("crop_size") if preprocessor.get("do_center_crop", "crop_size" in preprocessor) else None
    if isinstance(crop, int):
        crop = {"height": crop, "width": crop}
    if isinstance(size, int):
        size = {"shortest_edge": size}
    if crop:
        target = (int(crop["height"]), int(crop["width"]))
        shortest = size.get("shortest_edge")
        config["crop_mode"] = "center"
        config["crop_pct"] = min(target) / float(shortest) if shortest else 1.0
        return config, target
    if "height" in size and "width" in size:
        config.update(crop_mode="squash", crop_pct=1.0)
        return config, (int(size["height"]), int(size["width"]))
    if "shortest_edge" in size:
        side = int(size["shortest_edge"])
        config.update(crop_mode="center", crop_pct=1.0)
        return config, (side, side)
    return config, None


def wrap_hf(
    model: nn.Module,
    name: str,
    device: torch.device | None,
    *,
    freeze: bool = True,
    preprocessor: dict | None = None,
    img_size=None,
    mean=None,
    std=None,
) -> LoadedViT:
    """Wrap a transformers model (its modules are shared with the timm model made of them).

    The model is converted once into the equivalent timm ViT or Swin (module docstring); class
    names come from the config's ``id2label`` when it names every class.

    Parameters
    ----------
    model : torch.nn.Module
        A supported transformers model (:data:`SUPPORTED_MODEL_TYPES`); put in eval mode.
    name : str
        The source it was loaded from.
    device : torch.device or None
        Where to put it; ``None`` leaves it where its parameters are.
    freeze : bool, default True
        Turn off ``requires_grad`` on every parameter; ``False`` leaves them as they are.
    preprocessor : dict or None, default None
        The parsed ``preprocessor_config.json`` (:func:`preprocessing_config`); ``None``: the
        image processor's defaults.
    img_size : int, tuple of int or None, default None
        Input size ``H`` or ``(H, W)``, overriding the preprocessor's.
    mean : sequence of float or None, default None
        Per-channel normalisation mean, overriding the preprocessor's.
    std : sequence of float or None, default None
        Per-channel normalisation std, overriding the preprocessor's.

    Returns
    -------
    LoadedViT
        With ``source_library="transformers"``.

    Raises
    ------
    UnsupportedModelError
        A model type or layout that is not supported (see also :func:`~.hf_swin.to_timm_swin`).
    ModelLoadError
        An input size that is not whole patches (a Swin: not the config's), or a model that cannot
        move to ``device``.
    """
    model.eval()
    swin = _model_type(model) in hf_swin.SWIN_MODEL_TYPES
    model_type = _model_type(model) if swin else _parts(model)["type"]
    data_config, target = preprocessing_config(model_type, preprocessor)
    if img_size is not None:
        target = (int(img_size), int(img_size)) if isinstance(img_size, int) else (int(img_size[0]), int(img_size[1]))
    if mean is not None:
        data_config["mean"] = tuple(float(m) for m in mean)
    if std is not None:
        data_config["std"] = tuple(float(s) for s in std)
    timm_model, head_kind = hf_swin.to_timm_swin(model, target) if swin else to_timm(model, target)
    label_names = None
    id2label = getattr(model.config, "id2label", None)
    if head_kind == "classifier" and id2label and len(id2label) == timm_model.num_classes:
        label_names = [str(id2label.get(i, id2label.get(str(i), i))) for i in range(timm_model.num_classes)]
    return wrap_model(
        timm_model,
        name,
        device,
        label_names,
        embedding_output=head_kind == "embedding",
        data_config=data_config,
        source_library="transformers",
        freeze=freeze,
    )


def load_hf_folder(folder: Path, config: dict, name: str, device: torch.device, **options) -> LoadedViT:
    """A ``save_pretrained`` folder (config.json with ``model_type``), loaded with the class its
    ``architectures`` names (else ``AutoModel``) and wrapped by :func:`wrap_hf` with the folder's
    ``preprocessor_config.json``.

    Parameters
    ----------
    folder : pathlib.Path
        The model folder.
    config : dict
        Its parsed ``config.json``.
    name : str
        The source it was loaded from.
    device : torch.device
        Where to put the model.
    **options : Any
        :func:`wrap_hf`'s keyword arguments (``freeze``, ``img_size``, ``mean``, ``std``).

    Returns
    -------
    LoadedViT
        With ``source_library="transformers"``.

    Raises
    ------
    ModelLoadError
        transformers is not installed, cannot load the folder, or cannot read its preprocessor config.
    UnsupportedModelError
        A masked autoencoder (``vit_mae``: use :func:`analysis.mae.load_mae`) or another model type
        that is not supported.
    """
    transformers = require_transformers()
    model_type = str(config.get("model_type"))
    if model_type == "vit_mae":
        raise UnsupportedModelError(
            f"{folder} holds a masked autoencoder (transformers vit_mae): open it with "
            f"analysis.mae.load_mae({str(folder)!r}) to reconstruct masked patches and see its encoder's attention."
        )
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(
            f"{folder} holds a transformers {model_type!r} model, not a supported vision transformer. "
            f"Supported model types: {', '.join(SUPPORTED_MODEL_TYPES)}."
        )
    architectures = config.get("architectures") or []
    model_class = getattr(transformers, architectures[0], None) if architectures else None
    if model_class is None:
        model_class = transformers.AutoModel
    check_hf_config_fits_weights(folder, model_class)
    try:
        model = from_folder(model_class, folder)
    except Exception as exc:  # noqa: BLE001 - corrupt or mismatched folders
        raise ModelLoadError(f"transformers could not load {folder}: {type(exc).__name__}: {str(exc)[:400]}") from exc
    return wrap_hf(model, name, device, preprocessor=read_preprocessor(folder), **options)


#: A model built from a hub config with random weights (no weights file to compare with) may hold at
#: most this many values (8 GiB in float32: more than a ViT-g); a larger config is refused unbuilt.
MAX_RANDOM_VALUES = 2**31


def _config_build(model_class: Any, folder: Path) -> Callable[[], Any]:
    """A function that builds ``model_class`` from the folder's config (no weights), for
    :func:`~analysis.model.loading.files.values_on_meta`."""
    transformers = require_transformers()

    def build():
        model_config = transformers.AutoConfig.from_pretrained(str(folder))
        if model_class is transformers.AutoModel:
            return model_class.from_config(model_config)
        return model_class._from_config(model_config)

    return build


def _values_on_meta(model_class: Any, folder: Path) -> int | None:
    """The values (parameters and buffers) of ``model_class`` built from the folder's config on
    PyTorch's ``meta`` device (shapes only, no memory); None when it cannot be built there."""
    from .files import values_on_meta

    return values_on_meta(_config_build(model_class, folder))


def check_hf_config_fits_weights(folder: Path, model_class: Any) -> None:
    """Refuse a Hugging Face folder whose ``config.json`` describes a larger model than its weights
    hold, before anything is allocated: ``model_class`` is built from the config on the ``meta``
    device and its values counted,

        values(model) = Σ numel(t)  over its parameters and buffers,

    against the values of the folder's ``*.safetensors`` files (their headers:
    :func:`~analysis.model.loading.files.weights_values`; a ``pytorch_model.bin`` counts its bytes / 2)
    plus :data:`~analysis.model.loading.files.CONFIG_SLACK_VALUES`. A ViT config of depth 400 or
    width 10⁶ beside a small model's weights is refused without building it (transformers would
    allocate it whole before the weights' shapes refuse it).

    Parameters
    ----------
    folder : pathlib.Path
        A ``save_pretrained`` folder (or a hub snapshot).
    model_class : type
        The transformers class the folder is loaded with.

    Raises
    ------
    CheckpointError
        The model holds more than the weights plus the slack, or a safetensors header is unreadable.
    """
    from .files import values_beyond_weights

    weights = sorted(folder.glob("*.safetensors")) or [p for p in (folder / "pytorch_model.bin",) if p.is_file()]
    if not weights:  # nothing to compare with: transformers' own load says what is missing
        return
    beyond = values_beyond_weights(_config_build(model_class, folder), weights)
    if beyond is not None:
        needed, held = beyond
        raise CheckpointError(
            f"{folder / 'config.json'} describes a model of {needed / 1e6:,.1f} M values, but its weights hold "
            f"{held / 1e6:,.1f} M: the config does not fit its weights (check num_hidden_layers, hidden_size, ...). "
            "Nothing was built."
        )


def read_preprocessor(folder: Path) -> dict | None:
    """The folder's ``preprocessor_config.json`` as a dict, or ``None`` when it has none.

    Parameters
    ----------
    folder : pathlib.Path
        The model folder.

    Returns
    -------
    dict or None
        The parsed JSON.

    Raises
    ------
    ModelLoadError
        The file exists but cannot be read or parsed.
    """
    path = folder / "preprocessor_config.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"Could not read {path}: {exc}") from exc


def hf_snapshot(repo_id: str, *, pretrained: bool = True) -> Path:
    """The local folder of ``"hf:org/name"`` (its json files, and its safetensors when
    ``pretrained``): from the local Hugging Face cache, else downloaded from the hub.

    Parameters
    ----------
    repo_id : str
        The hub repository, ``org/name``.
    pretrained : bool, default True
        Fetch the ``*.safetensors`` weights as well as the ``*.json`` files.

    Returns
    -------
    pathlib.Path
        The snapshot folder.

    Raises
    ------
    ModelLoadError
        transformers is not installed.
    WeightsUnavailableError
        Offline (``HF_HUB_OFFLINE``) with no cached ``config.json``, or the download fails (offline,
        missing repository, authentication).
    """
    require_transformers()
    from huggingface_hub import snapshot_download

    from .hub import hub_offline_env, in_hf_cache, offline_message

    if not in_hf_cache(repo_id, ("config.json",)) and hub_offline_env():
        raise WeightsUnavailableError(offline_message(f"hf:{repo_id}"))
    try:
        return Path(
            snapshot_download(
                repo_id,
                allow_patterns=["*.json", "*.safetensors"] if pretrained else ["*.json"],
                local_files_only=hub_offline_env(),
            )
        )
    except Exception as exc:  # noqa: BLE001 - offline, missing repo, auth
        raise WeightsUnavailableError(f"{offline_message(f'hf:{repo_id}')} ({type(exc).__name__}: {exc})") from exc


def load_hf(repo_id: str, device: torch.device, *, pretrained: bool = True, **options) -> LoadedViT:
    """``"hf:org/name"``: a transformers model from the local Hugging Face cache, else the hub.

    Parameters
    ----------
    repo_id : str
        The hub repository, ``org/name``.
    device : torch.device
        Where to put the model.
    pretrained : bool, default True
        Load its weights; ``False`` builds the class from its config with random weights.
    **options : Any
        :func:`wrap_hf`'s keyword arguments (``freeze``, ``img_size``, ``mean``, ``std``).

    Returns
    -------
    LoadedViT
        Named ``"hf:<repo_id>"``, with ``source_library="transformers"``.

    Raises
    ------
    WeightsUnavailableError
        The repository is neither cached nor downloadable.
    UnsupportedModelError
        A model type that is not supported, or a class (``architectures``) this transformers lacks.
    ModelLoadError
        transformers is not installed or cannot load the model.
    """
    from .files import read_folder_config

    folder = hf_snapshot(repo_id, pretrained=pretrained)
    config = read_folder_config(folder)
    if pretrained:
        return load_hf_folder(folder, config, f"hf:{repo_id}", device, **options)
    transformers = require_transformers()
    model_config = transformers.AutoConfig.from_pretrained(str(folder))
    architectures = config.get("architectures") or []
    model_class = getattr(transformers, architectures[0], None) if architectures else transformers.AutoModel
    if model_class is None:
        raise UnsupportedModelError(
            f"{repo_id}: this transformers has no {architectures[0]} class (config.json's architectures): upgrade transformers."
        )
    needed = _values_on_meta(model_class, folder)
    if needed is not None and needed > MAX_RANDOM_VALUES:
        raise CheckpointError(
            f"hf:{repo_id}'s config.json describes a model of {needed / 1e6:,.1f} M values, more than "
            f"{MAX_RANDOM_VALUES / 1e6:,.0f} M: refused before building it with random weights."
        )
    return wrap_hf(model_class._from_config(model_config), f"hf:{repo_id}", device, **options)
