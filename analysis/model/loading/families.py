"""Which timm families this tool opens, and the precise reason for those it refuses."""

from __future__ import annotations

import difflib

import timm

from ...base.errors import ModelLoadError, UnsupportedModelError

__all__ = [
    "SUPPORTED_FAMILIES",
    "SUPPORTED_MODULES",
    "check_supported_architecture",
    "check_supported_module",
    "is_embedding_tower",
]

# timm modules whose models are ViTs with per-token self-attention over [prefix, patches], and
# (Swin v1/v2, SAM) windowed models whose attention is captured per window (the API's
# capture_attention and attention_map work; the other analyses and the app refuse them, saying so).
# Hiera, MViTv2 and MaxViT stay out: the windows of LayerGeometry are contiguous
# blocks of one grid whose queries and keys are the same cells, and theirs are not (see _REFUSALS).
SUPPORTED_MODULES = (
    "vision_transformer",
    "vision_transformer_hybrid",
    "deit",
    "eva",
    "beit",
    "vision_transformer_relpos",
    "naflexvit",
    "swin_transformer",
    "swin_transformer_v2",
    "swin_transformer_v2_cr",
    "vision_transformer_sam",
)
SUPPORTED_FAMILIES = (
    "timm ViTs: vit_*, deit_*/deit3_*, DINO/DINOv2 (incl. registers), DINOv3, EVA-02, PE, "
    "BEiT/BEiTv2, vit_relpos/vit_srelpos, RoPE ViTs, NaFlex, CLIP/SigLIP image towers, hybrid vit_*_r50_*; "
    "Hugging Face transformers ViT/DeiT/DINOv2/CLIP/SigLIP vision models; torchvision vit_*; "
    "windowed (capture, attention maps, distance and position only, so far): timm swin_*, swinv2_*, swinv2_cr_* "
    "and SAM's samvit_*, Hugging Face transformers Swin/Swinv2 classifiers, torchvision swin_t/s/b and swin_v2_t/s/b"
)

# timm module -> why its attention maps are not the per-token maps this tool shows.
_REFUSALS = {
    "hiera": "Hiera's hierarchical mask-unit attention pools its queries inside attention (a stage's queries lie "
    "on a coarser grid than its keys), so its windows are not the square query-by-key windows of one grid that "
    "Swin and SAM have",
    "maxxvit": "MaxViT / CoAtNet (timm maxxvit): convolutional (MBConv) stages and no patch embedding; MaxViT "
    "alternates block attention (local windows) with grid attention (dilated windows of cells spread across the "
    "whole image), which is not a window of contiguous cells",
    "cait": "class attention in separate layers: the patch blocks use talking-heads attention",
    "xcit": "cross-covariance attention over channels, not tokens: there is no token-by-token map",
    "pvt_v2": "spatial-reduction attention: keys are pooled, so maps are not over the patch grid",
    "twins": "locally-grouped windowed attention with sub-sampled global keys",
    "levit": "a convolution-attention hybrid with shrinking token grids",
    "mvitv2": "MViTv2's multiscale pooling attention: queries, keys and values are pooled by strided convolutions "
    "inside attention, so its keys are pooled features on a coarser grid, not the query's cells",
    "crossvit": "two-branch cross attention at two patch sizes",
    "efficientformer": "a hybrid whose attention runs only in the last stage on pooled tokens",
    "efficientformer_v2": "a hybrid whose attention runs only in the last stages on pooled tokens",
    "volo": "outlook (local) attention",
    "tnt": "nested inner/outer attention over pixels and patches",
    "pit": "pooling stages shrink the token grid",
    "nest": "nested local-block attention",
    "edgenext": "a convolutional network with channel (transposed) attention",
    "fastvit": "a convolutional network (attention only in the last stage on pooled tokens)",
}


_CNN_MODULES = (
    "resnet",
    "resnetv2",
    "efficientnet",
    "convnext",
    "regnet",
    "mobilenetv3",
    "mobilenetv4",
    "densenet",
    "vgg",
    "inception_v3",
    "inception_v4",
    "xception",
    "ghostnet",
    "rexnet",
    "nfnet",
    "dla",
    "dpn",
    "byobnet",
    "senet",
    "res2net",
    "resnest",
    "mobileone",
    "repvit",
    "hrnet",
    "cspnet",
    "tresnet",
    "vovnet",
    "convmixer",
)


def _refusal_reason(module: str) -> str:
    if module in _REFUSALS:
        return _REFUSALS[module]
    if module in _CNN_MODULES:
        return "a convolutional network, not a Vision Transformer: it has no attention at all"
    return "not a Vision Transformer of a supported kind: it has no per-token self-attention over image patches"


def _refusal(arch: str, module: str) -> UnsupportedModelError:
    return UnsupportedModelError(
        f"{arch!r} cannot be inspected: {_refusal_reason(module)}. Supported: {SUPPORTED_FAMILIES}. "
        "Try 'demo', 'vit_base_patch16_224.augreg2_in21k_ft_in1k' or 'deit_small_patch16_224'."
    )


def check_supported_module(model: object) -> None:
    """Refuse a timm model *object* of a family this tool cannot inspect, with the same reason
    as its name would get (other objects pass: their blocks are checked by the adapters).

    Parameters
    ----------
    model : object
        A model object; only those whose class lives in ``timm.models.*`` are checked.

    Raises
    ------
    UnsupportedModelError
        Its timm module is a known refused family (Hiera, MaxViT, CaiT, ...) or a convolutional network.
    """
    module = type(model).__module__
    if not module.startswith("timm.models."):
        return
    short = module.removeprefix("timm.models.").split(".")[0]
    if short not in SUPPORTED_MODULES and (short in _REFUSALS or short in _CNN_MODULES):
        raise _refusal(type(model).__name__, short)


def check_supported_architecture(architecture: str) -> None:
    """Raise a typed error for an unknown timm name, or one this tool cannot inspect (saying why).

    Parameters
    ----------
    architecture : str
        A timm model name, optionally with an ``hf-hub:`` prefix and a ``.tag`` (both ignored).

    Raises
    ------
    ModelLoadError
        timm does not know the name (up to five close names are suggested).
    UnsupportedModelError
        The model is not in :data:`SUPPORTED_MODULES`; the message says why its family is refused.
    """
    arch = architecture.removeprefix("hf-hub:").split(".")[0]
    if not timm.is_model(arch):
        close = difflib.get_close_matches(arch, timm.list_models(), n=5, cutoff=0.6)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise ModelLoadError(f"Unknown timm architecture {arch!r}.{hint}")
    if not timm.models.is_model_in_modules(arch, SUPPORTED_MODULES):
        module = next((m for m in timm.list_modules() if timm.models.is_model_in_modules(arch, [m])), "?")
        raise _refusal(arch, module)


_EMBEDDING_MARKERS = ("clip", "siglip", "_pe_core", "_pe_lang", "_pe_spatial")


def is_embedding_tower(name: str, num_classes: int) -> bool:
    """A CLIP/SigLIP/PE image tower whose head (if any) projects to an image-text embedding,
    not to classes: those names, unless their tag says they were fine-tuned on classes.

    Parameters
    ----------
    name : str
        The timm model name (``hf-hub:`` prefix and ``org/`` allowed), its ``.tag`` included.
    num_classes : int
        The model's output width; 0 (no head) is never an embedding tower.

    Returns
    -------
    bool
        True for a ``clip`` / ``siglip`` / ``_pe_core`` / ``_pe_lang`` / ``_pe_spatial`` name whose
        tag has no ``ft_in`` and whose width is not an ImageNet class count (1000, 11821, 21841, 21843).
    """
    arch, _, tag = name.removeprefix("hf-hub:").rpartition("/")[2].partition(".")
    if num_classes == 0 or not any(marker in arch for marker in _EMBEDDING_MARKERS):
        return False
    return "ft_in" not in tag and num_classes not in (1000, 11821, 21841, 21843)
