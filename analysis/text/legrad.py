"""LeGrad (Bousselham et al. 2024): the score's sensitivity to each layer's attention, read at that layer.

Every block ``l`` of the last ``layers`` writes a residual stream ``x^l``; read out as the model
reads its last one (its final norm, pooling and projection: ``u^l = readout(x^l)``) it gives a
score ``s^l = exp(t)·cos(u^l, v) + b``. LeGrad (eq. 4-6) differentiates each ``s^l`` with respect
to the attention ``A^l`` of the same block and keeps the positive part:

    E^l = mean_h mean_q ReLU(∂s^l/∂A^l[h, q, :])        (over every query row q)
    map  = minmax( Σ_l E^l [patches] )                   ∈ [0, 1] per image

Choices, as LeGrad's reference code (github.com/WalBouss/LeGrad, ``layer_index=-2``) unless said:
the last two blocks by default; each image's map min–max normalised to 0–1 (a constant map is all
zeros); the intermediate readout is the model's own (the class token for CLIP; that code averages
every token of an open_clip CLIP instead), and for an attention-pooling model (SigLIP) the
gradient is taken at the block's self-attention, not at the pooling head's attention, and
without that code's "empty prompt" correction, so one rule serves every model.
"""

from __future__ import annotations

import torch

from ..activations.run import run_with_hooks
from ..capture import input_spec, require_every_layer
from ..checks import check_int
from ..errors import AnalysisError
from ..map_scaling import scale_min_max
from ..windowed import refuse_windowed

__all__ = ["legrad_text", "LEGRAD_LAYERS"]

#: blocks read by default: the last two (LeGrad's ``layer_index=-2``).
LEGRAD_LAYERS = 2


def legrad_text(
    clip, pixels: torch.Tensor, text, *, layers: int = LEGRAD_LAYERS
) -> tuple[torch.Tensor, torch.Tensor, str]:
    """``(maps (B, gh, gw) in 0–1, scores (B,), readout)``; see the module docstring. ``layers``:
    how many of the last blocks to read (1 to all)."""
    vit = clip.image
    refuse_windowed(vit, "LeGrad")
    spec = input_spec(vit, pixels)
    layers = check_int("layers", layers, minimum=1)
    if layers > spec.num_layers:
        raise AnalysisError(f"layers={layers}, but the image tower has {spec.num_layers} blocks.")
    model = vit.model
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
            layer_score = clip.logits(model.forward_head(model.norm(streams[layer])), text.embeddings).sum()
            (gradient,) = torch.autograd.grad(layer_score, [kept[layer]], retain_graph=True, allow_unused=True)
            if gradient is not None:  # (B, heads, T, T): mean over heads and query rows
                total += gradient.detach().clamp(min=0).mean((1, 2)).double().cpu()
    patches = spec.split_prefix(total, 1)[1].reshape(total.shape[0], *spec.grid_size)
    scores = clip.logits(output.detach(), text.embeddings)[:, 0].cpu()
    return (
        scale_min_max(patches).float(),
        scores,
        f"min-max of the positive gradients of each of the last {layers} blocks' own score, mean over heads and queries",
    )
