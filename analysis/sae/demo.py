"""The bundled demo SAE: a TopK SAE on the demo ViT's ``blocks.2.resid_post`` patch tokens, in
SAELens's format under ``assets/demo_sae`` (trained by ``python -m training.train_demo_sae``; its
card, ``assets/demo_sae/README.md``, gives the command and its held-out metrics).

The demo scenes' streams it uses are its own: it trains on stream :data:`SAE_TRAIN_SEED` and is
measured on stream :data:`SAE_HELD_OUT_SEED`; the demo ViT never saw either (it trained on seeds
0–4)."""

from __future__ import annotations

from ..base.assets import asset_path
from ..base.progress import Progress
from .errors import SAEFolderError
from .metrics import SAEMetrics, sae_metrics
from .model import SparseAutoencoder
from .saelens import CONFIG_FILE, load_sae

__all__ = [
    "DEMO_SAE_NAME",
    "DEMO_SAE_POINT",
    "SAE_TRAIN_SEED",
    "SAE_HELD_OUT_SEED",
    "HELD_OUT_SCENES",
    "demo_sae_path",
    "load_demo_sae",
    "held_out_metrics",
]

DEMO_SAE_NAME = "demo_sae"
#: the hook point the demo SAE reads (the demo ViT has 4 blocks).
DEMO_SAE_POINT = "blocks.2.resid_post"
#: the demo-scene stream the demo SAE trains on.
SAE_TRAIN_SEED = 7070
#: the held-out demo-scene stream its card's metrics are measured on.
SAE_HELD_OUT_SEED = 7071
#: how many held-out scenes its card's metrics are measured on (scenes 0..HELD_OUT_SCENES − 1).
HELD_OUT_SCENES = 256


def demo_sae_path():
    """The bundled demo SAE's folder (``assets/demo_sae``, or the wheel's copy).

    Returns
    -------
    pathlib.Path
        The folder; whether it exists is not checked (:func:`load_demo_sae` does).
    """
    return asset_path(DEMO_SAE_NAME)


def load_demo_sae() -> SparseAutoencoder:
    """The bundled demo SAE, for ``load_vit("demo")`` (module docstring).

    Returns
    -------
    SparseAutoencoder
        The TopK SAE on the demo ViT's :data:`DEMO_SAE_POINT` patch tokens.

    Raises
    ------
    SAEFolderError
        The bundled folder is missing (rebuild it with ``python -m training.train_demo_sae``).
    """
    folder = demo_sae_path()
    if not (folder / CONFIG_FILE).is_file():
        raise SAEFolderError(
            f"The bundled demo SAE is missing ({folder}): reinstall the package, or rebuild it with "
            "python -m training.train_demo_sae."
        )
    return load_sae(folder)


def held_out_metrics(
    vit, sae: SparseAutoencoder, count: int = HELD_OUT_SCENES, progress: Progress | None = None
) -> SAEMetrics:
    """:func:`~analysis.sae.sae_metrics` of ``sae`` on the demo scenes ``0..count − 1`` of stream
    :data:`SAE_HELD_OUT_SEED`, with their true classes (so the accuracy drop is measured): the
    numbers of the demo SAE's card.

    Parameters
    ----------
    vit : LoadedViT
        The demo ViT (``load_vit("demo")``); the scenes are drawn at its ``spec.img_size``.
    sae : SparseAutoencoder
        The SAE to measure (e.g. :func:`load_demo_sae`).
    count : int, default HELD_OUT_SCENES
        How many held-out scenes (256 for the card).
    progress : Progress or None, default None
        Called as ``progress(done, total)`` after each batch.

    Returns
    -------
    SAEMetrics
        With ``accuracy_clean`` and ``accuracy_spliced``.

    Raises
    ------
    NoImagesError
        ``count`` is 0.
    UnknownPointError
        The SAE's hook point is not a ``(B, T, D)`` point of ``vit``.
    SAEWidthError
        The SAE's ``d_in`` is not the model's width.
    """
    from ..demo.data import generate_samples

    images, labels, _ = generate_samples(int(count), SAE_HELD_OUT_SEED, size=vit.spec.img_size[0])
    return sae_metrics(vit, sae, images, labels=labels, progress=progress)
