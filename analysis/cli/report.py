"""``python -m analysis report``: one self-contained HTML file with the ViT paper's Figure 7
panels (patch-embedding filter components, position-embedding similarity, attention distance
against depth), attention and rollout on a few images, and the model's spec. The figures are
the app's own (:mod:`analysis.plots`); plotly.js is embedded once, in the head before any
figure, so the file opens offline. Each example's attention comes first as the app's instant
view (:func:`analysis.views.attention_view.embed`, the same page inlined): hover a patch to see its
attention, ←/→ step the head and ↑/↓ the layer, with no server and no network."""

from __future__ import annotations

import html
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .. import plots
from ..base.assets import asset_path
from ..base.errors import AnalysisError, VitExplorerError
from .common import CommandError, add_command, add_model_arguments, add_out_argument, load_model, progress_bar, say
from .distance import shard_distance_sums
from .distributed import Ranks
from .sources import ImageSource, resolve_images

__all__ = ["add_parser", "run", "PANELS"]

SAMPLES = asset_path("samples")
#: panel id -> heading; each appears in the report (with a note when a model has none)
PANELS = {
    "spec": "Model",
    "filters": "Patch-embedding filters: principal components (Figure 7 left)",
    "position": "Position-embedding similarity (Figure 7 centre)",
    "distance": "Mean attention distance against depth (Figure 7 right)",
    "attention": "Attention of the last layer",
    "rollout": "Attention rollout (Figure 6)",
}


def add_parser(subparsers) -> None:
    """Add the ``report`` subcommand: the model arguments, ``--images`` (default the bundled sample
    images), ``--out`` (a folder), ``--examples`` (default 3), ``--batch-size`` (default 32),
    ``--colorscale`` (default Viridis), ``--view-mb`` (default 12) and :func:`run` as its callback.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        What ``parser.add_subparsers()`` returned (:func:`analysis.cli.build_parser`).
    """
    parser = add_command(
        subparsers,
        "report",
        help="a self-contained HTML report: Figure 7 panels, attention, rollout, the spec",
        description=__doc__.split("\n\n")[0],
    )
    add_model_arguments(parser)
    parser.add_argument(
        "--images", default=None, help="a folder, a .zip or a glob pattern (default: the bundled sample images)"
    )
    add_out_argument(parser, "output folder (report.html goes there)")
    parser.add_argument("--examples", type=int, default=3, help="images shown with attention and rollout (default 3)")
    parser.add_argument("--batch-size", type=int, default=32, help="images per forward pass for the distance")
    parser.add_argument("--colorscale", default="Viridis", help="colour scale of the maps (default Viridis)")
    parser.add_argument(
        "--view-mb",
        type=float,
        default=12,
        help="the instant view's data per example: every layer when they fit in this many MiB, "
        "else the last layer only (a windowed model's view holds its last layer), and no view when "
        "that does not fit either; 0 leaves the view out (default 12)",
    )
    parser.set_defaults(run=run)


def _spec_table(vit, model: str) -> str:
    spec = vit.spec
    rows = {
        "model": model,
        "family": spec.family,
        "input (H × W px)": f"{spec.img_size[0]} × {spec.img_size[1]}",
        "patch (h × w px)": f"{spec.patch_size[0]} × {spec.patch_size[1]}",
        "grid (rows × columns)": f"{spec.grid_size[0]} × {spec.grid_size[1]}",
        "layers × heads": f"{spec.num_layers} × {spec.num_heads}",
        "embedding width": spec.embed_dim,
        "prefix tokens": ", ".join(spec.token_names) or "none",
        "position encoding": spec.position_embedding,
        "head": f"{spec.head} ({spec.num_outputs} outputs)",
        "blocks": f"{spec.residual_norm}-norm",
    }
    cells = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows.items())
    return f"<table class='spec'>{cells}</table>"


class _Page:
    """Sections of HTML. Figures carry no plotly.js: :func:`_document` inlines it once in the
    head, so every figure finds ``Plotly`` defined whatever order the sections end up in."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def section(self, panel: str, body: str = "", note: str | None = None) -> None:
        text = f"<p class='note'>{html.escape(note)}</p>" if note else ""
        self.parts.append(f"<section id='{panel}'><h2>{html.escape(PANELS[panel])}</h2>{text}{body}</section>")

    def figure(self, figure) -> str:
        return figure.to_html(
            full_html=False,
            include_plotlyjs=False,
            config={"displaylogo": False, "toImageButtonOptions": {"format": "png", "scale": 2}},
        )


def _distance_panel(page: _Page, vit, source: ImageSource, ranks: Ranks, args) -> str | None:
    from ..attention.distance import uniform_attention_distance_by_layer

    shard = source.shard(ranks.rank, ranks.world)
    with progress_bar(ranks, len(shard), "distance") as advance:
        sums, count, skipped = shard_distance_sums(
            vit, shard.items, batch_size=args.batch_size, workers=None, progress=advance
        )
    total, used = ranks.sum(sums), int(ranks.sum(torch.tensor([count], dtype=torch.float64))[0])
    skipped_count = sum(len(s) for s in ranks.gather(skipped)) + len(source.problems)
    if not ranks.is_main:
        return None
    if used == 0:
        page.section("distance", note=f"None of the {len(source)} images could be read.")
        return None
    distance = (total / used).numpy()
    uniform = uniform_attention_distance_by_layer(vit.spec).numpy()  # (L,): each layer's grid or window
    one = bool(np.all(uniform == uniform[0]))  # a ViT: one grid, one reference line
    figure = plots.attention_distance_scatter(
        [(f"mean over {used} images", distance)],
        references=[("uniform attention", float(uniform[0]))] if one else (),
        layer_references=() if one else [("uniform attention in each layer's windows", uniform)],
        unit="px",
    )
    note = f"{used} images from {source.description}" + (
        f"; {skipped_count} unreadable, skipped" if skipped_count else ""
    )
    page.section("distance", page.figure(figure), note)
    return note


def run(args, ranks: Ranks) -> int:
    """Run ``report``: the attention distance over ``--images`` is sharded across the ranks; the main
    rank draws the other panels (:data:`PANELS`; a panel the model cannot give gets a note instead),
    attention and rollout on the first ``--examples`` readable images, and writes
    ``OUT/report.html``.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed arguments of :func:`add_parser`.
    ranks : Ranks
        This process's place in the run (:func:`analysis.cli.distributed.start`).

    Returns
    -------
    int
        The exit code, 0 (also when no image could be read: the distance panel then says so).

    Raises
    ------
    CommandError
        Exit code 2: ``--examples`` or ``--view-mb`` negative, or ``--images`` naming nothing
        usable; exit code 1: the model could not be loaded.
    """
    from .. import (
        attention_map,
        attention_rollout,
        capture_attention,
        capture_tokens,
        high_norm_tokens,
        load_image,
        masked_image,
        outlier_patches,
        patch_embedding_components,
        position_embedding_similarity,
    )
    from ..views.attention_view import attention_view_args, embed, layers_to_send, view_data, view_layer_bytes

    if args.examples < 0:
        raise CommandError("--examples must be 0 or more.", code=2)
    if args.view_mb < 0:
        raise CommandError("--view-mb must be 0 or more.", code=2)
    try:
        source = resolve_images(args.images if args.images is not None else str(SAMPLES))
    except VitExplorerError as exc:  # AnalysisError, ArchiveError
        raise CommandError(str(exc), code=2) from exc
    vit = load_model(args, ranks.device)
    spec = vit.spec
    page = _Page()
    say(ranks, f"{args.model}: report over {len(source)} images ({source.description})")
    distance_note = _distance_panel(page, vit, source, ranks, args)
    if not ranks.is_main:
        return 0
    distance_part = page.parts.pop()
    page.section("spec", _spec_table(vit, args.model))
    try:
        components, ratio = patch_embedding_components(vit, n_components=min(28, spec.embed_dim))
        page.section(
            "filters",
            page.figure(plots.filter_components_grid(components.numpy(), ratio.numpy()))
            + page.figure(plots.explained_variance(ratio.numpy())),
        )
    except AnalysisError as exc:
        page.section("filters", note=str(exc))
    try:
        similarity = position_embedding_similarity(vit).numpy()
        page.section("position", page.figure(plots.position_similarity_mosaic(similarity, colorscale=args.colorscale)))
    except AnalysisError as exc:
        page.section("position", note=str(exc))
    page.parts.append(distance_part)
    attention_parts: list[Any] = []
    rollout_parts: list[Any] = []
    problems: list[str] = []
    query = "cls" if spec.has_class_token else "mean"
    examples = 0
    refusals: dict[str, None] = {}  # why the model has no rollout, each reason once (in order)
    for name, item in zip(source.names, source.items):
        if examples >= args.examples:
            break
        try:
            image = load_image(item)
        except VitExplorerError as exc:  # ImageLoadError
            problems.append(f"{name}: {exc}")
            continue
        pixels = vit.preprocess(image)
        record = capture_attention(vit, pixels)
        outliers = (  # on the one patch grid every layer shares (spec.outlier_grid), as the app's maps
            outlier_patches(high_norm_tokens(capture_tokens(vit, pixels))) if spec.outlier_grid is not None else []
        )
        background = plots.image_data_uri(np.asarray(vit.model_input_image(image), dtype=np.uint8))
        last_layer = spec.num_layers - 1
        geometry = spec.geometry(last_layer)  # the last layer's grid (a Swin's last stage), its window's tokens
        last = attention_map(record, last_layer, head=None, query=query)[0].numpy()
        uniform = geometry.uniform_attention(mean_query=query == "mean")  # the colour floor, as the app's
        lo, hi, range_text = plots.colour_range("robust", last, uniform=uniform, left_out=outliers)
        label = Path(name).name
        view_layers = layers_to_send(spec, last_layer, int(args.view_mb * 2**20))
        if view_layers is None and args.view_mb > 0:
            attention_parts.append(
                f"<p class='note'>No instant view of {html.escape(label)}: the last layer's attention for every "
                f"query is {view_layer_bytes(spec, last_layer) / 2**20:.3g} MiB, over --view-mb {args.view_mb:g}.</p>"
            )
        if view_layers is not None:
            note = (
                ""
                if len(view_layers) == len(layers_to_send(spec, last_layer, sys.maxsize) or ())
                else (
                    f"Only the last layer is in this file (all {spec.num_layers} layers exceed --view-mb {args.view_mb:g})."
                )
            )
            attention_parts.append(
                embed(
                    attention_view_args(
                        data=view_data(record, view_layers),
                        image_uri=background,
                        spec=spec,
                        layer=last_layer,
                        head="mean",
                        query=query,
                        colorscale=args.colorscale,
                        map_range="robust",
                        opacity=0.6,
                        max_height=460,
                        note=note,
                        left_out=outliers,
                    ),
                    title=f"instant attention view of {label}",
                )
            )
        attention_parts.append(
            page.figure(
                plots.attention_overlay(
                    background,
                    spec.img_size,
                    last,
                    tuple(geometry.stride),
                    colorscale=args.colorscale,
                    zmin=lo,
                    zmax=hi,
                    title=f"{label} · layer {last_layer} · mean over heads · query: {'class token' if query == 'cls' else 'mean of the patches'}",
                    colorbar_title=f"attention probability ({range_text})",
                    height=460,
                )
            )
        )
        examples += 1
        try:
            rollout = attention_rollout(record)[0].numpy()
        except AnalysisError as exc:  # e.g. a Swin: no rollout across its stages without an approximation
            refusals[str(exc)] = None
            continue
        top = plots.robust_top(rollout, left_out=outliers)
        shown = masked_image(np.asarray(vit.model_input_image(image), dtype=np.uint8), rollout, "bilinear", top=top)
        rollout_parts.append(
            f"<figure><img alt='rollout of {html.escape(label)}' src='{plots.image_data_uri(shown)}'>"
            f"<figcaption>{html.escape(label)}: the input × its bilinearly upsampled rollout / its 99th percentile "
            f"{'without the outlier tokens ' if outliers else ''}({top:.3g}; brighter cells at full brightness)"
            "</figcaption></figure>"
        )
    if attention_parts:
        page.section("attention", "".join(attention_parts))
        reasons = "".join(f"<p class='note'>{html.escape(reason)}</p>" for reason in refusals)
        page.section(
            "rollout", reasons + ("<div class='row'>" + "".join(rollout_parts) + "</div>" if rollout_parts else "")
        )
    else:
        for panel in ("attention", "rollout"):
            page.section(panel, note="No example images (--examples 0, or none could be read).")
    for problem in problems:
        print(f"skipped {problem}", file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    target = args.out / "report.html"
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    target.write_text(
        _document(args.model, stamp, distance_note, page.parts, random_weights=random_weights(args.model)),
        encoding="utf-8",
    )
    print(f"wrote {target} ({target.stat().st_size / 1e6:.1f} MB)")
    return 0


def random_weights(model: str) -> bool:
    """Whether ``--model`` asked for random weights (the ``random:`` prefix of :func:`load_model`)."""
    return model.startswith("random:")


def random_weights_banner(model: str) -> str:
    """The app's warning for a model with random weights, as the report's first line."""
    name = model.removeprefix("random:")
    return (
        f"<p class='warning' role='alert'><strong>{html.escape(name)}</strong> has random weights: "
        "its maps mean nothing.</p>"
    )


def _document(
    model: str, stamp: str, distance_note: str | None, parts: list[str], *, random_weights: bool = False
) -> str:
    from plotly.offline import get_plotlyjs

    style = (
        "body{font-family:system-ui,sans-serif;color:#2a3f5f;max-width:1200px;margin:2em auto;padding:0 1em}"
        "h1{font-size:1.6em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #EBF0F8}"
        "table.spec th{text-align:left;padding:2px 1em 2px 0;font-weight:600}.note{color:#6e6e6e}"
        ".row{display:flex;gap:1em;flex-wrap:wrap}figure{margin:0}figure img{width:280px;image-rendering:pixelated}"
        ".warning{background:#fffce7;color:#926c05;border-radius:0.5em;padding:0.8em 1em}"
    )
    subtitle = html.escape(distance_note or "")
    banner = random_weights_banner(model) if random_weights else ""
    return (
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>ViT report: {html.escape(model)}</title>"
        f"<style>{style}</style><script type='text/javascript'>{get_plotlyjs()}</script></head><body>"
        f"<h1>ViT report: {html.escape(model)}</h1>{banner}"
        f"<p class='note'>python -m analysis report · {stamp} · {subtitle}</p>{''.join(parts)}</body></html>"
    )
