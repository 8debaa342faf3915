"""The Tokens page's "Reproduce in Python": the public ``analysis`` calls that recompute what it
shows, ending with its arrays under the names of its ``.npz`` download (:mod:`vizapp.python_snippet`)."""

from __future__ import annotations

from vizapp.python_snippet import Source, forward_lines, sample_path, script
from vizapp.refs import ImageRef

__all__ = ["tokens_code"]


def other_image_path_line(other: ImageRef) -> str:
    """The line naming the second image of the Tokens page's correspondence (``OTHER``)."""
    path = sample_path(other)
    if path is not None:
        return f"OTHER = {str(path)!r}  # a bundled sample"
    return f"OTHER = {other.name!r}  # the image you uploaded: fill in its path on your machine"


def tokens_code(
    source: Source,
    *,
    kind: str,
    layer: int,
    foreground: bool,
    query: str | int,
    other: ImageRef | None = None,
    windowed: bool | None = None,
) -> str:
    """The Tokens page: the feature PCA (``rgb``, ``fitted``), the cosine ``similarity`` to the
    query (and ``other_image_similarity`` into ``other``), the token ``norms``, ``thresholds``
    and ``outlier_mask``, ``prefix_tokens`` (attention mass) and the logit lens
    (``probabilities``), as the page's downloads name them. ``windowed`` (Swin, SAM; ``None``:
    ``source.windowed``; ``query`` then a cell of the layer's stage grid or ``"mean"``): block
    outputs per layer on its grid."""
    if source.windowed if windowed is None else windowed:
        return _windowed_tokens_code(source, layer=layer, foreground=foreground, query=query, other=other)
    lines = [
        *forward_lines(source),
        "",
        f"features = analysis.capture_tokens(vit, pixels, kind={kind!r})  # TokenRecord: .tokens (L, 1, T, D)",
        f"tokens = features.layer_tokens({int(layer)})  # (1, T, D): the {kind} features of layer {int(layer)}",
        f"rgb, fitted = analysis.feature_pca(tokens, vit.spec, foreground={bool(foreground)!r})",
        "rgb, fitted = rgb[0].numpy(), fitted[0].numpy()  # (gh, gw, 3) in 0..1, (gh, gw) bool",
        f"similarity = analysis.patch_similarity(tokens, vit.spec, {query!r}).numpy()  # (gh, gw)",
    ]
    if other is not None:
        lines += [
            other_image_path_line(other),
            f"other_features = analysis.capture_tokens(vit, vit.preprocess(analysis.load_image(OTHER)), kind={kind!r})",
            f"other_image_similarity = analysis.patch_similarity(tokens, vit.spec, {query!r}, "
            f"other=other_features.layer_tokens({int(layer)})).numpy()  # (gh, gw): into the other image",
        ]
    lines += [
        "",
        "outputs = features"
        if kind == "token"
        else "outputs = analysis.capture_tokens(vit, pixels, kind='token')  # TokenRecord of the block outputs",
        "norms = analysis.token_norms(outputs)  # (L, 1, T): block-output norms",
        "found = analysis.high_norm_tokens(norms, vit.spec.num_prefix_tokens)",
        "norms = norms[:, 0].numpy()  # (L, T)",
        "thresholds, outlier_mask = found.thresholds.numpy(), found.mask[:, 0].numpy()  # (L,), (L, patches)",
        "if vit.spec.num_prefix_tokens:",
        "    prefix_tokens = analysis.attention_mass(record, list(range(vit.spec.num_prefix_tokens)))[:, 0].numpy()"
        "  # (L, heads)",
        "if vit.spec.has_classifier:",
        "    probabilities = analysis.logit_lens(vit, pixels)[:, 0].softmax(-1).numpy()  # (L, classes)",
        "",
        '# the page\'s instant similarity view in a notebook (pip install "vit-explorer[notebook]")',
        "from analysis.views.widgets import token_similarity_view",
        f"view = token_similarity_view(record, tokens, vit.model_input_image(image), layer={int(layer)}, kind={kind!r}, "
        f"query={query!r})",
        "view  # a notebook cell shows the widget of its last line",
    ]
    return script(lines)


def _windowed_tokens_code(
    source: Source, *, layer: int, foreground: bool, query: str | int, other: ImageRef | None
) -> str:
    lines = [
        *forward_lines(source),
        "",
        "features = analysis.capture_tokens(vit, pixels, kind='token')  # WindowedTokens: one (1, gh·gw, C) per layer",
        f"tokens = features.layer_tokens({int(layer)})  # (1, gh·gw, C)",
        f"geometry = features.geometry({int(layer)})  # the layer's stage grid",
        f"rgb, fitted = analysis.feature_pca(tokens, geometry, foreground={bool(foreground)!r})",
        "rgb, fitted = rgb[0].numpy(), fitted[0].numpy()  # (gh, gw, 3) in 0..1, (gh, gw) bool",
        f"similarity = analysis.patch_similarity(tokens, geometry, {query!r}).numpy()  # (gh, gw)",
    ]
    if other is not None:
        lines += [
            other_image_path_line(other),
            "other_features = analysis.capture_tokens(vit, vit.preprocess(analysis.load_image(OTHER)), kind='token')",
            f"other_image_similarity = analysis.patch_similarity(tokens, geometry, {query!r}, "
            f"other=other_features.layer_tokens({int(layer)})).numpy()  # (gh, gw): into the other image",
        ]
    lines += [
        "",
        "from analysis.tokens import logit_lens_layers, stage_high_norm_tokens",
        "",
        "found = stage_high_norm_tokens(features)  # each layer on its own stage grid",
        f"norms = analysis.token_norms(features.layer_tokens({int(layer)}))[0].numpy()  # (gh·gw,)",
        f"thresholds, outlier_mask = found.thresholds.numpy(), found.mask[{int(layer)}][0].numpy()  # (L,), (gh·gw,)",
        "if vit.spec.has_classifier:  # rows: the last stage's layers, logit_lens_layers(vit)",
        "    layers = logit_lens_layers(vit)",
        "    probabilities = analysis.logit_lens(vit, pixels, layers=layers)[:, 0].softmax(-1).numpy()"
        "  # (L', classes)",
    ]
    return script(lines)
