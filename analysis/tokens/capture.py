"""What the tokens carry: each block's output, and the queries, keys and values its attention
really uses; the logit lens (each block's output read by the model's own head).

Windowed models (Swin, SAM): each block's output on its stage grid, in the same
:class:`~analysis.tokens.record.TokenRecord`; the logit lens on the last stage's layers.

Both are views over the one activation engine (:func:`analysis.engine.activations.run_with_cache`):
its hooks live for one call and one thread and are always removed; the model is never modified.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..base.arguments import check_float_dtype, resolve_layers
from ..base.errors import AnalysisError
from ..engine.activations import run_with_cache
from ..model.geometry import ViTSpec, input_spec
from ..model.windowed_support import require_global_attention
from ..records.layer_tokens import layer_sequence
from .record import TokenRecord
from .stages import check_logit_lens_layer, final_readout, logit_lens_layers

__all__ = ["TOKEN_KINDS", "capture_tokens", "capture_limits", "logit_lens"]

#: ``token``: each block's output (the residual stream after the block); ``query``, ``key``,
#: ``value``: the tensors the block's fused attention call received, i.e. after q/k norm and,
#: for RoPE models, *after* the rotary embedding (what the softmax compares); heads concatenated.
TOKEN_KINDS = ("token", "query", "key", "value")


def _heads_concatenated(x: torch.Tensor) -> torch.Tensor:
    """``(B, heads, T, d)`` -> ``(B, T, heads·d)``."""
    batch, heads, tokens, dim = x.shape
    return x.permute(0, 2, 1, 3).reshape(batch, tokens, heads * dim)


def capture_limits(spec: ViTSpec) -> str:
    """What :func:`capture_tokens` cannot give for the model ``spec``, in one sentence for a reader.

    A windowed model (Swin, SAM) computes queries, keys and values window by window: only block
    outputs, each layer on its own stage grid.

    Parameters
    ----------
    spec : ViTSpec
        The model's spec (``vit.spec``).

    Returns
    -------
    str
        The sentence; ``""`` when every kind of :data:`TOKEN_KINDS` is defined on one token sequence
        (a ViT).
    """
    refused = [kind for kind in TOKEN_KINDS if _kind_refusal(spec, kind) is not None]
    if not refused:
        return ""
    named = [_PLURAL[kind] for kind in refused]
    listed = named[0] if len(named) == 1 else f"{', '.join(named[:-1])} and {named[-1]}"
    return (
        f"This {spec.family} computes {listed} window by window: only block outputs are defined, "
        "each layer on its own stage grid."
    )


_PLURAL = {"token": "block outputs", "query": "queries", "key": "keys", "value": "values"}


def _kind_refusal(spec: ViTSpec, kind: str) -> AnalysisError | None:
    """Why :func:`capture_tokens` refuses ``kind`` for this model (``None``: it does not): a
    query, key or value where the model's attention computes them window by window (the model
    layer's one rule, :func:`analysis.model.windowed_support.require_global_attention`)."""
    if kind == "token":
        return None
    try:
        require_global_attention(
            spec,
            lambda spec: AnalysisError(
                f"capture_tokens(kind={kind!r}): a windowed model ({spec.family}) computes its {kind}s window by "
                "window (shifted, padded windows of each stage grid), not one per grid cell; capture kind='token' "
                "(each block's output on its stage grid)."
            ),
        )
    except AnalysisError as refusal:
        return refusal
    return None


def capture_tokens(
    vit,
    pixels: torch.Tensor,
    *,
    kind: str = "token",
    layers: Sequence[int] | int | None = None,
    dtype: torch.dtype = torch.float32,
    precision: str = "auto",
) -> TokenRecord:
    """One kind of token of every requested layer, from one forward pass.

    A :class:`~analysis.tokens.record.TokenRecord` whose ``tokens`` are ``(L, B, T, D)`` on the
    CPU: ``kind`` for every requested layer, in the order asked (``record.layers`` says which),
    in token order (prefix tokens first, then patches row-major; ``record.prefix()`` /
    ``record.patches()`` split them). It is a view over
    :func:`analysis.engine.activations.run_with_cache` (``resid_post``, ``attn.q``/``.k``/``.v``),
    for every family. For ``query``/``key``/``value``, ``D = heads · head_dim``
    (``kv_heads · head_dim`` for grouped-query keys and values).

    A windowed model (Swin, SAM) gives the same record: each block's ``(B, gh, gw, C)`` output
    (the cache's ``resid_post``) as ``(B, gh·gw, C)`` on its own stage grid (``record.geometry(l)``
    says which). Only ``kind="token"``: their q/k/v exist per window, not per cell of the grid.
    Layers of one grid and width are stacked, as a ViT's (SAM's, a Swin's layers of one stage);
    layers that differ (a Swin's stages: patch merging halves the grid and doubles the width) are
    kept one tensor each.

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`analysis.load_vit`).
    pixels : torch.Tensor
        ``(B, 3, H, W)`` preprocessed input (``vit.preprocess(image)``).
    kind : str, default "token"
        One of :data:`TOKEN_KINDS`: ``"token"`` (each block's output), ``"query"``, ``"key"`` or
        ``"value"`` (what the block's fused attention call received).
    layers : int, sequence of int or None, default None
        Model layer indices (negative ones count from the end), kept in the order asked, each
        once; ``None``: all, in increasing order.
    dtype : torch.dtype, default torch.float32
        Storage dtype of the tokens (a floating dtype).
    precision : str, default "auto"
        Autocast for the forward, as in :func:`analysis.capture_attention`: ``"auto"`` (bf16/fp16
        on cuda, fp32 on the CPU), ``"float32"``, ``"bfloat16"`` or ``"float16"``.

    Returns
    -------
    TokenRecord
        ``tokens`` ``(L, B, T, D)`` in ``dtype`` on the CPU; where the layers differ in grid or width
        (a Swin's stages), one ``(B, T_l, D_l)`` tensor per layer.

    Raises
    ------
    AnalysisError
        ``kind`` is not one of :data:`TOKEN_KINDS`, ``dtype`` is not a floating dtype, ``precision``
        is none of the four, a layer is outside the model, or ``kind`` is not ``"token"`` on a
        windowed model.
    """
    if kind not in TOKEN_KINDS:
        raise AnalysisError(f"kind must be one of {', '.join(TOKEN_KINDS)}, got {kind!r}.")
    check_float_dtype("dtype", dtype)
    spec = input_spec(vit, pixels)
    refusal = _kind_refusal(spec, kind)
    if refusal is not None:
        raise refusal
    layer_ids = resolve_layers(layers, spec.num_layers)
    names = [f"blocks.{layer}.{_POINT[kind]}" for layer in layer_ids]  # a view over the activation cache
    cache = run_with_cache(vit, pixels, names=names, dtype=dtype, precision=precision)
    values = [_layer_sequence(cache[name], spec, layer, kind) for name, layer in zip(names, layer_ids)]  # (B, T_l, D_l)
    if len({tuple(value.shape) for value in values}) == 1:  # one grid and width: (L, B, T, D)
        return TokenRecord(tokens=torch.stack(values), spec=spec, layers=layer_ids, kind=kind)
    return TokenRecord(tokens=tuple(values), spec=spec, layers=layer_ids, kind=kind)  # stage grids differ


_POINT = {
    "token": "resid_post",
    "query": "attn.q",
    "key": "attn.k",
    "value": "attn.v",
}  # analysis.engine.activations names


def _layer_sequence(output: torch.Tensor, spec: ViTSpec, layer: int, kind: str) -> torch.Tensor:
    """One layer's activation as ``(B, T, D)`` tokens, prefix first: a ``(B, heads, T, d)`` query,
    key or value with its heads side by side; a block's output as one sequence
    (:func:`analysis.records.layer_tokens.layer_sequence`, checked against the layer's geometry)."""
    if kind != "token":
        return _heads_concatenated(output)
    return layer_sequence(output, spec.geometry(layer), what=f"Block {layer}")


def logit_lens(
    vit, pixels: torch.Tensor, *, layers: Sequence[int] | int | None = None, precision: str = "auto"
) -> torch.Tensor:
    """The logit lens: block ``l``'s output read by the model's own final norm, pooling and head,

        logits[l] = head(pool(norm(h_l))) = model.forward_head(model.norm(h_l))

    for each of ``layers``. The last layer equals the logits: the model's forward is exactly that
    applied to the last block.

    ``norm`` and ``forward_head`` are the model's own readout after its last block
    (:func:`~analysis.tokens.stages.final_readout`: SAM's is its ``neck``, then ``forward_head``).
    The lens is defined for the layers whose output that readout takes: every layer of a ViT, the
    last stage's of a windowed model (Swin, SAM; its grid and width); ``layers=None`` gives those,
    and any other layer is refused with the reason.

    Parameters
    ----------
    vit : LoadedViT
        A classifier (:func:`analysis.load_vit`); a model without a class head is refused.
    pixels : torch.Tensor
        ``(B, 3, H, W)`` preprocessed input (``vit.preprocess(image)``).
    layers : int, sequence of int or None, default None
        Model layer indices (negative ones count from the end), in the order asked. ``None``:
        :func:`~analysis.tokens.stages.logit_lens_layers`, every layer of a ViT.
    precision : str, default "auto"
        Autocast for the forward, as in :func:`capture_tokens`.

    Returns
    -------
    torch.Tensor
        ``(L, B, classes)`` float32 logits on the CPU, one row per layer.

    Raises
    ------
    AnalysisError
        The model has no class head, a layer is outside the model, or (a windowed model) a layer
        is outside the last stage.
    """
    spec = input_spec(vit, pixels)
    if not spec.has_classifier:
        raise AnalysisError(
            "The logit lens reads each layer through the class head, and this model has none "
            f"({spec.head} head): load a classifier."
        )
    if layers is None:
        layer_ids = logit_lens_layers(spec)
    else:
        layer_ids = tuple(check_logit_lens_layer(spec, layer) for layer in resolve_layers(layers, spec.num_layers))
    names = [f"blocks.{layer}.resid_post" for layer in layer_ids]  # each block's output in its own layout
    cache = run_with_cache(vit, pixels, names=names, precision=precision)  # (B, T, D); NHWC (B, gh, gw, C)
    readout = final_readout(vit.model)
    out = []
    with torch.no_grad():
        for name in names:
            out.append(readout(cache[name].to(vit.device)).float().cpu())
    return torch.stack(out)
