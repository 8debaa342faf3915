""" "Reproduce in Python": the few public ``analysis`` calls that recompute what a page shows.

One generator per page kind. Each takes the page's settings and returns the source of a
self-contained script that ends with the page's arrays under the names its ``.npz``
download uses (``attention``, ``rollout``, ``current_image``, ...), so a notebook gets the
same numbers as the screen::

    code = attention_code(Source.of(cur), layer=3, head=2, query=21)
    namespace = {}; exec(code, namespace); namespace["attention"]   # (gh, gw)

Only public ``analysis`` names are used (``analysis.__all__`` and ``LoadedViT`` methods).
A bundled sample is named by its real path; an uploaded image by its file name, with a
comment asking for its path (the server never sees the user's path).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from vizapp.inputs import SAMPLES_DIR
from vizapp.refs import ImageRef, ModelRef

__all__ = [
    "Source",
    "sample_path",
    "attention_code",
    "rollout_code",
    "distance_code",
    "compare_code",
    "tokens_code",
    "explain_code",
    "robustness_code",
    "position_code",
    "filters_code",
    "circuits_code",
    "mae_code",
    "features_code",
    "text_prompts_code",
    "show_code",
]


def sample_path(image: ImageRef) -> Path | None:
    """The bundled sample file ``image`` was read from, or None (an upload)."""
    path = SAMPLES_DIR / Path(image.name).name
    try:
        if path.is_file() and path.stat().st_size == len(image.data) and path.read_bytes() == image.data:
            return path
    except OSError:
        return None
    return None


@dataclass(frozen=True)
class Source:
    """What a script needs to rebuild the app's forward pass: the model, the image's path
    (None for an upload, then ``image_name`` is shown), whether the app keeps the
    attention in float16 (big models, ``resources.record_dtype``) and whether the model's layers
    attend inside windows of their own stage grids (``windowed``: Swin, SAM; the scripts read each
    layer on its grid), the default of every ``windowed`` argument below."""

    model: ModelRef
    image_name: str
    image_path: Path | None
    float16: bool = False
    windowed: bool = False

    @classmethod
    def of(cls, cur) -> Source:
        """From the app's ``state.Current``."""
        return cls.of_model(cur, cur.model, cur.spec)

    @classmethod
    def of_model(cls, cur, model: ModelRef, spec) -> Source:
        """``model`` (whose spec is ``spec``) on the app's image: a second model beside ``cur``'s."""
        import torch

        from vizapp.resources import record_dtype

        float16 = record_dtype(spec) == torch.float16
        return cls(model, cur.image.name, sample_path(cur.image), float16, not spec.attends_globally)


def _load_model(model: ModelRef) -> list[str]:
    args = [repr(model.source)]
    if not model.pretrained:
        args.append("pretrained=False")
    if model.arch:
        args.append(f"arch={model.arch!r}")
    if model.img_size:
        args.append(f"img_size={model.img_size}")
    lines = [f"vit = analysis.load_vit({', '.join(args)})"]
    if not model.pretrained:
        lines[0] += "  # random weights: each load draws new ones, so values differ from the app's"
    return lines


def _image_path(source: Source) -> str:
    if source.image_path is not None:
        return f"IMAGE = {str(source.image_path)!r}  # the bundled sample shown in the app"
    return f"IMAGE = {source.image_name!r}  # the image you uploaded: fill in its path on your machine"


def _other_image_path(other: ImageRef) -> str:
    """The line naming the second image of the Tokens page's correspondence (``OTHER``)."""
    path = sample_path(other)
    if path is not None:
        return f"OTHER = {str(path)!r}  # a bundled sample"
    return f"OTHER = {other.name!r}  # the image you uploaded: fill in its path on your machine"


def _forward(source: Source, *, imports: Sequence[str] = (), record: bool = True) -> list[str]:
    """Load the model and the image; with ``record``, run one forward pass capturing every
    layer's attention."""
    lines = [*imports, "import analysis"]
    if source.float16 and record:
        lines.append("import torch")
    lines += [
        "",
        *_load_model(source.model),
        _image_path(source),
        "image = analysis.load_image(IMAGE)",
        "pixels = vit.preprocess(image)  # (1, 3, H, W): resized and normalised as the model expects",
    ]
    if record:
        dtype = ", dtype=torch.float16" if source.float16 else ""
        note = "  # kept in float16, as the app does for big models" if source.float16 else ""
        lines.append(f"record = analysis.capture_attention(vit, pixels{dtype}){note}  # every layer's attention")
    return lines


def _script(lines: Sequence[str]) -> str:
    return "\n".join(lines) + "\n"


def attention_code(
    source: Source, *, layer: int, head: str | int, query: str | int | tuple[int, int], view: bool = True
) -> str:
    """The Attention page's map: ``attention`` ``(gh, gw)``, one head's (or the mean over
    heads) attention of ``query`` over the patches at ``layer``; with ``view``, the page's instant
    view as a notebook widget (:func:`analysis.views.widgets.attention_view`) on the same layer, head and query."""
    head_arg = "None" if head == "mean" else str(int(head))
    lines = [
        *_forward(source),
        "",
        f"# layer {layer}, {'mean over heads' if head == 'mean' else f'head {head}'}, query {query!r}",
        f"attention = analysis.attention_map(record, {int(layer)}, head={head_arg}, query={query!r})[0].numpy()"
        "  # (gh, gw)",
    ]
    if view:
        lines += [
            "",
            '# the page\'s instant view in a notebook (pip install "vit-explorer[notebook]"): hover, step heads and layers',
            "from analysis.views.widgets import attention_view",
            f"view = attention_view(record, vit.model_input_image(image), layer={int(layer)}, head={head!r}, "
            f"query={query!r})",
            "view  # a notebook cell shows the widget of its last line",
        ]
    return _script(lines)


def rollout_code(
    source: Source,
    *,
    fusion: str,
    discard_ratio: float,
    start_layer: int,
    query: str | int | tuple[int, int],
    stage: int | None = None,
    merge: str | None = None,
    windowed: bool = False,
) -> str:
    """The Rollout page: ``after_each_layer`` ``(L - start, gh, gw)``, ``rollout`` (the last of
    them, the map shown) and ``figure6`` (the input times the upsampled rollout). A windowed
    model (``windowed``: Swin, SAM; no instant view): ``query`` a pixel ``(y, x)`` or
    ``"mean"``; ``stage`` (its layers only, exact) or ``start_layer`` with ``merge``
    (``"mean_2x2"``: across patch merging, an approximation). A ViT's script ends with the
    page's instant view as a notebook widget."""
    span = f"stage={int(stage)}" if stage is not None else f"start_layer={int(start_layer)}"
    extra = f", merge={merge!r}" if merge is not None else ""
    return _script(
        [
            *_forward(source),
            "",
            "after_each_layer = analysis.attention_rollout_by_layer(",
            f"    record, head_fusion={fusion!r}, discard_ratio={float(discard_ratio)!r}, "
            f"{span}, query={query!r}{extra},",
            ")[:, 0].numpy()  # (steps, gh, gw): the rollout after each layer",
            "rollout = after_each_layer[-1]  # (gh, gw): through the last layer, the map shown",
            "figure6 = analysis.masked_image(vit.model_input_image(image), rollout, 'bilinear')  # (H, W, 3) uint8",
            *([] if windowed else _rollout_view_lines(fusion, discard_ratio, start_layer, query)),
        ]
    )


def _rollout_view_lines(fusion: str, discard_ratio: float, start_layer: int, query) -> list[str]:
    """The Rollout page's instant view as a notebook widget (:func:`analysis.views.widgets.rollout_view`; a ViT)."""
    return [
        "",
        '# the page\'s instant rollout view in a notebook (pip install "vit-explorer[notebook]")',
        "from analysis.views.widgets import rollout_view",
        f"view = rollout_view(record, vit.model_input_image(image), head_fusion={fusion!r}, "
        f"discard_ratio={float(discard_ratio)!r}, start_layer={int(start_layer)}, query={query!r})",
        "view  # a notebook cell shows the widget of its last line",
    ]


def distance_code(
    source: Source,
    *,
    unit: str,
    image_set: Sequence[Path] | None,
    image_set_names: Sequence[str] = (),
    windowed: bool = False,
) -> str:
    """The Attention distance page (first model): ``current_image`` ``(L, heads)``,
    ``uniform_reference`` and, over an image set, ``set_per_image`` ``(N, L, heads)`` and
    ``set_mean`` ``(L, heads)``, all in ``unit``. ``image_set``: the bundled samples' paths,
    or None for uploaded files (named by ``image_set_names``). ``windowed`` (Swin, SAM): the
    reference is one value per layer, ``(L,)``, and layers with fewer heads are NaN."""
    uniform = (
        "analysis.uniform_attention_distance_by_layer(vit.spec).numpy() * to_unit  # (L,): each layer's window"
        if windowed
        else "analysis.uniform_attention_distance(vit.spec) * to_unit"
    )
    lines = [
        *_forward(source),
        "",
        f"to_unit = 1.0 / analysis.distance_unit_length(vit.spec, {unit!r})  # pixels -> {unit}",
        "current_image = analysis.mean_attention_distance(record).numpy() * to_unit  # (L, heads)"
        + (", NaN beyond a layer's heads" if windowed else ""),
        f"uniform_reference = {uniform}",
    ]
    if image_set is not None:
        lines += ["", "IMAGE_SET = [  # the bundled samples", *(f"    {str(p)!r}," for p in image_set), "]"]
    elif image_set_names:
        lines += [
            "",
            "IMAGE_SET = [  # the images you uploaded: fill in their paths on your machine",
            *(f"    {name!r}," for name in image_set_names),
            "]",
        ]
    if image_set is not None or image_set_names:
        lines += [
            "set_per_image = analysis.dataset_attention_distance(",
            "    vit, IMAGE_SET, per_image=True, on_error='skip',",
            ").numpy() * to_unit  # (N, L, heads); undecodable images are skipped",
            "set_mean = set_per_image.mean(axis=0)  # (L, heads)"
            + (", NaN beyond a layer's heads" if windowed else ""),
        ]
    return _script(lines)


def compare_code(
    source: Source,
    *,
    layers: Sequence[int],
    head: str | int,
    query: str | int | tuple[int, int],
    windowed: bool | None = None,
    second: Source | None = None,
    second_query: str | int | tuple[int, int] | None = None,
) -> str:
    """The Compare layers page: ``attention`` ``(len(layers), gh, gw)``, one head (or the mean)
    and one query at each chosen layer. ``windowed`` (Swin, SAM; ``None``: ``source.windowed``;
    ``query`` then an input pixel ``(y, x)`` or ``"mean"``): ``attention`` is ``{layer: (gh_l, gw_l)}``,
    each on its own stage grid, the mean over heads where a layer has fewer heads than ``head``.

    ``second``: the page's second model on the same image, ``second_query`` the same image position
    as that model reads it (:func:`analysis.corresponding_query`, as every layer takes it): its maps
    at the same relative depth (:func:`analysis.corresponding_layer`), ``second_model_attention``
    (stacked, or ``{layer: map}`` for a windowed model), the mean over heads where a layer has fewer;
    then ``rollouts``, both models' rollout through every layer from layer 0 (Figure 6), each
    ``(gh, gw)``, where it is defined."""
    head_arg = "None" if head == "mean" else str(int(head))
    windowed = source.windowed if windowed is None else windowed
    lines = [*_forward(source, imports=["import numpy as np"] if not windowed or second else [])]
    lines += ["", f"LAYERS = {[int(x) for x in layers]!r}"]
    if second is not None:
        lines.append(f"QUERY = {query!r}")
        query_text = "QUERY"
    else:
        query_text = repr(query)
    if windowed:
        head_of = (
            "None" if head == "mean" else f"({head_arg} if {head_arg} < vit.spec.geometry(layer).num_heads else None)"
        )
        lines += [
            "attention = {  # a windowed model: each layer on its own stage grid, 0 outside the query's window",
            f"    layer: analysis.attention_map(record, layer, head={head_of}, query={query_text})[0].numpy()",
            "    for layer in LAYERS",
            "}",
        ]
    else:
        lines += [
            "attention = np.stack([",
            f"    analysis.attention_map(record, layer, head={head_arg}, query={query_text})[0].numpy()"
            " for layer in LAYERS",
            "])  # (len(LAYERS), gh, gw)",
        ]
    if second is not None:
        lines += _second_model_code(second, head=head, second_query=second_query)
    if not windowed:
        lines += [
            "",
            '# the page\'s instant view in a notebook (pip install "vit-explorer[notebook]"): hover one panel, see every layer',
            "from analysis.views.widgets import compare_layers_view",
            f"view = compare_layers_view(record, vit.model_input_image(image), LAYERS, head={head!r}, query={query_text})",
            "view  # a notebook cell shows the widget of its last line",
        ]
    return _script(lines)


def _second_model_code(second: Source, *, head: str | int, second_query) -> list[str]:
    """The Compare page's second model: its maps at the same relative depth and image position, then
    both models' rollout (the lines after :func:`compare_code`'s first model)."""
    (load,) = _load_model(second.model)
    head_of = (
        "None" if head == "mean" else f"({int(head)} if {int(head)} < vit2.spec.geometry(layer).num_heads else None)"
    )
    dtype = ", dtype=torch.float16" if second.float16 else ""
    lines = [
        "",
        "# the second model on the same image: the same relative depth, the same image position",
        load.replace("vit = ", "vit2 = ", 1),
        *(["import torch"] if second.float16 else []),
        f"record2 = analysis.capture_attention(vit2, vit2.preprocess(image){dtype})",
        "LAYERS2 = [analysis.corresponding_layer(layer, vit.spec.num_layers, vit2.spec.num_layers) for layer in LAYERS]",
        f"QUERY2 = {second_query!r}  # QUERY in the second model (analysis.corresponding_query)",
    ]
    each = f"analysis.attention_map(record2, layer, head={head_of}, query=QUERY2)[0].numpy()"
    if second.windowed:
        lines += ["second_model_attention = {layer: " + each + " for layer in LAYERS2}  # each on its stage grid"]
    else:
        lines += [f"second_model_attention = np.stack([{each} for layer in LAYERS2])  # (len(LAYERS2), gh, gw)"]
    lines += [
        "",
        "# both models' rollout (Figure 6): every layer, mean over heads, from layer 0, where it is defined",
        "rollouts = []",
        "for model_record, model_query in ((record, QUERY), (record2, QUERY2)):",
        "    try:",
        "        rollouts.append(analysis.attention_rollout(model_record, query=model_query)[0].numpy())  # (gh, gw)",
        "    except analysis.AnalysisError as error:  # e.g. a Swin's rollout across patch merging",
        "        print(error)",
    ]
    return lines


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
        *_forward(source),
        "",
        f"features = analysis.capture_tokens(vit, pixels, kind={kind!r})  # TokenRecord: .tokens (L, 1, T, D)",
        f"tokens = features.layer_tokens({int(layer)})  # (1, T, D): the {kind} features of layer {int(layer)}",
        f"rgb, fitted = analysis.feature_pca(tokens, vit.spec, foreground={bool(foreground)!r})",
        "rgb, fitted = rgb[0].numpy(), fitted[0].numpy()  # (gh, gw, 3) in 0..1, (gh, gw) bool",
        f"similarity = analysis.patch_similarity(tokens, vit.spec, {query!r}).numpy()  # (gh, gw)",
    ]
    if other is not None:
        lines += [
            _other_image_path(other),
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
    return _script(lines)


def _windowed_tokens_code(
    source: Source, *, layer: int, foreground: bool, query: str | int, other: ImageRef | None
) -> str:
    lines = [
        *_forward(source),
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
            _other_image_path(other),
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
    return _script(lines)


def explain_code(
    source: Source,
    *,
    methods: Sequence[str],
    targets: Sequence[int | None],
    class_specific: Sequence[str],
    options: dict[str, tuple] | None = None,
) -> str:
    """The "Why this class?" page: ``explanations``, a dict of ``(gh, gw)`` maps keyed like the
    page's download (``<method>_class<c>`` for class-specific methods, else ``<method>``)."""
    options = options or {}
    lines = [*_forward(source, record=False), "", "explanations = {}"]
    for target in targets:
        for method in methods:
            specific = target is not None and method in class_specific
            name = f"{method}_class{target}" if target is not None else method
            args = [f"method={method!r}"]
            if specific and target is not None:
                args.insert(0, f"target={int(target)}")
            args += [f"{k}={v!r}" for k, v in options.get(method, ())]
            lines.append(f"explanations[{name!r}] = analysis.explain(vit, pixels, {', '.join(args)})[0].numpy()")
    lines.append("# each (gh, gw); the page draws each map divided by its largest |value|, negatives as 0")
    return _script(lines)


def robustness_code(
    source: Source,
    *,
    perturbation: str,
    clean_level: float,
    level: float,
    selection: str,
    seed: int,
    windowed: bool = False,
) -> str:
    """The Robustness page's one-image probe of the ViT (the comparison CNN is left out):
    ``vit_clean_*`` and ``vit_perturbed_*`` rollouts ``(gh, gw)`` (NaN: a dropped token) and
    probabilities ``(classes,)``, and ``dropped_patches`` for drops."""
    lines = [
        *_forward(source, imports=["from analysis.robustness import probe"]),
        "",
        f"PERTURBATION, SELECTION, SEED = {perturbation!r}, {selection!r}, {int(seed)}",
    ]
    if selection != "random":
        lines.append(
            "saliency = analysis.attention_rollout(record, stage=0, query='mean')[0].numpy()"
            "  # the first stage's rollout (patch grid) ranks the patches"
            if windowed
            else "saliency = analysis.attention_rollout(record)[0].numpy()  # the clean rollout ranks the patches"
        )
    saliency = ", saliency=saliency" if selection != "random" else ""
    lines += [
        f"clean = probe(vit, pixels, PERTURBATION, {clean_level!r}, seed=SEED, selection=SELECTION{saliency})",
        f"perturbed = probe(vit, pixels, PERTURBATION, {float(level)!r}, seed=SEED, selection=SELECTION{saliency})",
        "vit_clean_rollout, vit_perturbed_rollout = clean.saliency.numpy(), perturbed.saliency.numpy()  # (gh, gw)"
        + ("; a windowed model: clean.saliency_name, on the last layer's grid" if windowed else ""),
        "vit_clean_probabilities = clean.logits[0].softmax(-1).numpy()  # (classes,)",
        "vit_perturbed_probabilities = perturbed.logits[0].softmax(-1).numpy()",
    ]
    if perturbation in ("token_drop", "pixel_drop"):
        lines.append("dropped_patches = perturbed.dropped.numpy()  # row-major patch indices")
    return _script(lines)


def position_code(model: ModelRef, *, kind: str, resampled_grid: tuple[int, int] | None) -> str:
    """The Position embeddings page: ``similarity`` ``(gh, gw, gh, gw)`` and, when resampled,
    ``resampled_similarity`` on ``resampled_grid``."""
    lines = [
        "import analysis",
        "",
        *_load_model(model),
        f"similarity = analysis.position_embedding_similarity(vit, kind={kind!r}).numpy()  # (gh, gw, gh, gw)",
    ]
    if resampled_grid is not None:
        h, w = (int(v) for v in resampled_grid)
        lines.append(
            f"resampled_similarity = analysis.position_embedding_similarity(vit, grid_size=({h}, {w}), "
            f"kind={kind!r}).numpy()  # ({h}, {w}, {h}, {w})"
        )
    return _script(lines)


def filters_code(model: ModelRef, *, mode: str, n: int) -> str:
    """The Patch-embedding filters page: ``components`` ``(n, C, ph, pw)`` and
    ``explained_variance_ratio`` ``(n,)`` (mode ``"pca"``), or the first ``n`` ``filters``."""
    lines = ["import analysis", "", *_load_model(model)]
    if mode == "pca":
        lines += [
            f"components, explained_variance_ratio = analysis.patch_embedding_components(vit, n_components={int(n)})",
            "components, explained_variance_ratio = components.numpy(), explained_variance_ratio.numpy()"
            "  # (n, C, ph, pw), (n,)",
        ]
    else:
        lines.append(f"filters = analysis.patch_embedding_filters(vit)[:{int(n)}].numpy()  # (n, C, ph, pw)")
    return _script(lines)


def circuits_code(
    source: Source,
    *,
    target: int,
    method: str,
    reference: Sequence[Path],
    corruption: str,
    level: float,
    corrupted_path: Path | None,
    point: str,
) -> str:
    """The Circuits page: ``heads`` ``(L, heads, T)`` (direct logit attribution per head and
    token), ``delta_logit`` ``(L, heads)`` (head ablation) and ``effect`` (activation patching,
    ``(L, T)`` or ``(L, heads)``). ``reference``: the mean-ablation images (all samples) or the
    resampled one; ``corrupted_path``: the other image of the "another image" corruption."""
    lines = [
        *_forward(
            source,
            imports=[
                "import torch",
                "from analysis.circuits import activation_patching, direct_logit_attribution, head_ablation",
                "from analysis.base.image_ops import gaussian_blur, gaussian_noise",
            ],
            record=False,
        ),
        f"TARGET = {int(target)}  # the class whose logit is measured",
        "",
        "dla = direct_logit_attribution(vit, pixels, target=TARGET)",
        "heads = dla.heads[0].numpy()  # (L, heads, T): each head's direct contribution, per token",
        "",
    ]
    if method == "zero":
        lines.append("reference = None")
    else:
        paths = ", ".join(repr(str(path)) for path in reference)
        lines.append(f"reference = torch.cat([vit.preprocess(analysis.load_image(p)) for p in [{paths}]])")
    lines += [
        f"ablation = head_ablation(vit, pixels, target=TARGET, method={method!r}, reference=reference)",
        "delta_logit = ablation.delta_logit[0].numpy()  # (L, heads): change of the target logit",
        "",
    ]
    if corruption == "noise":
        lines.append(f"corrupted = gaussian_noise(pixels, {float(level)!r}, seed=0)")
    elif corruption == "blur":
        lines.append(f"corrupted = gaussian_blur(pixels, {float(level)!r})")
    else:
        lines.append(f"corrupted = vit.preprocess(analysis.load_image({str(corrupted_path)!r}))")
    lines += [
        f"patching = activation_patching(vit, pixels, corrupted, point={point!r}, target=TARGET)",
        "effect = patching.effect.numpy()  # restored share of the clean answer per layer and token / head",
    ]
    return _script(lines)


def mae_code(
    model: str,
    image: ImageRef,
    *,
    ratio: float,
    seed: int,
    flipped: Sequence[int],
    layer: int,
    head: str | int,
    query: int | None,
    image_set: Sequence[Path] | None = None,
    set_ratios: Sequence[float] = (),
) -> str:
    """The Masked-autoencoder page: the Figure 2 pictures ``original``, ``masked``,
    ``reconstruction``, ``composite`` ``(H, W, 3)`` in image units, the ``mask`` and the
    ``drawn_mask`` ``(gh, gw)`` (True = hidden), the ``loss``, ``patch_loss_hidden`` ``(gh, gw)``
    and the visible-token ``attention`` ``(gh, gw)``, for MAE's seeded draw at ``ratio`` with the
    patches in ``flipped`` (the user's clicks) switched. With ``image_set`` (the bundled samples'
    paths), ``losses`` ``(n, len(set_ratios))``: each image's loss at each ratio, image ``i``
    masked from ``seed + i``. ``model``: what :func:`analysis.mae.load_mae` opens."""
    head_arg = "None" if head == "mean" else str(int(head))
    query_text = "the class token" if query is None else f"patch {int(query)}"
    lines = [
        "import numpy as np",
        "import analysis",
        "from analysis.mae import (",
        "    dataset_mae_loss, draw_mask, figure_2_images, flip_patches, hidden_patch_loss, load_mae, mae_reconstruct,",
        ")",
        "",
        f"mae = load_mae({model!r})  # a ViTMAEForPreTraining: encoder and decoder",
        _image_path(Source(ModelRef(model), image.name, sample_path(image))),
        "pixels = mae.preprocess(analysis.load_image(IMAGE))  # (1, 3, H, W): resized and normalised",
        "",
        f"RATIO, SEED = {float(ratio)!r}, {int(seed)}",
        f"FLIPPED = {[int(i) for i in flipped]!r}  # the patches your clicks switched (hidden <-> visible), row-major",
        "drawn = draw_mask(1, mae.spec.num_patches, RATIO, SEED)[0]  # (N,) True = hidden: MAE's own seeded draw",
        "hidden = flip_patches(drawn, FLIPPED)  # (N,): the mask the page reconstructs with",
        "result = mae_reconstruct(mae, pixels, mask=hidden.unsqueeze(0))",
        "",
        "pictures = figure_2_images(result, mae.preprocessing)  # each (H, W, 3) in image units (0..1), not clipped",
        "original, masked, reconstruction, composite = (pictures[name] for name in "
        "('original', 'masked', 'reconstruction', 'composite'))",
        "loss = float(result.loss)  # mean squared error over the hidden patches (NaN when none is hidden)",
        "patch_loss_hidden = hidden_patch_loss(result)  # (gh, gw), NaN on the visible patches",
        "mask = hidden.numpy().reshape(mae.spec.grid_size)  # (gh, gw) True = hidden",
        "drawn_mask = drawn.numpy().reshape(mae.spec.grid_size)",
        f"# layer {int(layer)}, {'mean over heads' if head == 'mean' else f'head {head}'}, query: {query_text}",
        f"attention = result.attention.key_grid({int(layer)}, {None if query is None else int(query)!r}, "
        f"head={head_arg}).numpy()  # (gh, gw), NaN on the hidden patches",
    ]
    if image_set is not None:
        lines += [
            "",
            "IMAGE_SET = [  # the bundled samples",
            *(f"    {str(p)!r}," for p in image_set),
            "]",
            f"SET_RATIOS = {tuple(float(r) for r in set_ratios)!r}",
            "losses = dataset_mae_loss(mae, IMAGE_SET, SET_RATIOS, seed=SEED).numpy()  # (n, ratios): image i "
            "masked from SEED + i",
        ]
    return _script(lines)


def text_prompts_code(
    clip_source: str,
    image: ImageRef,
    *,
    prompts: Sequence[str],
    mapped: Sequence[str],
    methods: Sequence[str],
    focus: str,
    layer: int,
    head: int,
    curve_method: str,
    steps: int = 16,
) -> str:
    """The Text prompts page, under its downloads' names: ``logits`` and ``probabilities`` ``(P,)``
    (zero-shot), ``maps`` ``(len(MAPPED), len(METHODS), gh, gw)`` and ``scaled`` (each by its peak,
    negatives 0), the decomposition of ``FOCUS``'s score (``heads`` ``(L, heads)``, ``head_map``,
    ``score``) and its deletion / insertion curves of ``curve_method``'s map."""
    path = sample_path(image)
    image_line = (
        f"IMAGE = {str(path)!r}  # the bundled sample shown in the app"
        if path is not None
        else f"IMAGE = {image.name!r}  # the image you uploaded: fill in its path on your machine"
    )
    return _script(
        [
            "import numpy as np",
            "import analysis",
            "from analysis.faithfulness import perturbation_curve",
            "from analysis.text import explain_text, score_value, text_decomposition, zero_shot",
            "",
            f"clip = analysis.load_clip({clip_source!r})",
            image_line,
            "pixels = clip.preprocess(analysis.load_image(IMAGE))  # (1, 3, H, W): the image tower's own preprocessing",
            "",
            f"PROMPTS = {list(prompts)!r}",
            "result = zero_shot(clip, pixels, PROMPTS)",
            "logits = result.logits[0].numpy()  # (P,) the model's score s = exp(t)·cos(u, v) + b of each prompt",
            "probabilities = result.probabilities[0].numpy()  # result.rule: softmax over the prompts (CLIP) or sigmoid (SigLIP)",
            "",
            f"MAPPED, METHODS = {list(mapped)!r}, {list(methods)!r}",
            "maps = np.stack([np.stack([explain_text(clip, pixels, p, method=m).maps[0].numpy() for m in METHODS])",
            "                 for p in MAPPED])  # (prompts, methods, gh, gw)",
            "scaled = analysis.scale_by_peak(maps, negative='zero')  # as drawn: each map / its max |value|, negatives 0",
            "",
            f"FOCUS = {focus!r}",
            "decomposition = text_decomposition(clip, pixels, FOCUS)",
            "heads = decomposition.heads()[0].numpy()  # (L, heads): each head's direct contribution to the score",
            f"head_map = decomposition.head_maps()[0, {int(layer)}, {int(head)}].numpy()  # (gh, gw): layer {int(layer)}, "
            f"head {int(head)}",
            "score = float(decomposition.score[0])  # = decomposition.total(): heads + decomposition.remainder()",
            "",
            f"saliency = explain_text(clip, pixels, FOCUS, method={curve_method!r}).maps[0]",
            "value = score_value(clip, clip.encode_text(FOCUS).embeddings)  # perturbed images -> their score s",
            f"fractions, deletion = perturbation_curve(clip.image, pixels, saliency, 0, mode='deletion', steps={int(steps)}, "
            "value=value)",
            f"_, insertion = perturbation_curve(clip.image, pixels, saliency, 0, mode='insertion', steps={int(steps)}, "
            "value=value)",
        ]
    )


def features_code(cur, sae_name: str, *, feature: int, factor: float, patch: int, mode: str = "scale") -> str:
    """The Features page: the patch features of the image, the feature index over the demo scenes,
    the feature's class effect and the intervention (the arrays of the page's downloads): the
    feature scaled by ``factor`` (``mode="scale"``) or set to it (``"clamp"``)."""
    source = Source.of(cur)
    load = "load_demo_sae()" if sae_name == "demo" else f"load_sae({sae_name!r})"
    lines = _forward(source, imports=["from PIL import Image"], record=False)
    lines += [
        "from analysis.demo.data import render_sample",
        "from analysis.sae import build_feature_index, feature_class_effect, intervene, load_demo_sae, load_sae, "
        "patch_feature_grid",
        "from analysis.sae.demo import SAE_HELD_OUT_SEED",
        "",
        f"sae = {load}",
        "grid = patch_feature_grid(vit, sae, pixels)[0]  # (gh, gw, d_sae): every patch's features",
        f"row, col = divmod({int(patch)}, grid.shape[1])",
        "print(grid[row, col].topk(8))  # the features firing most on the chosen patch",
        f"feature_map = grid[..., {int(feature)}].numpy()  # (gh, gw)",
        "size = vit.spec.img_size[0]",
        "scenes = [Image.fromarray(render_sample(SAE_HELD_OUT_SEED, i, size)[0]) for i in range(256)]",
        "index = build_feature_index(vit, sae, scenes)",
        f"top_scenes, top_peaks = index.top_images({int(feature)}, 8)",
        f"activations = index.activations({int(feature)}).numpy()  # its histogram's data",
        f"class_effect = feature_class_effect(vit, sae, {int(feature)}).numpy()  # (C,)",
        f"changed = intervene(vit, sae, pixels, {'scale' if mode == 'scale' else 'clamp'}={{{int(feature)}: {float(factor)!r}}})",
        "print(changed.clean_logits.softmax(-1), changed.steered_logits.softmax(-1))",
    ]
    return _script(lines)


def show_code(code: str) -> None:
    """An expander with the script (Streamlit's code block has a copy button)."""
    with st.expander("Reproduce in Python", icon=":material/code:"):
        st.caption(
            "The public `analysis` calls that recompute this view's data "
            "(the arrays carry the names of the page's .npz download)."
        )
        st.code(code, language="python")
