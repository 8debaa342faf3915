"""``python -m analysis distance``: the dataset mean attention distance per layer and head
(the ViT paper's Figure 7 right, Appendix D.7), streamed, on one process or sharded across
``torchrun`` ranks. Writes ``OUT.npz`` and, next to it, ``OUT.png`` and ``OUT.html``.

Windowed models (Swin, SAM) too: each layer on its own stage grid, NaN beyond a layer's own
heads, with each layer's uniform-attention reference (``uniform_distance_by_layer``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..attention.streaming import dataset_attention_distance, distance_heads
from ..base.errors import AnalysisError
from .common import (
    add_command,
    add_image_set_arguments,
    add_model_arguments,
    images_used,
    open_image_set,
    progress_bar,
)
from .distributed import Ranks

__all__ = ["add_parser", "run", "shard_distance_sums"]


def add_parser(subparsers) -> None:
    """Add the ``distance`` subcommand: the model arguments, the image-set arguments (``--batch-size``
    default 32) and :func:`run` as its callback.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        What ``parser.add_subparsers()`` returned (:func:`analysis.cli.build_parser`).
    """
    parser = add_command(
        subparsers,
        "distance",
        help="dataset mean attention distance per layer and head (Figure 7 right)",
        description=__doc__.split("\n\n")[0],
    )
    add_model_arguments(parser)
    add_image_set_arguments(parser, out_help="result .npz (the .png and .html go next to it)", batch_size=32)
    parser.set_defaults(run=run)


def shard_distance_sums(
    vit, items, *, batch_size: int, workers: int | None, progress=None
) -> tuple[torch.Tensor, int, list]:
    """One shard's sum of per-image attention distances, for the ranks to add up.

    :func:`~analysis.attention.streaming.dataset_attention_distance` with ``per_image=True`` and
    ``on_error="skip"``; a shard that is empty, or whose every image was skipped, gives zeros.

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`~analysis.load_vit`).
    items : Sequence
        The shard's images: paths or encoded bytes (:attr:`~analysis.cli.sources.ImageSource.items`).
    batch_size : int
        Images per forward pass.
    workers : int or None
        Decode threads; ``None``: the default of :func:`~analysis.dataset_attention_distance`.
    progress : callable or None, default None
        ``progress(done, total)``, called after each batch.

    Returns
    -------
    tuple of (torch.Tensor, int, list of SkippedImage)
        ``(sums, count, skipped)``: ``(L, heads)`` float64 sum over the usable images of their
        distances in input pixels (``heads`` as :func:`~analysis.attention.streaming.distance_heads`,
        NaN beyond a windowed layer's own heads), how many images were used, and the images
        skipped (indices into ``items``).

    Raises
    ------
    AnalysisError
        As :func:`~analysis.dataset_attention_distance`, unless every image was skipped (then zeros).
    """
    spec = vit.spec
    skipped: list = []
    empty = torch.zeros(spec.num_layers, distance_heads(spec), dtype=torch.float64)
    if not len(items):
        return empty, 0, skipped
    try:
        per_image = dataset_attention_distance(
            vit,
            list(items),
            batch_size=batch_size,
            workers=workers,
            on_error="skip",
            skipped=skipped,
            per_image=True,
            progress=progress,
        )
    except AnalysisError:
        if len(skipped) != len(items):
            raise
        return empty, 0, skipped
    return per_image.sum(0), int(per_image.shape[0]), skipped


def run(args, ranks: Ranks) -> int:
    """Run ``distance``: every rank sums its shard's distances, the sums are reduced, and the main
    rank writes ``--out`` (.npz: ``distance`` ``(L, heads)`` in pixels, ``count``, the skipped images,
    the uniform-attention reference and the model's geometry) with ``OUT.png`` and ``OUT.html``
    next to it, and prints the mean distance by layer.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed arguments of :func:`add_parser`.
    ranks : Ranks
        This process's place in the run (:func:`analysis.cli.distributed.start`).

    Returns
    -------
    int
        The exit code, 0.

    Raises
    ------
    CommandError
        As :func:`~analysis.cli.common.open_image_set` (exit code 2 or 1); exit code 1 when no
        image could be used (:func:`~analysis.cli.common.images_used`).
    """
    source, vit, shard = open_image_set(args, ranks)
    with progress_bar(ranks, len(shard), "distance") as advance:
        sums, count, skipped = shard_distance_sums(
            vit, shard.items, batch_size=args.batch_size, workers=args.workers, progress=advance
        )
    total = ranks.sum(sums)  # (L, heads)
    outcome = images_used(ranks, shard, source, count, skipped)
    if outcome is None:  # not the main rank
        return 0
    used, left_out = outcome
    distance = (total / used).numpy()
    write_distance(
        args.out,
        distance,
        vit,
        model=args.model,
        images=source.description,
        count=used,
        skipped=left_out,
        world=ranks.world,
    )
    print(
        f"{used} images used, {len(left_out)} skipped; "
        f"mean distance by layer (px): {np.array2string(distance.mean(1), precision=1, max_line_width=200)}"
    )
    print(f"wrote {args.out}, {args.out.with_suffix('.png')} and {args.out.with_suffix('.html')}")
    return 0


def write_distance(
    out: Path, distance: np.ndarray, vit, *, model: str, images: str, count: int, skipped: list[str], world: int
) -> None:
    """``out`` (.npz: distance, count and metadata), and Figure 7 (right) as ``.png`` and ``.html``.

    ``uniform_distance_by_layer`` ``(L,)``: each layer's distance under uniform attention
    (:func:`~analysis.attention.distance.uniform_distance_reference`), and each layer's geometry:
    ``layer_grid_size``, ``layer_stride``, ``layer_window_size`` and ``layer_num_heads`` (the head
    axis is NaN beyond a layer's heads). A model whose layers all attend over the one patch grid (a
    ViT) also has the one value ``uniform_distance``; one whose layers attend inside their own
    windows (Swin, SAM) has none."""
    from ..attention.distance import uniform_distance_reference
    from .png_plot import distance_png

    spec = vit.spec
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    reference = uniform_distance_reference(spec)
    by_layer = reference.values.numpy()  # (L,)
    fields = dict(
        distance=distance,
        count=np.int64(count),
        skipped=np.int64(len(skipped)),
        skipped_images=np.array(skipped, dtype=str),
        model=np.array(model),
        images=np.array(images),
        unit=np.array("px"),
        uniform_distance_by_layer=by_layer,
        patch_size=np.array(spec.patch_size),
        grid_size=np.array(spec.grid_size),
        img_size=np.array(spec.img_size),
        num_prefix_tokens=np.int64(spec.num_prefix_tokens),
        world_size=np.int64(world),
    )
    geometry = spec.geometries()  # each layer's own
    fields.update(
        layer_grid_size=np.array([g.grid_size for g in geometry]),
        layer_stride=np.array([g.stride for g in geometry]),
        layer_window_size=np.array([g.window_size for g in geometry]),
        layer_num_heads=np.array([g.num_heads for g in geometry]),
    )
    uniform = None if reference.per_layer else reference.value
    if uniform is not None:
        fields.update(uniform_distance=np.float64(uniform))
    np.savez(out, **fields)
    title = f"{model} · mean over {count} images"
    distance_png(distance, out.with_suffix(".png"), uniform=uniform if uniform is not None else by_layer, title=title)
    from ..plots import attention_distance_scatter  # the app's own figure

    if uniform is not None:
        figure = attention_distance_scatter([(title, distance)], references=[("uniform attention", uniform)], unit="px")
    else:  # one reference per layer: drawn as its own series, one dot per layer
        figure = attention_distance_scatter(
            [(title, distance), ("uniform attention in each layer's windows", by_layer[:, None])], unit="px"
        )
    figure.write_html(out.with_suffix(".html"), include_plotlyjs=True, full_html=True)
