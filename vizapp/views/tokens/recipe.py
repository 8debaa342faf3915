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
    (``probabilities``), as the page's downloads name them. One script for every family: each
    layer is read on its own grid (``features.geometry(layer)``). ``windowed`` (Swin, SAM;
    ``None``: ``source.windowed``; ``query`` then a cell of the layer's stage grid or ``"mean"``)
    leaves out the instant similarity view, which draws one token grid."""
    windowed = source.windowed if windowed is None else windowed
    lines = [
        *forward_lines(source),
        "",
        f"features = analysis.capture_tokens(vit, pixels, kind={kind!r})  # TokenRecord: each layer (1, T_l, D_l)",
        f"tokens = features.layer_tokens({int(layer)})  # (1, T, D): the {kind} features of layer {int(layer)}",
        f"geometry = features.geometry({int(layer)})  # the layer's grid, after its prefix tokens",
        f"rgb, fitted = analysis.feature_pca(tokens, geometry, foreground={bool(foreground)!r})",
        "rgb, fitted = rgb[0].numpy(), fitted[0].numpy()  # (gh, gw, 3) in 0..1, (gh, gw) bool",
        f"similarity = analysis.patch_similarity(tokens, geometry, {query!r}).numpy()  # (gh, gw)",
    ]
    if other is not None:
        lines += [
            other_image_path_line(other),
            f"other_features = analysis.capture_tokens(vit, vit.preprocess(analysis.load_image(OTHER)), kind={kind!r})",
            f"other_image_similarity = analysis.patch_similarity(tokens, geometry, {query!r}, "
            f"other=other_features.layer_tokens({int(layer)})).numpy()  # (gh, gw): into the other image",
        ]
    lines += [
        "",
        "outputs = features"
        if kind == "token"
        else "outputs = analysis.capture_tokens(vit, pixels, kind='token')  # TokenRecord of the block outputs",
        "found = analysis.high_norm_tokens(outputs)  # each layer on its own grid, its prefix tokens left out",
        "thresholds = found.thresholds.numpy()  # (L,)",
        "norms = [analysis.token_norms(outputs.layer_tokens(l))[0].numpy() for l in outputs.layers]  # (T_l,) each",
        "outlier_mask = [mask[0].numpy() for mask in found.mask]  # (patches_l,) bool each",
        "if vit.spec.num_prefix_tokens:",
        "    prefix_tokens = analysis.attention_mass(record, list(range(vit.spec.num_prefix_tokens)))[:, 0].numpy()"
        "  # (L, heads)",
        "if vit.spec.has_classifier:  # the layers the model's own head reads: every layer of a ViT, the last stage's",
        "    from analysis.tokens import logit_lens_layers",
        "",
        "    layers = logit_lens_layers(vit)",
        "    probabilities = analysis.logit_lens(vit, pixels, layers=layers)[:, 0].softmax(-1).numpy()"
        "  # (layers, classes)",
    ]
    if not windowed:
        lines += [
            "",
            '# the page\'s instant similarity view in a notebook (pip install "vit-explorer[notebook]")',
            "from analysis.views.widgets import token_similarity_view",
            f"view = token_similarity_view(record, tokens, vit.model_input_image(image), layer={int(layer)}, "
            f"kind={kind!r}, query={query!r})",
            "view  # a notebook cell shows the widget of its last line",
        ]
    return script(lines)
