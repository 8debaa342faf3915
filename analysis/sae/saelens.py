"""SAELens's on-disk format: ``cfg.json`` + ``sae_weights.safetensors`` in one folder.

Read from SAELens 6's source (``sae_lens/saes/sae.py``: ``SAE.save_model``/``load_from_disk``,
``SAEConfig.to_dict``; ``topk_sae.py``/``standard_sae.py``; ``loading/pretrained_sae_loaders.py``):

* the weights file holds ``W_enc (d_in, d_sae)``, ``W_dec (d_sae, d_in)``, ``b_enc (d_sae,)`` and
  ``b_dec (d_in,)``;
* ``cfg.json`` holds ``d_in``, ``d_sae``, ``dtype``, ``device``, ``apply_b_dec_to_input``,
  ``normalize_activations``, ``reshape_activations``, ``architecture`` (``"topk"`` with ``k`` and
  ``rescale_acts_by_decoder_norm``, or ``"standard"``, SAELens's name for a ReLU SAE) and
  ``metadata`` (``sae_lens_version``, ``model_name``, ``hook_name``, ...). SAELens ignores keys it
  does not know; ours (the token choice, the L1 coefficient) sit in ``metadata``.

Folders written before SAELens 6 keep ``hook_name`` (or ``hook_point``) and ``model_name`` at the
top level and mark TopK as ``activation_fn: "topk"`` with ``activation_fn_kwargs: {"k": ...}``;
:func:`load_sae` reads those too. What this library cannot apply (a ``normalize_activations``
other than ``"none"``, ``apply_b_dec_to_input: false``, decoder-norm rescaling, other
architectures) is refused with :class:`~analysis.sae.SAEFolderError`.

**An SAE with input normalisation** (``config.norm_scaling_factor = s``, :mod:`analysis.sae.model`)
is written as SAELens's trainer writes its own at the end of a normalised run
(``SAE.fold_activation_norm_scaling_factor``): the scale folded into the weights,

    W_enc·s,   W_dec / s,   b_enc,   b_dec / s,      normalize_activations: "none"

so SAELens's ``load_from_disk`` encodes raw model activations to the same features and decodes to
the model's units (SAELens's ``"expected_average_only_in"`` keeps no factor in ``cfg.json`` and
would read raw activations as if scaled: it is never written). ``metadata.norm_scaling_factor``
records ``s``, and :func:`load_sae` unfolds it (``W_enc / s``, ``W_dec·s``, ``b_dec·s``) into the
normalised SAE: the same features, with weights equal to the saved SAE's up to one rounding of
each product (a float32 ulp), not bit for bit. An SAE without normalisation is written and read
exactly as before, bit for bit.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from .errors import SAEFolderError
from .model import SAEConfig, SparseAutoencoder

__all__ = ["save_sae", "load_sae", "CONFIG_FILE", "WEIGHTS_FILE"]

CONFIG_FILE = "cfg.json"
WEIGHTS_FILE = "sae_weights.safetensors"
#: the SAELens version whose format is written (its loader reads ≥ 6 configs as they are).
SAELENS_FORMAT_VERSION = "6.0.0"
_TENSORS = ("W_enc", "W_dec", "b_enc", "b_dec")


def save_sae(sae: SparseAutoencoder, folder: str | os.PathLike) -> Path:
    """Write ``sae`` to ``folder`` in SAELens's format (module docstring): ``cfg.json`` and
    ``sae_weights.safetensors`` (the weights copied to the CPU), replacing those files if present.
    An SAE with input normalisation is written with its scale folded into the weights, so that
    SAELens reads raw model activations (module docstring).

    Parameters
    ----------
    sae : SparseAutoencoder
        The SAE; its config's token choice, L1 coefficient and ``norm_scaling_factor`` (when set) go
        into ``metadata``.
    folder : str or os.PathLike
        The folder, created with its parents if missing.

    Returns
    -------
    pathlib.Path
        The folder.
    """
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    config = sae.config
    tensors = {name: getattr(sae, name).detach().cpu().contiguous() for name in _TENSORS}
    scale = config.norm_scaling_factor
    if scale is not None:  # folded in, as SAELens's fold_activation_norm_scaling_factor (module docstring)
        tensors["W_enc"] = (tensors["W_enc"] * float(scale)).contiguous()  # (d_in, d_sae)
        tensors["W_dec"] = (tensors["W_dec"] / float(scale)).contiguous()  # (d_sae, d_in)
        tensors["b_dec"] = (tensors["b_dec"] / float(scale)).contiguous()  # (d_in,)
    save_file(tensors, str(path / WEIGHTS_FILE))
    metadata = {
        "sae_lens_version": SAELENS_FORMAT_VERSION,
        "sae_lens_training_version": SAELENS_FORMAT_VERSION,
        "model_name": config.model_name,
        "hook_name": config.hook_name,
        "hook_head_index": None,
        "prepend_bos": False,
        "tokens": config.tokens,
        "l1_coefficient": config.l1_coefficient,
    }
    if scale is not None:
        metadata["norm_scaling_factor"] = float(scale)
    cfg = {
        "d_in": config.d_in,
        "d_sae": config.d_sae,
        "dtype": config.dtype,
        "device": "cpu",
        "apply_b_dec_to_input": True,
        "normalize_activations": "none",
        "reshape_activations": "none",
        "architecture": "topk" if config.architecture == "topk" else "standard",
        "metadata": metadata,
    }
    if config.architecture == "topk":
        cfg["k"] = config.k
        cfg["rescale_acts_by_decoder_norm"] = False
    (path / CONFIG_FILE).write_text(json.dumps(cfg, indent=2))
    return path


def _architecture_and_k(cfg: dict, folder: Path) -> tuple[str, int | None]:
    architecture = cfg.get("architecture")
    if architecture is None:  # before SAELens 6
        kwargs = cfg.get("activation_fn_kwargs") or {}
        if cfg.get("activation_fn", cfg.get("activation_fn_str")) == "topk" and kwargs.get("k") is not None:
            return "topk", int(kwargs["k"])
        return "relu", None
    if architecture == "topk":
        return "topk", int(cfg["k"])
    if architecture == "standard":
        return "relu", None
    raise SAEFolderError(
        f"{folder} holds a {architecture!r} SAE; this library reads 'topk' and 'standard' (ReLU) SAEs. "
        "Convert it with SAELens or train a TopK/ReLU SAE."
    )


def _check_weight_shapes(weights: Path, d_in: int, d_sae: int) -> None:
    """Refuse a ``cfg.json`` whose sizes are not those of its weights file before anything is
    allocated: the shapes come from the safetensors header (no tensor is read),

        W_enc (d_in, d_sae),  W_dec (d_sae, d_in),  b_enc (d_sae,),  b_dec (d_in,)."""
    expected = {"W_enc": (d_in, d_sae), "W_dec": (d_sae, d_in), "b_enc": (d_sae,), "b_dec": (d_in,)}
    try:
        with safe_open(str(weights), framework="pt") as handle:
            names = set(handle.keys())
            shapes = {name: tuple(handle.get_slice(name).get_shape()) for name in expected if name in names}
    except Exception as exc:  # noqa: BLE001 - safetensors' own error for a file that is not one
        raise SAEFolderError(f"{weights} is not a readable safetensors file ({type(exc).__name__}: {exc}).") from exc
    missing = [name for name in expected if name not in shapes]
    if missing:
        raise SAEFolderError(f"{weights} lacks {', '.join(missing)}: it is not an SAE's weights file.")
    for name, shape in expected.items():
        if shapes[name] != shape:
            raise SAEFolderError(
                f"{name} in {weights.parent} has shape {shapes[name]}, cfg.json says {shape} (d_in={d_in}, "
                f"d_sae={d_sae}). Nothing was built."
            )


def load_sae(folder: str | os.PathLike) -> SparseAutoencoder:
    """The SAE in ``folder`` (written by :func:`save_sae` or by SAELens, TopK or standard/ReLU).

    Parameters
    ----------
    folder : str or os.PathLike
        A folder holding ``cfg.json`` and ``sae_weights.safetensors``. A folder whose ``metadata``
        names no token choice (one SAELens wrote) reads ``tokens="all"``; one whose ``metadata``
        holds ``norm_scaling_factor`` (written by :func:`save_sae` for a normalised SAE) is unfolded
        into that normalised SAE (module docstring).

    Returns
    -------
    SparseAutoencoder
        On the CPU, in eval mode, in the ``cfg.json``'s dtype.

    Raises
    ------
    SAEFolderError
        No ``cfg.json`` or weights file; a ``cfg.json`` without whole ``d_in`` / ``d_sae``; weights
        whose shapes disagree with it; or a configuration this library cannot apply (input
        normalisation, no ``b_dec`` subtraction, decoder-norm rescaling, another architecture).
    SAEConfigError
        A configuration :class:`SAEConfig` refuses (e.g. an unknown dtype).
    """
    path = Path(folder)
    if not (path / CONFIG_FILE).is_file():
        raise SAEFolderError(
            f"{path} has no {CONFIG_FILE}: give the folder that SAELens's save_model or analysis.sae.save_sae wrote "
            f"(it holds {CONFIG_FILE} and {WEIGHTS_FILE})."
        )
    if not (path / WEIGHTS_FILE).is_file():
        raise SAEFolderError(f"{path} has {CONFIG_FILE} but no {WEIGHTS_FILE}: copy the weights file next to it.")
    try:
        cfg = json.loads((path / CONFIG_FILE).read_text())
        d_in, d_sae = int(cfg["d_in"]), int(cfg["d_sae"])
    except (ValueError, KeyError, TypeError) as exc:  # not JSON, or no whole d_in / d_sae
        raise SAEFolderError(
            f"{path / CONFIG_FILE} is not an SAE configuration with whole numbers d_in and d_sae ({type(exc).__name__})."
        ) from exc
    _check_weight_shapes(path / WEIGHTS_FILE, d_in, d_sae)
    if cfg.get("normalize_activations", "none") not in ("none", None) or not cfg.get("apply_b_dec_to_input", True):
        raise SAEFolderError(
            f"{path}'s SAE normalises its input ({cfg.get('normalize_activations')!r}) or does not subtract b_dec "
            "before encoding, and its cfg.json does not hold the scale; this library applies neither. Fold the "
            "normalisation into the weights first (SAELens: sae.fold_activation_norm_scaling_factor(factor))."
        )
    if cfg.get("rescale_acts_by_decoder_norm"):
        raise SAEFolderError(f"{path}'s TopK SAE rescales by decoder norms; fold them into W_enc with SAELens first.")
    architecture, k = _architecture_and_k(cfg, path)
    metadata = cfg.get("metadata") or {}
    dtype = str(cfg.get("dtype", "float32")).removeprefix("torch.")
    config = SAEConfig(
        d_in=d_in,
        d_sae=d_sae,
        architecture=architecture,
        k=k,
        l1_coefficient=metadata.get("l1_coefficient", cfg.get("l1_coefficient")),
        hook_name=str(metadata.get("hook_name") or cfg.get("hook_name") or cfg.get("hook_point") or ""),
        tokens=str(metadata.get("tokens") or "all"),
        model_name=str(metadata.get("model_name") or cfg.get("model_name") or ""),
        dtype=dtype,
        norm_scaling_factor=None
        if metadata.get("norm_scaling_factor") is None
        else float(metadata["norm_scaling_factor"]),
    )
    weights = load_file(str(path / WEIGHTS_FILE))
    missing = [name for name in _TENSORS if name not in weights]
    if missing:
        raise SAEFolderError(f"{path / WEIGHTS_FILE} lacks {', '.join(missing)}: it is not an SAE's weights file.")
    sae = SparseAutoencoder(config)
    with torch.no_grad():
        for name in _TENSORS:
            target = getattr(sae, name)
            if tuple(weights[name].shape) != tuple(target.shape):
                raise SAEFolderError(
                    f"{name} in {path} has shape {tuple(weights[name].shape)}, cfg.json says {tuple(target.shape)}."
                )
            target.copy_(weights[name].to(target.dtype))
        scale = config.norm_scaling_factor
        if scale is not None:  # unfold what save_sae folded in (module docstring)
            sae.W_enc.div_(float(scale))
            sae.W_dec.mul_(float(scale))
            sae.b_dec.mul_(float(scale))
    sae.eval()
    return sae
