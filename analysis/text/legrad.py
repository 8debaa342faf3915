"""LeGrad (Bousselham et al. 2024): the score's sensitivity to each layer's attention, read at that layer.

Every block ``l`` of the last ``layers`` writes a residual stream ``x^l``; read out as the model
reads its last one (its final norm, pooling and projection: ``u^l = readout(x^l)``) it gives a
score ``s^l = exp(t)·cos(u^l, v) + b``. LeGrad (eq. 4-6) differentiates each ``s^l`` with respect
to the attention ``A^l`` of the same block and keeps the positive part:

    E^l = mean_h mean_q ReLU(∂s^l/∂A^l[h, q, :])        (over every query row q)
    map  = minmax( Σ_l E^l [patches] )                   ∈ [0, 1] per image

Choices, as LeGrad's reference code (github.com/WalBouss/LeGrad, ``layer_index=-2``) unless said:
the last two blocks by default; each image's map min–max normalised to 0–1 (a constant map is all
zeros); for an attention-pooling model (SigLIP) the gradient is taken at the block's
self-attention, not at the pooling head's attention, and without that code's "empty prompt"
correction, so one rule serves every model. The intermediate readout (``readout=``):

* ``"class_token"`` (default): the model's own readout, ``u^l = head(norm(x^l))`` pooled as the
  model pools (the class token for CLIP, the pooling head for SigLIP);
* ``"mean_tokens"``: LeGrad's code for an open_clip CLIP, the mean over every token (class token
  included) through the final norm and the projection, ``u^l = head(norm(mean_t x^l_t))``
  (class-token models only). Its map on the patch grid is that code's before its bilinear upsampling.
"""

from __future__ import annotations

import torch

from ..base.arguments import check_int
from ..base.errors import AnalysisError
from ..engine.activations.run import run_with_hooks
from ..engine.capture import require_every_layer
from ..maps.scaling import scale_min_max
from ..model.geometry import input_spec
from ..model.windowed_support import refuse_windowed

__all__ = ["legrad_text", "LEGRAD_LAYERS", "LEGRAD_READOUTS"]

#: blocks read by default: the last two (LeGrad's ``layer_index=-2``).
LEGRAD_LAYERS = 2
#: the intermediate readouts (module docstring); the first is the default.
LEGRAD_READOUTS = ("class_token", "mean_tokens")


def legrad_text(
    clip, pixels: torch.Tensor, text, *, layers: int = LEGRAD_LAYERS, readout: str = LEGRAD_READOUTS[0]
) -> tuple[torch.Tensor, torch.Tensor, str]:
    """LeGrad's map of one prompt's score over each image; see the module docstring.

    Parameters
    ----------
    clip : LoadedCLIP
        A two-tower model (:func:`~analysis.load_clip`) with a global-attention image tower.
    pixels : torch.Tensor
        ``(B, 3, H, W)`` images preprocessed for the image tower.
    text : TextEncoding
        One prompt's encoding (:func:`~analysis.text.prompts.one_prompt`), ``embeddings`` ``(1, E)``.
    layers : int, default LEGRAD_LAYERS
        How many of the last blocks to read (1 to all; :data:`LEGRAD_LAYERS`, 2).
    readout : str, default "class_token"
        One of :data:`LEGRAD_READOUTS` (``"mean_tokens"`` reproduces LeGrad's open_clip code, class-token
        models only).

    Returns
    -------
    tuple of (torch.Tensor, torch.Tensor, str)
        ``(maps, scores, readout)``: ``(B, gh, gw)`` float32 maps in 0–1 (min–max per image) and ``(B,)``
        float32 scores on the CPU, and what the map's values are.

    Raises
    ------
    AnalysisError
        A windowed image tower, ``pixels`` that do not fit it, ``layers`` not an integer in
        ``1..L``, an unknown ``readout`` or ``"mean_tokens"`` on a tower that does not pool its class
        token, or a block whose attention or output the forward pass never reached.
    """
    vit = clip.image
    refuse_windowed(vit, "LeGrad")
    spec = input_spec(vit, pixels)
    layers = check_int("layers", layers, minimum=1)
    if layers > spec.num_layers:
        raise AnalysisError(f"layers={layers}, but the image tower has {spec.num_layers} blocks.")
    model = vit.model
    if readout not in LEGRAD_READOUTS:
        raise AnalysisError(f"readout={readout!r} is not a LeGrad readout; use one of {', '.join(LEGRAD_READOUTS)}.")
    mean_tokens = readout == "mean_tokens"
    if mean_tokens and (
        getattr(model, "attn_pool", None) is not None or getattr(model, "global_pool", None) != "token"
    ):
        raise AnalysisError(
            "readout='mean_tokens' is LeGrad's readout of a class-token CLIP (the mean token through the final "
            "norm and projection); this image tower pools otherwise: use readout='class_token'."
        )
    read = list(range(spec.num_layers - layers, spec.num_layers))
    pixels = pixels.detach().to(vit.device, dtype=torch.float32).clone().requires_grad_(True)
    streams: dict[int, torch.Tensor] = {}  # x^l, in the graph
    kept: dict[int, torch.Tensor] = {}  # A^l (B, heads, T, T), in the graph

    def keep_in(store: dict[int, torch.Tensor], layer: int):
        def hook(value: torch.Tensor) -> None:
            store[layer] = value

        return hook

    hooks = {}
    for layer in read:
        hooks[f"blocks.{layer}.attn.probs"] = keep_in(kept, layer)
        hooks[f"blocks.{layer}.resid_post"] = keep_in(streams, layer)
    total = torch.zeros(pixels.shape[0], spec.num_tokens, dtype=torch.float64)
    with torch.enable_grad():
        output = run_with_hooks(vit, pixels, hooks, precision="float32", differentiable=True)
        require_every_layer(read, kept)
        require_every_layer(read, streams, "block output")
        for layer in read:
            stream = streams[layer].mean(1, keepdim=True) if mean_tokens else streams[layer]  # (B, T or 1, D)
            layer_score = clip.logits(model.forward_head(model.norm(stream)), text.embeddings).sum()
            (gradient,) = torch.autograd.grad(layer_score, [kept[layer]], retain_graph=True, allow_unused=True)
            if gradient is not None:  # (B, heads, T, T): mean over heads and query rows
                total += gradient.detach().clamp(min=0).mean((1, 2)).double().cpu()
    patches = spec.split_prefix(total, 1)[1].reshape(total.shape[0], *spec.grid_size)
    scores = clip.logits(output.detach(), text.embeddings)[:, 0].cpu()
    return (
        scale_min_max(patches).float(),
        scores,
        f"min-max of the positive gradients of each of the last {layers} blocks' own score "
        f"({'its mean token' if mean_tokens else 'read as the model reads its last block'}), mean over heads and queries",
    )
