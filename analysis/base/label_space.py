"""Which classes a classifier predicts, and whether two classifiers predict the same ones.

Two models' predictions can be set side by side ("the ViT keeps its prediction, the CNN loses
its own") only when both answer the same question: the same classes. A 6-class shapes CNN
calling a photo of a rooster "bar" says nothing about robustness beside an ImageNet ViT.
:func:`shared_label_space` is that rule; :func:`label_space` reads a model's classes from what
its loader found (``class_names``: a folder's ``label_names``, a Hugging Face ``id2label``,
torchvision's categories, or timm's ImageNet class list for a head of an ImageNet size).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .errors import AnalysisError

__all__ = ["LabelSpace", "LabelSpaceMatch", "label_space", "shared_label_space", "IMAGENET_1K"]

#: The name :attr:`LabelSpace.known` gives the 1000 ImageNet-1k classes (ILSVRC-2012, in their usual order).
IMAGENET_1K = "ImageNet-1k"
# timm's ImageNet subsets by head size, and the names we give them.
_IMAGENET_SUBSETS = {
    1000: ("imagenet-1k", IMAGENET_1K),
    11821: ("imagenet-12k", "ImageNet-12k"),
    21841: ("imagenet-22k", "ImageNet-22k"),
    21843: ("imagenet-21k", "ImageNet-21k"),
}
_SHOWN_NAMES = 6


@lru_cache(maxsize=8)
def _known_spellings(size: int) -> tuple[str, tuple[tuple[str, ...], ...]] | None:
    """The standard class list of ``size`` classes (an ImageNet subset), as ``(its name, every
    spelling of it we know)``: timm's WordNet ids and its descriptions, and for ImageNet-1k
    torchvision's short names. ``None`` if there is no standard list of that size."""
    if size not in _IMAGENET_SUBSETS:
        return None
    subset, name = _IMAGENET_SUBSETS[size]
    spellings = []
    try:
        from timm.data import ImageNetInfo

        info = ImageNetInfo(subset)
        spellings += [tuple(info.label_names()), tuple(info.label_descriptions())]
    except Exception:  # noqa: BLE001 - an older timm without the list: other spellings still count
        pass
    if size == 1000:
        try:
            from torchvision.models import ResNet50_Weights

            spellings.append(tuple(ResNet50_Weights.IMAGENET1K_V1.meta["categories"]))
        except Exception:  # noqa: BLE001 - torchvision is optional
            pass
    return name, tuple(s for s in spellings if len(s) == size)


@dataclass(frozen=True)
class LabelSpace:
    """The classes a classifier predicts (:func:`label_space`).

    Attributes
    ----------
    size : int
        The number of classes (the head's outputs).
    names : tuple of str or None
        One name per output, in output order (``size`` of them); ``None`` when the model does not
        name them.
    known : str or None, default None
        The name of the standard list the names spell (``"ImageNet-1k"``: WordNet ids, timm's
        descriptions or torchvision's short names, in the usual order), else ``None``.
    """

    size: int
    names: tuple[str, ...] | None
    known: str | None = None

    def describe(self) -> str:
        """In words: ``"the 1000 ImageNet-1k classes"``, ``"6 classes (circle, ring, …)"``,
        ``"10 unnamed classes"``."""
        if self.known:
            return f"the {self.size} {self.known} classes"
        if self.names is None:
            return f"{self.size} unnamed classes"
        shown = ", ".join(self.names[:_SHOWN_NAMES]) + (", …" if self.size > _SHOWN_NAMES else "")
        return f"{self.size} classes ({shown})"


@dataclass(frozen=True)
class LabelSpaceMatch:
    """The answer of :func:`shared_label_space`; its truth value is ``shared``.

    Attributes
    ----------
    shared : bool
        Whether the two models predict the same classes, so that their predictions may be compared.
    reason : str
        A sentence for people that says why (its first letter is capitalised on construction).
    """

    shared: bool
    reason: str

    def __post_init__(self):
        object.__setattr__(self, "reason", self.reason[:1].upper() + self.reason[1:])  # a sentence

    def __bool__(self) -> bool:
        return self.shared


def label_space(model) -> LabelSpace | None:
    """The classes ``model`` predicts, read from the model: ``spec.num_outputs`` classes named by
    ``class_names``.

    Names that spell a standard list (:data:`IMAGENET_1K` and the other ImageNet subsets) are
    ``known`` as it. Names whose number is not ``spec.num_outputs`` (names for another head) are
    dropped: they do not say which output is which.

    Parameters
    ----------
    model : LoadedViT, LoadedCNN or similar
        A loaded model: a :class:`~analysis.LoadedViT`, a :class:`~analysis.robustness.LoadedCNN`,
        anything with ``spec`` and ``class_names``.

    Returns
    -------
    LabelSpace or None
        Its classes; ``None`` when it has no class head (an embedding tower, a headless backbone:
        ``num_classes`` 0).

    Raises
    ------
    AnalysisError
        If ``model`` has no ``spec`` or no ``class_names`` (not a loaded model).
    """
    spec = getattr(model, "spec", None)
    if spec is None or not hasattr(model, "class_names"):
        raise AnalysisError(f"label_space takes a loaded model (load_vit, load_cnn); got {type(model).__name__}.")
    if not spec.has_classifier:
        return None
    size = int(spec.num_outputs)
    names = tuple(str(n) for n in model.class_names) if model.class_names else None
    if names is not None and len(names) != size:
        names = None  # names for another head: they do not say which output is which
    known = None
    if names is not None:
        standard = _known_spellings(size)
        if standard is not None and names in standard[1]:
            known = standard[0]
    return LabelSpace(size=size, names=names, known=known)


def shared_label_space(
    first, second, labels: tuple[str, str] = ("the first model", "the second model")
) -> LabelSpaceMatch:
    """Whether two models predict the same classes, so that their predictions may be compared.

    Rule (classes read by :func:`label_space`): both have a class head, both name their
    classes, and output ``i`` is the same class in both: the names are equal in order, or both
    spell the same standard list (ImageNet-1k as WordNet ids, timm's descriptions or
    torchvision's short names). Unnamed classes are never shared, even in equal numbers: that
    class 3 of one model is class 3 of the other is unknown.

    Parameters
    ----------
    first : LoadedViT, LoadedCNN or similar
        A loaded model, as :func:`label_space` takes it.
    second : LoadedViT, LoadedCNN or similar
        The other loaded model.
    labels : tuple of (str, str), default ("the first model", "the second model")
        The names of the two models in the reason (``("the ViT", "the CNN")``).

    Returns
    -------
    LabelSpaceMatch
        ``shared`` (also its truth value) and ``reason``, a sentence for people that says why.

    Raises
    ------
    AnalysisError
        If either model is not a loaded model (from :func:`label_space`).
    """
    first_label, second_label = labels
    spaces = label_space(first), label_space(second)
    for label, space in zip(labels, spaces):
        if space is None:
            return LabelSpaceMatch(
                False, f"{label} has no class head (it gives features, not classes): there is no prediction to compare."
            )
    a, b = spaces
    assert a is not None and b is not None, "returned above"
    for label, space in zip(labels, (a, b)):
        if space.names is None:
            return LabelSpaceMatch(
                False,
                f"{label} does not name its {space.size} classes, so whether they are "
                "the other model's classes is unknown.",
            )
    same = (a.known is not None and a.known == b.known) or a.names == b.names
    if same:
        return LabelSpaceMatch(True, f"{first_label} and {second_label} both predict {a.describe()}.")
    return LabelSpaceMatch(
        False,
        f"{first_label} predicts {a.describe()}; {second_label} predicts {b.describe()}: "
        "not the same classes, so their predictions answer different questions.",
    )
