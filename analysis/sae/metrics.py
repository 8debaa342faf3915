"""How good an SAE is on a set of images: reconstruction, sparsity, and the cost to the model.

* fraction of variance explained ``FVE = 1 − Σ‖x − x̂‖² / Σ‖x − x̄‖²`` (sums over every chosen token
  of every image; ``x̄`` their mean), computed streaming with ``Σ‖x − x̄‖² = Σ‖x‖² − N‖x̄‖²``;
* ``L0``: the mean number of nonzero features per token;
* dead fraction: the share of features that fire on none of these tokens (``fire_rate = 0`` over
  the whole evaluation set; not training's :attr:`~analysis.sae.TrainingLog.inactive_fraction`,
  silent in the last ``dead_after`` steps); dense fraction: features that fire on more than
  ``dense_threshold`` (10%) of them;
* downstream: the logits with the reconstruction spliced in (:func:`analysis.sae.splice`),
  ``KL(clean ‖ spliced) = Σ_c p_c (log p_c − log q_c)`` of the softmax of the logits, averaged over
  images, and the top-1 agreement of the two (the share of images whose top class is unchanged);
  with ``labels``, the top-1 accuracy of both. (The downstream loss of Gao et al. 2024, Section 4.1.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..base.progress import Progress, tell
from ..engine.activations import run_with_hooks
from .model import SparseAutoencoder
from .reading import check_point, check_width, count_images, pixel_batches, read_tokens
from .splice import splice

__all__ = ["SAEMetrics", "sae_metrics"]


@dataclass(frozen=True)
class SAEMetrics:
    """The numbers of :func:`sae_metrics` (module docstring: the formulas).

    Attributes
    ----------
    fraction_variance_explained : float
        ``FVE = 1 − Σ‖x − x̂‖² / Σ‖x − x̄‖²`` over every chosen token.
    l0 : float
        The mean number of nonzero features per token.
    dead_fraction : float
        Share of features that fire (``f_i ≠ 0``) on none of the measured tokens, i.e. whose
        ``fire_rate`` is 0 over the whole evaluation set.
    dense_fraction : float
        Share of features that fire on more than ``dense_threshold`` of the tokens.
    kl_divergence : float
        ``KL(clean ‖ spliced)`` of the softmax of the logits, averaged over images.
    top1_agreement : float
        Share of images whose top class is unchanged by the splice.
    accuracy_clean : float or None
        Top-1 accuracy of the clean logits; ``None`` without labels.
    accuracy_spliced : float or None
        Top-1 accuracy with the reconstruction spliced in; ``None`` without labels.
    tokens : int
        How many tokens were measured.
    images : int
        How many images were measured.
    fire_rate : torch.Tensor
        ``(d_sae,)`` float32, each feature's share of tokens on which it fires.
    """

    fraction_variance_explained: float
    l0: float
    dead_fraction: float
    dense_fraction: float
    kl_divergence: float
    top1_agreement: float
    accuracy_clean: float | None
    accuracy_spliced: float | None
    tokens: int
    images: int
    fire_rate: torch.Tensor

    @property
    def accuracy_drop(self) -> float | None:
        """``accuracy_clean − accuracy_spliced`` (``None`` without labels)."""
        if self.accuracy_clean is None or self.accuracy_spliced is None:
            return None
        return self.accuracy_clean - self.accuracy_spliced


def sae_metrics(
    vit,
    sae: SparseAutoencoder,
    images,
    *,
    labels=None,
    batch_size: int = 16,
    dense_threshold: float = 0.1,
    progress: Progress | None = None,
) -> SAEMetrics:
    """Measure ``sae`` on ``images``, streamed in batches (module docstring: the metrics).

    Parameters
    ----------
    vit : LoadedViT
        The model the SAE was trained on (:func:`analysis.load_vit`).
    sae : SparseAutoencoder
        The SAE; its ``hook_name`` and ``tokens`` say where it reads (and is spliced in).
    images : sequence of PIL.Image.Image or torch.Tensor
        PIL images (each through ``vit.preprocess``) or an already preprocessed ``(N, 3, H, W)`` tensor.
    labels : sequence of int or None, default None
        The ``N`` true classes; with them the top-1 accuracy, clean and spliced, is measured.
    batch_size : int, default 16
        Images per forward pass.
    dense_threshold : float, default 0.1
        A feature that fires on more than this share of the tokens counts as dense.
    progress : Progress or None, default None
        Called as ``progress(done, total)`` after each batch (images).

    Returns
    -------
    SAEMetrics
        The reconstruction, sparsity and downstream numbers.

    Raises
    ------
    NoImagesError
        No images.
    UnknownPointError
        The SAE's hook point is not a ``(B, T, D)`` point of ``vit``.
    SAEWidthError
        The SAE's ``d_in`` is not the model's width.
    SAEConfigError
        ``batch_size`` below 1; ``tokens="class"`` on a model without a class token.
    """
    point = check_point(vit, sae.config.hook_name)
    check_width(sae, vit.spec.embed_dim, point)
    hooks = splice(vit, sae)
    total = count_images(images)
    d = sae.config.d_in
    error_sq = torch.zeros((), dtype=torch.float64)
    x_sq = torch.zeros((), dtype=torch.float64)
    x_sum = torch.zeros(d, dtype=torch.float64)
    fired = torch.zeros(sae.config.d_sae, dtype=torch.float64)
    nonzero = torch.zeros((), dtype=torch.float64)
    kl_sum = agree = correct_clean = correct_spliced = 0.0
    tokens = done = 0
    for pixels in pixel_batches(vit, images, batch_size):
        chosen, clean = read_tokens(vit, pixels, point, sae.config.tokens)  # (b, T_c, D), (b, C)
        x = chosen.reshape(-1, d).double()  # (n, D)
        with torch.no_grad():
            x_hat, f = sae(x.to(sae.W_enc.dtype))  # (n, D), (n, d_sae)
        error_sq += (x - x_hat.double()).pow(2).sum()
        x_sq += x.pow(2).sum()
        x_sum += x.sum(0)
        active = f != 0  # (n, d_sae)
        fired += active.double().sum(0)
        nonzero += active.double().sum()
        tokens += x.shape[0]
        spliced = run_with_hooks(vit, pixels, hooks)  # (b, C)
        log_p = torch.log_softmax(clean.double(), -1)
        log_q = torch.log_softmax(spliced.double(), -1)
        kl_sum += float((log_p.exp() * (log_p - log_q)).sum(-1).sum())
        top_clean, top_spliced = clean.argmax(-1), spliced.argmax(-1)  # (b,)
        agree += float((top_clean == top_spliced).sum())
        if labels is not None:
            truth = torch.as_tensor(list(labels[done : done + pixels.shape[0]]))
            correct_clean += float((top_clean == truth).sum())
            correct_spliced += float((top_spliced == truth).sum())
        done += pixels.shape[0]
        tell(progress, done, total)
    spread = x_sq - x_sum.pow(2).sum() / tokens  # Σ‖x − x̄‖²
    rate = fired / tokens  # (d_sae,)
    return SAEMetrics(
        fraction_variance_explained=float(1 - error_sq / spread),
        l0=float(nonzero / tokens),
        dead_fraction=float((rate == 0).double().mean()),
        dense_fraction=float((rate > dense_threshold).double().mean()),
        kl_divergence=kl_sum / done,
        top1_agreement=agree / done,
        accuracy_clean=None if labels is None else correct_clean / done,
        accuracy_spliced=None if labels is None else correct_spliced / done,
        tokens=tokens,
        images=done,
        fire_rate=rate.float(),
    )
