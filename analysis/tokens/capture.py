"""What the tokens carry: each block's output, and the queries, keys and values its attention
really uses; the logit lens (each block's output read by the model's own head).

Same discipline as :func:`analysis.capture_attention`: hooks for one call, reacting only to
the calling thread, removed in ``finally``; the model is never modified.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch
import torch.nn as nn

from ..adapters.base import AttentionInputs
from ..adapters.registry import block_sites
from ..capture import _resolve_layers, input_spec, require_every_layer
from ..checks import check_float_dtype
from ..devices import autocast_context
from ..errors import AnalysisError
from ..windowed import refuse_windowed

__all__ = ["TOKEN_KINDS", "capture_tokens", "logit_lens"]

#: ``token``: each block's output (the residual stream after the block); ``query``, ``key``,
#: ``value``: the tensors the block's fused attention call received, i.e. after q/k norm and,
#: for RoPE models, *after* the rotary embedding (what the softmax compares); heads concatenated.
TOKEN_KINDS = ("token", "query", "key", "value")


def _heads_concatenated(x: torch.Tensor) -> torch.Tensor:
    """``(B, heads, T, d)`` -> ``(B, T, heads·d)``."""
    batch, heads, tokens, dim = x.shape
    return x.permute(0, 2, 1, 3).reshape(batch, tokens, heads * dim)


def capture_tokens(
    vit,
    pixels: torch.Tensor,
    *,
    kind: str = "token",
    layers: Sequence[int] | int | None = None,
    dtype: torch.dtype = torch.float32,
    precision: str = "auto",
) -> torch.Tensor:
    """``(L, B, T, D)`` on the CPU: ``kind`` (one of :data:`TOKEN_KINDS`) for every requested
    layer (``None``: all), in token order (prefix tokens first, then patches row-major).

    For ``query``/``key``/``value``, ``D = heads · head_dim`` (``kv_heads · head_dim`` for
    grouped-query keys and values). ``precision``: autocast for the forward, as in
    :func:`analysis.capture_attention` (``"auto"``: bf16/fp16 on cuda, fp32 on the CPU).
    """
    if kind not in TOKEN_KINDS:
        raise AnalysisError(f"kind must be one of {', '.join(TOKEN_KINDS)}, got {kind!r}.")
    check_float_dtype("dtype", dtype)
    refuse_windowed(vit, "capture_tokens")
    spec = input_spec(vit, pixels)
    layer_ids = _resolve_layers(layers, spec.num_layers)
    sites = {site.layer: site for site in block_sites(vit.model)}
    owner = threading.get_ident()
    kept: dict[int, torch.Tensor] = {}
    explicit: list[int] = []
    handles = []

    def keep(layer: int, value: torch.Tensor) -> None:
        kept[layer] = value.detach().to("cpu", dtype)

    def block_output(layer: int):
        def hook(module, args, output):
            if threading.get_ident() == owner:
                keep(layer, output[0] if isinstance(output, tuple) else output)
        return hook

    def attention_inputs(layer: int):
        def report(inputs: AttentionInputs) -> None:
            if inputs.q is None:  # the module ran its explicit path: no q/k/v were passed to us
                explicit.append(layer)
                return
            tensor = {"query": inputs.q, "key": inputs.k, "value": inputs.v}[kind]
            keep(layer, _heads_concatenated(tensor))
        return report

    try:
        for layer in layer_ids:
            if kind == "token":
                handles.append(vit.model.blocks[layer].register_forward_hook(block_output(layer)))
            else:
                site = sites[layer]
                handles.extend(site.adapter.tap(site.module, attention_inputs(layer), owner))
        with torch.no_grad(), autocast_context(vit.device, precision):
            vit.model(pixels.to(vit.device))
    finally:
        for handle in handles:
            handle.remove()
    if explicit:
        raise AnalysisError(
            f"Layers {sorted(set(explicit))} ran their explicit attention path (fused_attn=False), where "
            f"{kind}s are never passed out: capture kind='{kind}' needs the default fused attention."
        )
    require_every_layer(layer_ids, kept, what=f"{kind} output")
    return torch.stack([kept[layer] for layer in layer_ids])


def logit_lens(vit, pixels: torch.Tensor, *, precision: str = "auto") -> torch.Tensor:
    """``(L, B, classes)``: block ``l``'s output read by the model's own final norm, pooling and
    head, ``head(pool(norm(h_l)))`` (``model.forward_head(model.norm(h_l))``). The last layer
    equals the logits: the model's forward is exactly that applied to the last block."""
    refuse_windowed(vit, "logit_lens")
    spec = input_spec(vit, pixels)
    if not spec.has_classifier:
        raise AnalysisError(
            "The logit lens reads each layer through the class head, and this model has none "
            f"({spec.head} head): load a classifier."
        )
    tokens = capture_tokens(vit, pixels, kind="token", precision=precision)  # (L, B, T, D)
    model = vit.model
    norm = getattr(model, "norm", None) or nn.Identity()
    out = []
    with torch.no_grad():
        for hidden in tokens:
            out.append(model.forward_head(norm(hidden.to(vit.device))).float().cpu())
    return torch.stack(out)
