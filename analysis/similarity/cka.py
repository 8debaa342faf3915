"""Centred kernel alignment (CKA) between layers' representations, in two estimators.

Linear CKA (Kornblith et al. 2019, "Similarity of Neural Network Representations Revisited"),
for ``n`` images and two layers whose representations are ``X (n, p)`` and ``Y (n, q)`` (each
image's whole output at that layer, flattened):

    K = X·Xᵀ,  L = Y·Yᵀ                        (linear kernel: n × n Gram matrices)
    CKA(K, L) = HSIC(K, L) / √(HSIC(K, K) · HSIC(L, L))

* ``"full"``: Kornblith et al.'s biased HSIC over the whole set, ``HSIC(K, L) = tr(K·H·L·H) /
  (n − 1)²`` with the centring matrix ``H = I − 11ᵀ/n``; the ``(n − 1)²`` cancels in CKA. It needs
  every image's representation at once (memory ``n × p`` per layer).
* ``"minibatch"``: Nguyen, Raghu and Kornblith 2021 ("Do Wide and Deep Networks Learn the Same
  Things?", used by Raghu et al. 2021 for ViT against ResNet): the unbiased HSIC of Song et al.
  2012 on each minibatch of ``m ≥ 4`` images, averaged over the minibatches, then CKA of the
  averages. With ``K̃``, ``L̃`` the Gram matrices with their diagonals set to 0,

      HSIC₁(K, L) = [tr(K̃·L̃) + (1ᵀK̃1)(1ᵀL̃1) / ((m − 1)(m − 2)) − 2/(m − 2) · 1ᵀK̃L̃1] / (m(m − 3))

  Memory is one minibatch; the result does not depend on the batch order, and it approaches the
  full estimator as the set grows.

All sums are in float64. :class:`CKAAccumulator` takes the layers' representations batch by batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..base.errors import AnalysisError

__all__ = ["ESTIMATORS", "CKAAccumulator", "gram", "hsic_biased", "hsic_unbiased", "cka_from_hsic"]

#: ``"minibatch"`` (the default: one minibatch in memory) and ``"full"`` (the whole set at once).
ESTIMATORS = ("minibatch", "full")


def gram(features: torch.Tensor) -> torch.Tensor:
    """The linear-kernel Gram matrices ``K = X·Xᵀ`` of representations, in float64.

    Parameters
    ----------
    features : torch.Tensor
        ``(n, p)`` one layer's representations of ``n`` images, or ``(L, n, p)`` for ``L`` layers;
        any float dtype (cast to float64 first).

    Returns
    -------
    torch.Tensor
        ``(n, n)`` or ``(L, n, n)`` float64.
    """
    x = features.double()
    return x @ x.transpose(-1, -2)


def hsic_biased(grams_a: torch.Tensor, grams_b: torch.Tensor) -> torch.Tensor:
    """Kornblith et al.'s biased HSIC of every pair of layers:

        HSIC[i, j] = tr(K_i·H·L_j·H) / (n − 1)²

    with ``H = I − 11ᵀ/n`` the centring matrix, computed as the Frobenius product of the centred
    Gram matrices ``H·K·H``.

    Parameters
    ----------
    grams_a : torch.Tensor
        ``(La, n, n)`` Gram matrices (:func:`gram`) of the first model's layers.
    grams_b : torch.Tensor
        ``(Lb, n, n)`` Gram matrices of the second model's layers, over the same ``n`` images.

    Returns
    -------
    torch.Tensor
        ``(La, Lb)``, in the Gram matrices' dtype (float64 from :func:`gram`).

    Raises
    ------
    AnalysisError
        Fewer than 2 images (``n < 2``).
    """
    n = grams_a.shape[-1]
    if n < 2:
        raise AnalysisError(f"CKA needs at least 2 images, got {n}.")

    def centred(k: torch.Tensor) -> torch.Tensor:  # H·K·H
        return k - k.mean(-1, keepdim=True) - k.mean(-2, keepdim=True) + k.mean((-1, -2), keepdim=True)

    a, b = centred(grams_a).reshape(grams_a.shape[0], -1), centred(grams_b).reshape(grams_b.shape[0], -1)
    return (a @ b.T) / (n - 1) ** 2


def hsic_unbiased(grams_a: torch.Tensor, grams_b: torch.Tensor) -> torch.Tensor:
    """The unbiased HSIC of Song et al. 2012 of every pair of layers on one minibatch (the formula
    ``HSIC₁`` in the module docstring: the Gram matrices with their diagonals set to 0).

    Parameters
    ----------
    grams_a : torch.Tensor
        ``(La, m, m)`` Gram matrices (:func:`gram`) of the first model's layers, ``m ≥ 4`` images.
    grams_b : torch.Tensor
        ``(Lb, m, m)`` Gram matrices of the second model's layers, over the same ``m`` images.

    Returns
    -------
    torch.Tensor
        ``(La, Lb)``, in the Gram matrices' dtype (float64 from :func:`gram`).

    Raises
    ------
    AnalysisError
        Fewer than 4 images (``m < 4``).
    """
    m = grams_a.shape[-1]
    if m < 4:
        raise AnalysisError(f"The unbiased HSIC needs minibatches of at least 4 images, got {m}.")
    eye = torch.eye(m, dtype=torch.bool, device=grams_a.device)
    ka, kb = grams_a.masked_fill(eye, 0.0), grams_b.masked_fill(eye, 0.0)  # K̃, L̃
    trace = ka.reshape(ka.shape[0], -1) @ kb.reshape(kb.shape[0], -1).T  # tr(K̃·L̃) (symmetric)
    rows_a, rows_b = ka.sum(-1), kb.sum(-1)  # K̃·1, L̃·1: (L, m)
    sums = rows_a.sum(-1)[:, None] * rows_b.sum(-1)[None, :] / ((m - 1) * (m - 2))
    cross = rows_a @ rows_b.T  # 1ᵀ·K̃·L̃·1
    return (trace + sums - 2.0 / (m - 2) * cross) / (m * (m - 3))


def cka_from_hsic(cross: torch.Tensor, self_a: torch.Tensor, self_b: torch.Tensor) -> torch.Tensor:
    """CKA from the HSIC of every pair and of each layer with itself:

        CKA[i, j] = cross[i, j] / √(self_a[i] · self_b[j])

    A layer whose representation does not vary over the images (``HSIC(K, K) = 0``, or within
    ``1e-12`` of the largest self-HSIC: rounding) gives NaN, not a number it does not have.

    Parameters
    ----------
    cross : torch.Tensor
        ``(La, Lb)`` float64, ``HSIC(K_i, L_j)``.
    self_a : torch.Tensor
        ``(La,)`` float64, ``HSIC(K_i, K_i)`` of the first model's layers.
    self_b : torch.Tensor
        ``(Lb,)`` float64, ``HSIC(L_j, L_j)`` of the second model's layers.

    Returns
    -------
    torch.Tensor
        ``(La, Lb)`` float64, NaN in the rows and columns of constant layers.
    """
    scale = max(float(self_a.abs().max()), float(self_b.abs().max()), torch.finfo(torch.float64).tiny)
    # a self-HSIC within rounding of 0 (centring a constant representation leaves ~1e-16 of the largest) is 0
    self_a = torch.where(self_a > 1e-12 * scale, self_a, torch.zeros_like(self_a))
    self_b = torch.where(self_b > 1e-12 * scale, self_b, torch.zeros_like(self_b))
    denominator = torch.sqrt(self_a[:, None] * self_b[None, :])
    return torch.where(denominator > 0, cross / denominator.clamp(min=torch.finfo(torch.float64).tiny), torch.nan)


class CKAAccumulator:
    """Linear CKA between the layers of two models, fed one batch of images at a time.

    ``add(features_a, features_b)``: each a list with one ``(b, p_layer)`` tensor per layer, the
    same ``b`` images in the same order. ``matrix()``: ``(La, Lb)`` float64. With
    ``features_b=None`` a model is compared with itself (the matrix is then symmetric, its
    diagonal 1). :meth:`reduce` adds up the minibatch sums of several processes; :meth:`merged`
    those of several accumulators.

    Parameters
    ----------
    estimator : str, default "minibatch"
        ``"minibatch"``: each ``add`` is one minibatch (``b ≥ 4``; a smaller one is not counted in
        ``images_used``), its unbiased HSIC summed; ``"full"``: the representations are kept (in
        their dtype, on the CPU) until :meth:`matrix` (:data:`ESTIMATORS`).

    Attributes
    ----------
    estimator : str
        The estimator.
    images_seen : int
        Images added.
    images_used : int
        Images the matrix counts (``"minibatch"`` leaves out minibatches of fewer than 4).

    Raises
    ------
    AnalysisError
        ``estimator`` is not one of :data:`ESTIMATORS`.
    """

    def __init__(self, estimator: str = "minibatch") -> None:
        if estimator not in ESTIMATORS:
            raise AnalysisError(f"estimator must be one of {ESTIMATORS}, not {estimator!r}.")
        self.estimator = estimator
        self.images_seen = 0
        self.images_used = 0
        self._same = False
        self._sums: list[torch.Tensor] | None = None  # minibatch: cross, self_a, self_b
        self._kept: tuple[list[list[torch.Tensor]], list[list[torch.Tensor]]] = ([], [])
        self._batches = 0

    def add(self, features_a: Sequence[torch.Tensor], features_b: Sequence[torch.Tensor] | None = None) -> None:
        """One batch: ``features_a[i]`` ``(b, ...)`` of layer ``i`` of the first model (flattened
        per image), ``features_b`` the second's (``None``: the first model again)."""
        self._same = features_b is None
        a = [f.reshape(f.shape[0], -1) for f in features_a]
        b = a if features_b is None else [f.reshape(f.shape[0], -1) for f in features_b]
        count = a[0].shape[0]
        if any(f.shape[0] != count for f in (*a, *b)):
            raise AnalysisError("Every layer of both models must hold the same images in the same order.")
        self.images_seen += count
        if self.estimator == "full":
            for kept, layers in zip(self._kept, (a, b)):
                if not kept:
                    kept.extend([] for _ in layers)
                for store, layer in zip(kept, layers):
                    store.append(layer.detach().cpu())  # in its own dtype (a model's: float32)
            self.images_used += count
            return
        if count < 4:  # the unbiased HSIC is not defined on fewer than 4 images
            return
        grams_a = torch.stack([gram(f) for f in a])
        grams_b = grams_a if features_b is None else torch.stack([gram(f) for f in b])
        cross = hsic_unbiased(grams_a, grams_b)
        self_a = torch.diagonal(hsic_unbiased(grams_a, grams_a)) if features_b is not None else torch.diagonal(cross)
        self_b = torch.diagonal(hsic_unbiased(grams_b, grams_b)) if features_b is not None else self_a
        parts = [cross.cpu(), self_a.cpu(), self_b.cpu()]
        self._sums = parts if self._sums is None else [s + p for s, p in zip(self._sums, parts)]
        self._batches += 1
        self.images_used += count

    @classmethod
    def merged(cls, parts: Sequence[CKAAccumulator]) -> CKAAccumulator:
        """One minibatch accumulator holding every part's minibatches (e.g. the cached pieces of an
        image set): their sums and counts added. The parts compare the same layers."""
        if not parts or any(part.estimator != "minibatch" for part in parts):
            raise AnalysisError("merged takes one or more minibatch accumulators.")
        whole = cls("minibatch")
        for part in parts:
            whole.images_seen += part.images_seen
            whole.images_used += part.images_used
            whole._batches += part._batches
            whole._same = part._same
            if part._sums is not None:
                whole._sums = (
                    list(part._sums) if whole._sums is None else [a + b for a, b in zip(whole._sums, part._sums)]
                )
        return whole

    def reduce(self, total: Callable[[torch.Tensor], torch.Tensor], shape: tuple[int, int]) -> None:
        """For a run over several processes (each fed its own minibatches): replace this
        accumulator's minibatch sums and counts by ``total`` of them over every process (an
        all-reduce sum, e.g. ``torch.distributed``'s). ``shape``: ``(La, Lb)``, for a process
        that had no minibatch. The matrix is then the one a single process fed every minibatch
        gives (to float rounding): the estimator averages the minibatches' HSIC."""
        if self.estimator != "minibatch":
            raise AnalysisError(
                "Only the minibatch estimator's sums add up across processes: use estimator='minibatch'."
            )
        rows, cols = shape
        cross, self_a, self_b = self._sums or [
            torch.zeros(rows, cols, dtype=torch.float64),
            torch.zeros(rows, dtype=torch.float64),
            torch.zeros(cols, dtype=torch.float64),
        ]
        counts = torch.tensor([self._batches, self.images_used, self.images_seen], dtype=torch.float64)
        packed = total(torch.cat([cross.reshape(-1), self_a, self_b, counts]))
        cross, self_a, self_b, counts = packed.split([rows * cols, rows, cols, 3])
        self._batches, self.images_used, self.images_seen = (int(round(float(c))) for c in counts)
        self._sums = [cross.reshape(rows, cols), self_a, self_b] if self._batches else None

    def matrix(self) -> torch.Tensor:
        """``(La, Lb)`` float64 CKA (see the module docstring)."""
        if self.estimator == "full":
            if not self._kept[0]:
                raise AnalysisError("No images were added.")
            grams_a = torch.stack([gram(torch.cat(layer)) for layer in self._kept[0]])
            grams_b = grams_a if self._same else torch.stack([gram(torch.cat(layer)) for layer in self._kept[1]])
            cross = hsic_biased(grams_a, grams_b)
            self_a = torch.diagonal(hsic_biased(grams_a, grams_a)) if not self._same else torch.diagonal(cross)
            self_b = self_a if self._same else torch.diagonal(hsic_biased(grams_b, grams_b))
            return cka_from_hsic(cross, self_a, self_b)
        if self._sums is None:
            raise AnalysisError(
                f"No minibatch of at least 4 images was added ({self.images_seen} images in all): the minibatch "
                "estimator needs batch_size >= 4."
            )
        cross, self_a, self_b = (s / self._batches for s in self._sums)
        return cka_from_hsic(cross, self_a, self_b)
