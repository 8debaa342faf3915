"""shared_label_space: two models' predictions are compared only when they predict the same classes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from timm.data import ImageNetInfo

import analysis
from analysis import IMAGENET_1K, LabelSpace, label_space, shared_label_space
from analysis.robustness import load_cnn

SHAPES = ("circle", "ring", "bar", "triangle", "cross", "star")
WORDNET_IDS = tuple(ImageNetInfo("imagenet-1k").label_names())
DESCRIPTIONS = tuple(ImageNetInfo("imagenet-1k").label_descriptions())


def fake(names, size=None, classifier=True):
    """Anything with ``spec`` and ``class_names`` is a model to label_space."""
    size = len(names) if size is None else size
    return SimpleNamespace(
        spec=SimpleNamespace(has_classifier=classifier and size > 1, num_outputs=size),
        class_names=None if names is None else list(names),
    )


def torchvision_names():
    models = pytest.importorskip("torchvision.models")
    return tuple(models.ResNet50_Weights.IMAGENET1K_V1.meta["categories"])


def reference_shared(first, second) -> bool:
    """Slow and obvious: every output i names the same class in both, a class being known by its
    WordNet id when a name is one of the ImageNet-1k spellings at position i."""

    def classes(model):
        if not model.spec.has_classifier or not model.class_names or len(model.class_names) != model.spec.num_outputs:
            return None
        spellings = [WORDNET_IDS, DESCRIPTIONS] + ([torchvision_names()] if len(model.class_names) == 1000 else [])
        for spelling in spellings:
            if list(spelling) == list(model.class_names):
                return [("wordnet", WORDNET_IDS[i]) for i in range(len(spelling))]
        return [("name", n) for n in model.class_names]

    a, b = classes(first), classes(second)
    return a is not None and b is not None and len(a) == len(b) and all(x == y for x, y in zip(a, b))


@pytest.fixture(scope="module")
def demo_models():
    return {"vit": analysis.load_vit("demo"), "swin": analysis.load_vit("demo_swin"), "cnn": load_cnn("demo")}


@pytest.fixture(scope="module")
def imagenet_models():
    return {
        "vit": analysis.load_vit("vit_tiny_patch16_224", pretrained=False),
        "cnn": load_cnn("resnet18", pretrained=False),
    }


def test_the_bundled_models_share_the_six_shapes(demo_models):
    for name, model in demo_models.items():
        assert label_space(model) == LabelSpace(6, SHAPES, None), name
    match = shared_label_space(demo_models["vit"], demo_models["cnn"], ("the ViT", "the CNN"))
    assert match and match.shared
    assert match.reason == "The ViT and the CNN both predict 6 classes (circle, ring, bar, triangle, cross, star)."
    assert shared_label_space(demo_models["swin"], demo_models["cnn"])


def test_an_imagenet_vit_and_the_shapes_cnn_do_not(demo_models, imagenet_models):
    vit = imagenet_models["vit"]
    assert label_space(vit) == LabelSpace(1000, DESCRIPTIONS, IMAGENET_1K)
    match = shared_label_space(vit, demo_models["cnn"], ("the ViT", "the CNN"))
    assert not match and not match.shared
    assert match.reason == (
        "The ViT predicts the 1000 ImageNet-1k classes; the CNN predicts 6 classes (circle, ring, "
        "bar, triangle, cross, star): not the same classes, so their predictions answer different "
        "questions."
    )
    assert not shared_label_space(demo_models["cnn"], vit)  # symmetric


def test_an_imagenet_vit_and_an_imagenet_cnn_do(imagenet_models):
    cnn = imagenet_models["cnn"]
    assert cnn.class_names == list(DESCRIPTIONS)  # the CNN loader names ImageNet classes as load_vit does
    match = shared_label_space(imagenet_models["vit"], cnn, ("the ViT", "the CNN"))
    assert match and match.reason == "The ViT and the CNN both predict the 1000 ImageNet-1k classes."


def test_a_headless_backbone_has_no_label_space(demo_models):
    backbone = analysis.load_vit("vit_small_patch14_reg4_dinov2", pretrained=False, img_size=56)  # num_classes 0
    assert backbone.spec.num_outputs == 0 and label_space(backbone) is None
    for pair in ((backbone, demo_models["cnn"]), (demo_models["cnn"], backbone)):
        match = shared_label_space(*pair, ("the ViT", "the CNN") if pair[0] is backbone else ("the CNN", "the ViT"))
        assert not match
        assert match.reason == (
            "The ViT has no class head (it gives features, not classes): there is no prediction to compare."
        )


def test_spellings_of_imagenet_are_one_label_space():
    spellings = [WORDNET_IDS, DESCRIPTIONS, torchvision_names()]
    for first in spellings:
        for second in spellings:
            assert shared_label_space(fake(first), fake(second)), (first[0], second[0])
            assert label_space(fake(first)).known == IMAGENET_1K


@pytest.mark.parametrize(
    "first, second",
    [
        (fake(SHAPES), fake(SHAPES)),
        (fake(SHAPES), fake(SHAPES[::-1])),  # the same classes in another order: output i differs
        (fake(SHAPES), fake(SHAPES[:5])),
        (fake(SHAPES), fake(None, size=6)),  # unnamed: unknown, even with as many classes
        (fake(None, size=6), fake(None, size=6)),
        (fake(SHAPES), fake(SHAPES, size=7)),  # names for another head size: unnamed
        (fake(DESCRIPTIONS), fake(DESCRIPTIONS[:999] + ("my class",))),  # one class replaced
        (fake(WORDNET_IDS), fake(DESCRIPTIONS[::-1])),
        (fake(SHAPES), fake(SHAPES, classifier=False)),
        (fake(("a", "b")), fake(("a", "b"))),
    ],
)
def test_the_rule_equals_an_elementwise_reference(first, second):
    assert shared_label_space(first, second).shared is reference_shared(first, second)
    assert shared_label_space(second, first).shared is reference_shared(first, second)


def test_unnamed_classes_are_never_shared_and_the_reason_says_so():
    match = shared_label_space(fake(SHAPES), fake(None, size=6), ("the ViT", "the CNN"))
    assert not match
    assert (
        match.reason == "The CNN does not name its 6 classes, so whether they are the other model's classes is unknown."
    )


def test_describe():
    assert LabelSpace(1000, DESCRIPTIONS, IMAGENET_1K).describe() == "the 1000 ImageNet-1k classes"
    assert LabelSpace(10, None).describe() == "10 unnamed classes"
    assert LabelSpace(7, tuple("abcdefg")).describe() == "7 classes (a, b, c, d, e, f, …)"
