"""The Compare layers page's "Reproduce in Python": the public ``analysis`` calls that recompute what it
shows, ending with its arrays under the names of its ``.npz`` download (:mod:`vizapp.python_snippet`)."""

from __future__ import annotations

from collections.abc import Sequence

from vizapp.python_snippet import Source, forward_lines, load_model_lines, script

__all__ = ["compare_code"]


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
    lines = [*forward_lines(source, imports=["import numpy as np"] if not windowed or second else [])]
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
    return script(lines)


def _second_model_code(second: Source, *, head: str | int, second_query) -> list[str]:
    """The Compare page's second model: its maps at the same relative depth and image position, then
    both models' rollout (the lines after :func:`compare_code`'s first model)."""
    (load,) = load_model_lines(second.model)
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
