"""The Masked autoencoder page's "Reproduce in Python": the public ``analysis`` calls that recompute what it
shows, ending with its arrays under the names of its ``.npz`` download (:mod:`vizapp.python_snippet`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from vizapp.python_snippet import Source, image_path_line, sample_path, script
from vizapp.refs import ImageRef, ModelRef

__all__ = ["mae_code"]


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
        image_path_line(Source(ModelRef(model), image.name, sample_path(image))),
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
    return script(lines)
